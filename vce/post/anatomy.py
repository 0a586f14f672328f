"""Anatomy-consistent decoding: one monotone region path per video, landmarks at its boundaries.

A capsule passes mouth → esophagus → stomach → small intestine → colon and never goes back
(REFERENCE.md). Thresholding each region label on its own ignores that: noise bursts make a
colon stretch inside the small intestine, or two regions at once. Here, per video:

1. Emission score of region k at frame t. `emission: probs`: s[t, k] = log p_k(t) −
   log Σ_j p_j(t), the region probabilities renormalised over the five regions (every frame is
   in exactly one region), floored at `EMISSION_FLOOR` inside the log. `emission: runs`:
   s[t, k] = 1 inside region k's thresholded (smoothed) runs, else 0, so the path is the
   monotone consensus of the per-label decisions; it uses the per-label thresholds, which
   correct labels calibrated differently (a rare region under-confident next to a common one),
   and `switch_penalty` is then in frames. Unobserved frames (gaps, invalid) score 0.
2. Best monotone path (Viterbi over a left-to-right chain; the path may start in any region,
   skip regions and end in any region), each switch costing `switch_penalty`:
       D_k(t) = max(D_k(t−1), max_{j<k} D_j(t−1) − λ) + s[t, k].
   The recursion is unrolled over the K = 5 states (one compiled pass a state,
   `vce.post.kernels.monotone_forward`): with S_k the prefix sum of s[:, k], a path in state k
   at t entered it at some τ ≤ t, so
       D_k(t) = S_k(t) + max(0 [started in k], max_{1≤τ≤t} (M_{k−1}(τ−1) − λ − S_k(τ−1))),
   M_{k−1} = max_{j<k} D_j: one running maximum per state. The
   argmax of that running maximum gives the entry frame for the backtrack (≤ K steps).
   A duration prior (state k lasts lo_k..hi_k frames when visited) restricts τ to
   [t − hi_k + 1, t − lo_k + 1]: a trailing window maximum (O(T), van Herk / Gil-Werman
   blocks) instead of the running one, the entry found again inside its window in the backtrack.
3. Region events are the path's runs (exactly one region per frame, no going back). The
   thresholds still decide *whether* a label fires: a decoded region run is kept only where the
   region's own thresholded runs overlap it (a threshold above 1 switches the region off, as
   without decoding), so threshold tuning keeps its meaning.
4. Landmarks (z-line, pylorus, ileocecal valve) sit at the boundary between their two regions
   (`vce.labels.LANDMARKS`; a path that skips a region crosses several boundaries at once).
   `landmarks: window` keeps the landmark's own thresholded runs that touch ±`landmark_window`
   frames of the decoded boundary and drops the others; `peak` replaces them, where such a run
   exists, by one event of `landmark_length` frames centred on the landmark's most probable
   frame within that window. A video whose path never crosses the boundary gets no landmark.
"""

from __future__ import annotations

import numpy as np

from vce.core.errors import DataError
from vce.core.labels import LABEL_INDEX, LANDMARKS, REGIONS
from vce.post.kernels import monotone_forward
from vce.post.runs import group_firsts, runs_of, video_of

EMISSION_FLOOR = 1e-6  # numerical floor of probabilities inside the log (no effect above 1e-6)
REGION_ROWS = np.array([LABEL_INDEX[region] for region in REGIONS])


def clipped_logits(probs: np.ndarray) -> np.ndarray:
    """float64 logits of probabilities clipped to [EMISSION_FLOOR, 1 - EMISSION_FLOOR] (NaN reads 0.5)."""
    # In place, one buffer and one temporary (the engine takes these logits of every frame of
    # every label): NaN set after the clip is the same as before it, 0.5 lies inside the range.
    p = np.array(probs, dtype=np.float64)
    np.clip(p, EMISSION_FLOOR, 1 - EMISSION_FLOOR, out=p)
    np.copyto(p, 0.5, where=np.isnan(p))
    off = np.negative(p, out=np.empty_like(p))
    np.log1p(off, out=off)
    np.log(p, out=p)
    p -= off
    return p if p.ndim else p[()]


def label_logits(timeline, k: int) -> np.ndarray:
    """(P,) `clipped_logits` of label k's probabilities on `timeline`, cached there (read-only):
    the fit reads every label's logits several times over (centres, screen, AR model, each
    decoding), always of the same probabilities."""
    key = ("logits", k)
    if key not in timeline.prob_cums:
        logits = clipped_logits(timeline.probs[k])
        logits.flags.writeable = False
        timeline.prob_cums[key] = logits
    return timeline.prob_cums[key]


