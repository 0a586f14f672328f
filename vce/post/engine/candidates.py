"""Candidates: each label's ranked events per video, and the video-level evidence its gate reads.

The metric ranks a label's events by file order, and events appended after a present label's
first ones can only add to its AP (a later false positive adds a zero term; a later match
adds a precision x recall step), so every decoder emits its best guess first and alternatives
after it: findings and landmarks their runs, strongest first (`run_candidates`); regions their
decoded run, then its learned variants, then its pieces cut at other labels' events, as the
official ground truth is cut (`region_candidates`); landmarks events anchored at a decoded
boundary (`anchored_candidates`); the mouth and the esophagus the head posterior's spans
(`head_candidates`).
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from vce.core.labels import LANDMARKS, REGIONS
from vce.post.anatomy import boundaries
from vce.post.engine.variants import RUN, place_variant
from vce.post.events import smooth_runs
from vce.post.head import head_spans
from vce.post.runs import mean_probs, runs_of, video_of
from vce.post.timeline import Timeline


def gc_paused(func):
    """`func` with Python's cyclic garbage collector paused (its previous state restored after).

    The engine builds millions of small tuples, lists and dicts (every ranked event of every
    candidate list tried, and of the submission) that hold no reference cycle; the collector
    would otherwise traverse every live one again each few hundred allocations: 80% of the
    time of building a submission's 0.8 M events at Galar size. Nothing is leaked: cycles made
    meanwhile are collected once it runs again."""
    @functools.wraps(func)
    def paused(*args, **kwargs):
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return func(*args, **kwargs)
        finally:
            if was_enabled:
                gc.enable()
    return paused


@dataclass
class Candidates:
    """One label's ranked events per video (time units), and the video's evidence for the gate."""

    events: list  # per video: list of (start, end) in rank order (the submission)
    clinical: list  # per video: the clean list, one event per run (for people and the report)
    evidence: np.ndarray  # (V,) the gate feature; -inf where the label has no event
    features: dict = field(default_factory=dict)  # run labels: every video-level feature (`PRESENCE_FEATURES`)
    spans: tuple | None = None  # `events` as arrays, when made from them: (V,) counts, (N,) starts, (N,) ends (int64)


class SpanLists(Sequence):
    """Per video, its list of (start, end) spans, built from (V + 1,) `bounds` into the (N,)
    `starts` and `ends` the first time it is read. Fitting scores each of the threshold grid's
    candidate lists from the arrays (`Candidates.spans`) and never reads most of them as lists:
    building their tuples took most of `run_candidates`' time."""

    def __init__(self, bounds: np.ndarray, starts: np.ndarray, ends: np.ndarray):
        self._bounds, self._starts, self._ends = bounds, starts, ends
        self._lists: list = [None] * (len(bounds) - 1)

    def __len__(self) -> int:
        return len(self._lists)

    def __getitem__(self, v):
        if isinstance(v, slice):
            return [self[i] for i in range(*v.indices(len(self)))]
        v = range(len(self))[v]
        if self._lists[v] is None:
            a, b = self._bounds[v], self._bounds[v + 1]
            self._lists[v] = list(zip(self._starts[a:b].tolist(), self._ends[a:b].tolist()))
        return self._lists[v]

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(N,) video, start and end of every span, in order."""
        return np.repeat(np.arange(len(self)), np.diff(self._bounds)), self._starts, self._ends

    def only(self, keep: np.ndarray) -> SpanLists:
        """The spans of the videos where (V,) bool `keep` holds; none elsewhere (lists not built)."""
        counts = np.diff(self._bounds) * keep
        inside = np.repeat(keep, np.diff(self._bounds))
        return SpanLists(np.concatenate([[0], np.cumsum(counts)]), self._starts[inside], self._ends[inside])


def hysteresis_runs(timeline: Timeline, k: int, threshold: float, ratio: float, median_window: int) -> tuple:
    """Median-filtered runs of label k at the low threshold `ratio` x `threshold` that hold at
    least one frame at or above `threshold` (hysteresis: a run starts high and lasts while it
    stays above low; ratio 1: plain thresholded runs)."""
    probs = timeline.probs[k]
    with np.errstate(invalid="ignore"):
        starts, ends = smooth_runs(timeline, probs >= threshold * ratio, median_window, median_window // 2, 1)
        if ratio >= 1 or len(starts) == 0:
            return starts, ends
        high = np.concatenate([[0], np.cumsum(probs >= threshold, dtype=np.int64)])
    seeded = high[ends + 1] - high[starts] > 0
    return starts[seeded], ends[seeded]


def compatible(starts: np.ndarray, ends: np.ndarray, path: np.ndarray | None, regions: list | None) -> np.ndarray:
    """(R,) bool: the run's middle frame lies in one of `regions` on the decoded `path` (None: every run)."""
    if regions is None or path is None:
        return np.ones(len(starts), bool)
    return np.isin(path[(starts + ends) // 2], regions)


def region_shares(gt: dict, label: str) -> list | None:
    """(5,) the share of `label`'s ground-truth frames (events carrying both labels) in each
    region over the tuning videos; None when it has no region-labelled frame."""
    frames = np.zeros(len(REGIONS))
    for video in gt["videos"]:
        for event in video["events"]:
            if label in event["label"]:
                for state, region in enumerate(REGIONS):
                    if region in event["label"]:
                        frames[state] += event["end"] - event["start"] + 1
    return (frames / frames.sum()).tolist() if frames.sum() > 0 else None


def learn_compatibility(gt: dict, label: str, min_share: float) -> list | None:
    """Region indices holding more than `min_share` of `label`'s ground-truth frames in the
    tuning videos (`region_shares`); None (no gate) when it has no region-labelled frame."""
    shares = region_shares(gt, label)
    return None if shares is None else [state for state, share in enumerate(shares) if share > min_share]


def run_candidates(timeline: Timeline, k: int, threshold: float, median_window: int, min_length: int, top_k: int,
                   runs: tuple | None = None, ratio: float = 1.0, path: np.ndarray | None = None,
                   regions: list | None = None, shares: list | None = None,
                   strength: np.ndarray | None = None, alternatives: tuple | None = None) -> Candidates:
    """Thresholded (hysteresis `ratio`), median-filtered runs of label k, most confident first,
    at most `top_k` per video, only those whose middle lies in `regions` of `path` (`compatible`).

    `runs`: the (starts, ends) of that threshold, ratio and window when already computed (any length).
    `shares`: the label's `region_shares`, for the `region` feature (None, or no `path`: 1 for every run).
    `strength`: (R,) per run of `runs`, what ranks them instead of the mean probability (the
    autoregressive decoder's `ar_run_strength`; the gate features still read the probabilities).
    `alternatives`: (starts, ends, strength) of other runs (`ar_posterior_runs`), appended in a
    video that has runs, strongest first, after them, up to `top_k` events in all; the clinical
    list, the region cuts and the gate features are the runs' alone.
    """
    if runs is None:
        runs = hysteresis_runs(timeline, k, threshold, ratio, median_window)
    starts, ends = runs
    keep = (ends - starts + 1 >= min_length) & compatible(starts, ends, path, regions)
    starts, ends = starts[keep], ends[keep]
    confidence = mean_probs(timeline, k, starts, ends)
    rank_by = confidence if strength is None else strength[keep]
    video = video_of(timeline, starts)
    n_videos = len(timeline.video_ids)
    evidence = np.full(n_videos, -np.inf)
    np.maximum.at(evidence, video, confidence)
    order = np.lexsort((starts, -rank_by, video))
    video = video[order]
    first = np.searchsorted(video, np.arange(n_videos))
    rank = np.arange(len(video)) - first[video]  # rank inside its video
    keep = rank < top_k
    kept_video, kept = video[keep], order[keep]
    bounds = np.searchsorted(kept_video, np.arange(n_videos + 1))
    span_starts, span_ends = timeline.time[starts[kept]], timeline.time[ends[kept]]
    events = clinical = SpanLists(bounds, span_starts, span_ends)
    arrays = np.diff(bounds), span_starts, span_ends  # the scorer reads these, not the lists (`LabelObjective`)
    if alternatives is not None:
        events, arrays = _appended(timeline, clinical, alternatives, min_length, top_k, path, regions), None
    features = _run_features(timeline, k, starts[order], ends[order], video, rank, confidence[order], evidence, path,
                             shares)
    return Candidates(events, clinical, evidence, features, arrays)


def _run_features(timeline: Timeline, k: int, starts: np.ndarray, ends: np.ndarray, video: np.ndarray,
                  rank: np.ndarray, confidence: np.ndarray, evidence: np.ndarray, path: np.ndarray | None,
                  shares: list | None) -> dict:
    """The video-level features (`PRESENCE_FEATURES`) of label k's runs, given in rank order with
    their video, rank inside it and mean probability; `evidence` is the strongest run's ("max")."""
    n_videos = len(evidence)
    has = np.isfinite(evidence)
    count = np.bincount(video, minlength=n_videos).astype(float)
    top = rank < 3
    top3 = np.bincount(video[top], confidence[top], minlength=n_videos) / np.maximum(np.minimum(count, 3), 1)
    lengths = (ends - starts + 1).astype(float)
    frames = np.bincount(video, lengths, minlength=n_videos)
    # The region a run sits in: its middle frame's state on the path (-1, no region: share 0).
    share = np.ones(len(starts))
    if shares is not None and path is not None:
        state = path[(starts + ends) // 2]
        share = np.where(state >= 0, np.asarray(shares)[np.maximum(state, 0)], 0.0)
    region = np.bincount(video, lengths * share, minlength=n_videos) / np.maximum(frames, 1)
    return {"max": evidence, "top3": np.where(has, top3, -np.inf), "frames": np.where(has, frames, -np.inf),
            "count": np.where(has, count, -np.inf), "peak": np.where(has, _video_peaks(timeline, k), -np.inf),
            "region": np.where(has, region, -np.inf)}


def _appended(timeline: Timeline, events: list, alternatives: tuple, min_length: int, top_k: int,
              path: np.ndarray | None, regions: list | None) -> list:
    """Per video, `events` then the `alternatives` (starts, ends, strength) runs there (at least
    `min_length` frames, `compatible`), strongest first, while the video holds under `top_k`."""
    starts, ends, strength = alternatives
    keep = (ends - starts + 1 >= min_length) & compatible(starts, ends, path, regions)
    starts, ends, strength = starts[keep], ends[keep], strength[keep]
    video = video_of(timeline, starts)
    order = np.lexsort((starts, -strength, video))
    bounds = np.searchsorted(video[order], np.arange(len(events) + 1))
    spans = list(zip(timeline.time[starts[order]].tolist(), timeline.time[ends[order]].tolist()))
    return [own + spans[bounds[v]:bounds[v + 1]][:max(top_k - len(own), 0)] if own else own
            for v, own in enumerate(events)]


def _video_peaks(timeline: Timeline, k: int) -> np.ndarray:
    """(V,) each video's highest frame probability of label k."""
    key = ("peak", k)
    if key not in timeline.prob_cums:
        probs = np.nan_to_num(timeline.probs[k], nan=-np.inf)
        timeline.prob_cums[key] = np.maximum.reduceat(probs, timeline.video_first) if len(probs) else np.zeros(0)
    return timeline.prob_cums[key]


def _inside(times, start: int, end: int) -> np.ndarray:
    """The sorted `times` (a list or an array) in (start, end], as int64."""
    times = np.asarray(times, np.int64)
    return times[np.searchsorted(times, start, side="right"):np.searchsorted(times, end, side="right")]


def _pieces(start: int, end: int, times, order: str = "longest") -> list:
    """[start, end] cut at the sorted, distinct `times` (a list or an array) inside it, longest
    (`order`: or shortest) first, equal lengths in time order; [] when nothing cuts it."""
    inner = _inside(times, start, end)
    if len(inner) == 0:
        return []
    edges = np.concatenate([[start], inner, [end + 1]])
    firsts, lasts = edges[:-1], edges[1:] - 1
    sign = 1 if order == "shortest" else -1
    ranked = np.argsort(sign * (lasts - firsts), kind="stable")  # stable: equal lengths stay in time order
    return list(zip(firsts[ranked].tolist(), lasts[ranked].tolist()))


def region_candidates(timeline: Timeline, path: np.ndarray, state: int, variants: list, cuts: dict | None,
                      shadow: dict | None = None, order: str = "longest") -> Candidates:
    """Region `state`'s decoded run per video, then the spans each of `variants` places on it
    ((mode, a, b) in rank order, `learn_variants`), then its cut pieces, then (`shadow`) its
    pieces cut at those and at the shadow times too. The clinical event is the run itself.

    `cuts`: per video, the sorted distinct event times where another label's event starts or ends + 1;
    `shadow`: the same for runs of labels that are not emitted (`shadow_cuts`);
    `order`: the pieces of each, longest or shortest first (`cut_order`).
    """
    starts, ends = runs_of(path == state)
    n_videos = len(timeline.video_ids)
    events: list = [[] for _ in range(n_videos)]
    clinical: list = [[] for _ in range(n_videos)]
    evidence = np.full(n_videos, -np.inf)
    for v, s, e in zip(video_of(timeline, starts).tolist(), starts.tolist(), ends.tolist()):
        frames = int(timeline.observed_cum[e + 1] - timeline.observed_cum[s])
        start, end = int(timeline.time[s]), int(timeline.time[e])
        ranked = []
        for variant in [(RUN, 0, 0), *variants]:
            a, b = place_variant(*variant, start, end)
            if a <= b and (a, b) not in ranked:
                ranked.append((a, b))
        if cuts is not None and v in cuts:
            seen = set(ranked)
            ranked += [p for p in _pieces(start, end, cuts[v], order) if p not in seen]
        if shadow is not None and v in shadow:
            seen = set(ranked)
            times = np.union1d(_inside(shadow[v], start, end), _inside((cuts or {}).get(v, []), start, end))
            ranked += [p for p in _pieces(start, end, times, order) if p not in seen]
        events[v] = ranked
        clinical[v] = [(start, end)]
        evidence[v] = frames
    return Candidates(events, clinical, evidence)


def anchored_candidates(timeline: Timeline, path: np.ndarray, landmark: str, anchors: list) -> Candidates:
    """Landmark events at (offset, length) from the decoded boundary it marks, in `anchors` order."""
    region_after = REGIONS.index(LANDMARKS[landmark][1])
    crossings = boundaries(path, region_after)
    n_videos = len(timeline.video_ids)
    events: list = [[] for _ in range(n_videos)]
    clinical: list = [[] for _ in range(n_videos)]
    evidence = np.full(n_videos, -np.inf)
    for v, c in zip(video_of(timeline, crossings).tolist(), crossings.tolist()):
        if events[v]:
            continue  # one boundary per video (a monotone path crosses it once)
        at = int(timeline.time[c])
        events[v] = [(at + offset, at + offset + length - 1) for offset, length in anchors]
        clinical[v] = events[v][:1]
        evidence[v] = 1.0
    return Candidates(events, clinical, evidence)


def head_candidates(timeline: Timeline, path: np.ndarray, scores: np.ndarray, priors, temperature: float,
                    count: int) -> dict:
    """{"mouth": Candidates, "esophagus": Candidates} from the head posterior (`vce.post.head`,
    `scores` the calibrated region emissions): each region's ranked spans, its top span the
    clinical event, its posterior probability of being in the video the gate's evidence."""
    first = np.asarray(timeline.video_first, np.int64)
    cap = int(first[0]) if len(first) else 1  # the separator before every video and after the last
    end = np.append(first[1:] - cap, len(timeline.observed) - cap)
    out = {}
    heads = head_spans(scores, path, timeline.observed, first, end, priors, temperature, count)
    for state, (spans, presence) in heads.items():
        events = [[(int(timeline.time[a]), int(timeline.time[b])) for a, b in video] for video in spans]
        out[REGIONS[state]] = Candidates(events, [video[:1] for video in events], presence)
    return out
