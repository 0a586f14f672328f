"""Runs on the dense frame axis (`vce.post.timeline.Timeline`), the idioms every decoder shares.

A run is a maximal stretch of positions where a (P,) bool mask holds, given as inclusive
(start, end) positions. Videos lie end to end on the axis, each starting at
`timeline.video_first[v]`, so "which video is a position in" is one binary search, and a run's
mean probability is two lookups in a prefix sum over the observed frames.
"""

from __future__ import annotations

import numpy as np


def runs_of(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) inclusive positions of the runs of a (P,) bool `mask`, in order."""
    edges = np.diff(np.asarray(mask, bool).view(np.int8), prepend=np.int8(0), append=np.int8(0))
    return np.flatnonzero(edges == 1), np.flatnonzero(edges == -1) - 1


def group_firsts(codes: np.ndarray) -> np.ndarray:
    """Indices where a sorted (N,) array of non-negative group codes starts a new group (0 first when N > 0)."""
    return np.flatnonzero(np.diff(codes, prepend=-1) != 0)


def video_of(timeline, positions: np.ndarray) -> np.ndarray:
    """(N,) the index of the video each timeline position lies in."""
    return np.searchsorted(timeline.video_first, positions, side="right") - 1


def video_time_bounds(timeline) -> tuple[np.ndarray, np.ndarray]:
    """(V,), (V,): the event time of each video's first and last row. The separator after a video
    carries times past its last frame (a window or a run may reach into it)."""
    if not len(timeline.video_first):
        return np.empty(0, np.int64), np.empty(0, np.int64)
    cap = int(timeline.video_first[0])  # every video is preceded by a separator of this length
    last = np.append(timeline.video_first[1:], len(timeline.time)) - cap - 1
    return timeline.time[timeline.video_first], timeline.time[last]


def clip_to_videos(timeline, submission: dict) -> dict:
    """`submission` with every event cut to its video's frames (an event wholly outside is
    dropped): no event ends past a video's last frame, whatever a run or a candidate's widening
    reached into the separator after it."""
    first, last = video_time_bounds(timeline)
    bounds = {video_id: (int(first[v]), int(last[v])) for v, video_id in enumerate(timeline.video_ids)}
    videos = []
    for video in submission["videos"]:
        lo, hi = bounds[video["video_id"]]
        events = [{**event, "start": max(event["start"], lo), "end": min(event["end"], hi)}
                  for event in video["events"] if event["start"] <= hi and event["end"] >= lo]
        videos.append({**video, "events": events})
    return {**submission, "videos": videos}


def prob_cum(timeline, k: int) -> np.ndarray:
    """(P+1,) float64 prefix sum of label k's probabilities (0 where unobserved), cached on the timeline."""
    if k not in timeline.prob_cums:
        probs = np.nan_to_num(timeline.probs[k], nan=0.0)
        timeline.prob_cums[k] = np.concatenate([[0.0], np.cumsum(probs, dtype=np.float64)])
    return timeline.prob_cums[k]


def mean_probs(timeline, k: int, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """(R,) label k's mean probability over the observed frames of each run [start, end]
    (missing and invalid frames inside a run neither add nor count; 1 frame at least)."""
    cum = prob_cum(timeline, k)
    frames = timeline.observed_cum[ends + 1] - timeline.observed_cum[starts]
    return (cum[ends + 1] - cum[starts]) / np.maximum(frames, 1)


def last_axis_max(m: np.ndarray) -> np.ndarray:
    """`m.max(axis=-1)` for a short last axis (phases, regions), one `np.maximum` per entry:
    numpy's reduction over an axis of 5 costs several times the array's own passes (the same
    values: max is exact)."""
    out = m[..., 0].copy()
    for j in range(1, m.shape[-1]):
        np.maximum(out, m[..., j], out=out)
    return out