def region_scores(region_probs: np.ndarray) -> np.ndarray:
    """(T, K) emission scores from (T, K) region probabilities; NaN rows (unobserved) score 0."""
    probs = np.maximum(np.nan_to_num(region_probs.astype(np.float64), nan=1.0), EMISSION_FLOOR)
    return np.log(probs) - np.log(probs.sum(axis=1, keepdims=True))


def monotone_path(scores: np.ndarray, switch_penalty: float, min_durations=None,
                  max_durations=None) -> tuple[np.ndarray, float]:
    """Best non-decreasing state path through (T, K) scores, each switch costing the penalty.

    `min_durations` / `max_durations` (K,) frames: a state the path visits lasts at least /
    at most that long (the duration prior; None: any length). Returns (path (T,) int64 states,
    its total score); a video no path fits (shorter than every minimum, longer than the maxima
    allow) is decoded without the duration prior. Formula in the module docstring.
    """
    n_frames, n_states = scores.shape
    if n_frames == 0:
        return np.zeros(0, np.int64), 0.0
    low = np.ones(n_states, np.int64) if min_durations is None else np.maximum(np.asarray(min_durations, np.int64), 1)
    high = np.full(n_states, n_frames, np.int64) if max_durations is None else np.asarray(max_durations, np.int64)
    high = np.maximum(np.minimum(high, n_frames), low)
    best = np.empty((n_frames, n_states))  # D_k(t)
    enters = np.empty((n_frames, n_states))  # value of entering k at frame tau (for the backtrack)
    monotone_forward(np.asarray(scores, np.float64), float(switch_penalty), low, high, best, enters)
    if not np.isfinite(best[-1]).any():  # no path fits the duration prior
        if min_durations is None and max_durations is None:  # no prior to drop: the scores themselves are bad
            raise DataError("region path: no path has a finite score (NaN/inf region scores or switch penalty)")
        return monotone_path(scores, switch_penalty)
    # Backtrack: at most one entry per state (the earliest best tau in its window); before
    # entering k at tau the path was in the best state below k at tau - 1.
    path = np.empty(n_frames, np.int64)
    t, k = n_frames - 1, int(np.argmax(best[-1]))
    total = float(best[-1, k])
    while True:
        lo, hi = max(t - int(high[k]) + 1, 0), t - int(low[k]) + 1
        tau = lo + int(np.argmax(enters[lo : hi + 1, k]))
        path[tau : t + 1] = k
        if tau == 0:
            return path, total
        t, k = tau - 1, int(np.argmax(best[tau - 1, :k]))


def _video_spans(timeline) -> tuple[np.ndarray, np.ndarray]:
    """(first, last) observed position of each video on the timeline (-1 for a video without any)."""
    observed = np.flatnonzero(timeline.observed)
    n_videos = len(timeline.video_ids)
    first = np.full(n_videos, -1, np.int64)
    last = np.full(n_videos, -1, np.int64)
    if len(observed):
        video = video_of(timeline, observed)
        starts = group_firsts(video)
        first[video[starts]] = observed[starts]
        ends = np.append(starts[1:] - 1, len(observed) - 1)
        last[video[ends]] = observed[ends]
    return first, last


def decode_regions(timeline, scores: np.ndarray, switch_penalty: float, min_durations=None,
                   max_durations=None) -> np.ndarray:
    """(P,) region index (0..4) of every position inside a video's span, -1 elsewhere.

    `scores`: (P, K) emission scores on the timeline (0 where unobserved); durations: `monotone_path`.
    """
    path = np.full(len(timeline.observed), -1, np.int64)
    for first, last in zip(*_video_spans(timeline)):
        if first >= 0:
            path[first : last + 1], _ = monotone_path(scores[first : last + 1], switch_penalty, min_durations,
                                                      max_durations)
    return path


def run_scores(size: int, region_runs: list) -> np.ndarray:
    """(P, K) emission 1 inside a region's thresholded runs, 0 elsewhere (`emission: runs`)."""
    scores = np.zeros((size, len(region_runs)))
    for state, (starts, ends) in enumerate(region_runs):
        marks = np.zeros(size + 1)
        np.add.at(marks, starts, 1.0)
        np.add.at(marks, ends + 1, -1.0)
        scores[:, state] = np.cumsum(marks[:-1])
    return scores


def region_path(timeline, runs: list, params) -> np.ndarray:
    """The decoded path, cached on the timeline (threshold tuning asks for it many times)."""
    region_runs = [runs[LABEL_INDEX[region]] for region in REGIONS]
    if params.emission == "probs":
        key = ("probs", float(params.switch_penalty))
    else:
        key = ("runs", float(params.switch_penalty), hash(b"".join(a.tobytes() + b"|" for r in region_runs for a in r)))
    if key not in timeline.region_paths:
        if len(timeline.region_paths) > 64:
            timeline.region_paths.clear()
        if params.emission == "probs":
            scores = region_scores(timeline.probs[REGION_ROWS].T)  # (P, K), 0 where unobserved
        else:
            scores = run_scores(len(timeline.observed), region_runs)
        timeline.region_paths[key] = decode_regions(timeline, scores, params.switch_penalty)
    return timeline.region_paths[key]


def _overlapping(decoded, evidence) -> tuple[np.ndarray, np.ndarray]:
    """The decoded runs that at least one evidence run (time-sorted, disjoint) overlaps."""
    starts, ends = decoded
    evidence_starts, evidence_ends = evidence
    if len(evidence_starts) == 0:
        return starts[:0], ends[:0]
    first = np.searchsorted(evidence_ends, starts, side="left")  # first evidence run ending at/after start
    hit = (first < len(evidence_starts)) & (evidence_starts[np.minimum(first, len(evidence_starts) - 1)] <= ends)
    return starts[hit], ends[hit]


def boundaries(path: np.ndarray, region: int) -> np.ndarray:
    """Positions where the path first reaches a state >= `region` coming from a lower one."""
    before, after = path[:-1], path[1:]
    crossing = (before >= 0) & (before < region) & (after >= region)
    return np.flatnonzero(crossing) + 1


def place_landmark(timeline, k: int, runs, path: np.ndarray, crossings: np.ndarray, params) -> tuple[np.ndarray, np.ndarray]:
    """Landmark k's runs restricted to (or, `peak`, re-placed at) the decoded boundary windows."""
    starts, ends = runs
    if len(crossings) == 0 or len(starts) == 0:
        empty = np.zeros(0, np.int64)
        return empty, empty
    # Windows of +-landmark_window frames around each crossing, clipped to its video's span.
    span_starts, span_ends = runs_of(path >= 0)
    span = np.searchsorted(span_starts, crossings, side="right") - 1
    lo = np.maximum(crossings - params.landmark_window, span_starts[span])  # (B,)
    hi = np.minimum(crossings + params.landmark_window, span_ends[span])
    # Runs touching each window: a run [s, e] touches [lo, hi] when s <= hi and e >= lo.
    first_touching = np.searchsorted(ends, lo, side="left")  # runs sorted by time, disjoint
    touches = (first_touching < len(starts)) & (starts[np.minimum(first_touching, len(starts) - 1)] <= hi)
    if params.landmarks == "window":
        keep = np.zeros(len(starts), bool)
        for b in np.flatnonzero(touches):
            j = first_touching[b]
            while j < len(starts) and starts[j] <= hi[b]:
                keep[j] = True
                j += 1
        return starts[keep], ends[keep]
    # peak: one event of landmark_length frames at the most probable frame of each window.
    probs = np.nan_to_num(timeline.probs[k], nan=-1.0)
    out_starts, out_ends = [], []
    for b in np.flatnonzero(touches):
        a, z = int(lo[b]), int(hi[b])
        peak = a + int(np.argmax(probs[a : z + 1]))
        start = max(peak - (params.landmark_length - 1) // 2, a)
        out_starts.append(start)
        out_ends.append(min(start + params.landmark_length - 1, z))
    return np.array(out_starts, np.int64), np.array(out_ends, np.int64)


def anatomy_runs(timeline, runs: list, params) -> list:
    """Replace region runs by the decoded path's runs and confine landmarks to its boundaries.

    `runs`: [(starts, ends)] per label in LABELS order (timeline positions); `params`: the
    `EventParams` (emission, switch_penalty, landmarks, landmark_window, landmark_length).
    """
    path = region_path(timeline, runs, params)
    runs = list(runs)
    for state, region in enumerate(REGIONS):
        k = LABEL_INDEX[region]
        runs[k] = _overlapping(runs_of(path == state), runs[k])
    for landmark, (_, region_after) in LANDMARKS.items():
        k = LABEL_INDEX[landmark]
        crossings = boundaries(path, REGIONS.index(region_after))
        runs[k] = place_landmark(timeline, k, runs[k], path, crossings, params)
    return runs
