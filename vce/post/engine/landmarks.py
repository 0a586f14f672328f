"""Landmarks at the decoded boundary they mark, with the boundary's uncertainty from the region scores.

A landmark (z-line, pylorus, ileocecal valve) sits where one region ends and the next starts:
in Galar most of its events end right where the next region starts (an event [B - L, B - 1],
L mostly 1-30 frames). The decoded region path puts that boundary at one position, but the
region scores hold how sure it is. So, per video:

1. The boundary posterior (`boundary_posteriors`). Around the decoded crossing c into the
   region the landmark marks, inside a window of `width` positions either side that stays in
   the two regions the path holds there (before: path[c - 1], after: path[c]), every crossing
   position b is scored by the calibrated region emissions s (`engine.region_emissions`):
   sum_{t < b} s_before(t) + sum_{t >= b} s_after(t), tempered by a temperature (a frame
   model's persistent errors make summed frame evidence overconfident). Under a uniform prior
   on b this is the forward-backward posterior of the two-state left-to-right chain of the
   window, the rest of the path held fixed (as `vce.post.head` does for the mouth and
   esophagus ends).
2. The spans (`learn_boundary_spans`): (offset, length) of the landmark's tuning events from
   the *true* crossing (the region ground truth), within `width` of it, each weighted by its
   share of its video's events (the recall a match there earns), summed over the videos.
3. The candidates (`boundary_candidates`): every (b, span) pair places the event
   [b + offset, b + offset + length - 1]; an event's score is the summed P(b) x weight of the
   pairs that place it, times its mean probability of the landmark to the power `prob_weight`
   (where the landmark's own frames carry signal; 0: the boundary alone). Ranked by score: for
   a present label with one event, the k-th candidate matching earns 1 / k, and later
   candidates cannot lower a present label's AP.
4. The presence gate (`BOUNDARY_FEATURES`): every video with a decoded boundary (`all`), or
   the posterior's sharpness (its largest P(b)), the landmark's highest frame probability in
   the window (`peak`), or the top candidate's score (`top`). Emitting in a video without the
   landmark costs its silence credit, and with the spans alone no landmark beats silence on
   Galar even at the true boundary (docs/engine_measurements.md), so the gate decides.
5. The choice to emit is cross-fitted (`cross_fitted_boundary`): spans, temperature,
   probability weight, gate feature and gate learned on each half of the tuning videos score
   the other half; the label emits only where that beats silence (and its other policies) by
   the engine's margin (`findings._label_policy`) and by `landmark_min_z` standard errors of
   its per-video gains (`gain_z`) at each tIoU threshold the objective weighs.
"""

from __future__ import annotations

import numpy as np
from scipy.special import logsumexp

from vce.core.labels import LABEL_INDEX, LANDMARKS, REGIONS
from vce.post.anatomy import boundaries
from vce.post.engine.candidates import Candidates
from vce.post.engine.gate import LabelObjective, fit_gate
from vce.post.engine.params import BOUNDARY_FEATURES, EngineParams
from vce.post.engine.policies import BoundaryPolicy
from vce.post.runs import mean_probs, video_of
from vce.post.timeline import Timeline


def first_crossings(timeline: Timeline, path: np.ndarray, region: int) -> np.ndarray:
    """(V,) each video's first position where `path` crosses into a state >= `region` from a
    lower one; -1 where it does not (`vce.post.anatomy.boundaries`)."""
    out = np.full(len(timeline.video_ids), -1, np.int64)
    crossings = boundaries(path, region)
    video = video_of(timeline, crossings)
    first = np.flatnonzero(np.diff(video, prepend=-1) != 0)  # boundaries are sorted: one per video, its first
    out[video[first]] = crossings[first]
    return out


def _video_ends(timeline: Timeline) -> np.ndarray:
    """(V,) each video's last position (exclusive end of its rows, before the separator)."""
    cap = int(timeline.video_first[0]) if len(timeline.video_first) else 1
    return np.append(timeline.video_first[1:] - cap, len(timeline.observed) - cap)


def boundary_posteriors(timeline: Timeline, scores: np.ndarray, path: np.ndarray, landmark: str, width: int,
                        temperature: float) -> list:
    """Per video: (first position of the window, (W,) posterior P(crossing at first + i)) of the
    boundary `landmark` marks (module docstring, step 1), or None without a decoded crossing."""
    region = REGIONS.index(LANDMARKS[landmark][1])
    crossings = first_crossings(timeline, path, region)
    ends = _video_ends(timeline)
    out: list = []
    for v, c in enumerate(crossings.tolist()):
        if c < 0:
            out.append(None)
            continue
        before, after = int(path[c - 1]), int(path[c])
        lo, hi = max(c - width, int(timeline.video_first[v])), min(c + width, int(ends[v]) - 1)
        left = path[lo:c] != before  # the window stays inside the run of `before` ...
        lo = lo + int(np.flatnonzero(left)[-1]) + 1 if left.any() else lo
        right = path[c:hi + 1] != after  # ... and inside the run of `after`
        hi = c + int(np.flatnonzero(right)[0]) - 1 if right.any() else hi
        gain = scores[lo:hi + 1, before] - scores[lo:hi + 1, after]  # (W,) before's evidence over after's
        log_post = temperature * np.concatenate([[0.0], np.cumsum(gain)])[:-1]  # b = lo + i: [lo, b) before
        out.append((lo, np.exp(log_post - logsumexp(log_post))))
    return out


def learn_boundary_spans(timeline: Timeline, truth: np.ndarray, gt: dict, landmark: str, width: int) -> list:
    """[offset, length, weight] of `landmark`'s tuning events from the true crossing (`truth`:
    `region_truth`, positions), those within `width` of it, weight = the event's share of its
    video's events summed over the videos, divided by the videos holding it; heaviest first."""
    crossings = first_crossings(timeline, truth, REGIONS.index(LANDMARKS[landmark][1]))
    ends = _video_ends(timeline)
    by_id = {str(video["video_id"]): video for video in gt["videos"]}
    weights: dict = {}
    holding = 0
    for v, video_id in enumerate(timeline.video_ids):
        events = [e for e in by_id.get(video_id, {"events": []})["events"] if landmark in e["label"]]
        if not events or crossings[v] < 0:
            continue
        holding += 1
        lo, hi = int(timeline.video_first[v]), int(ends[v])
        times = timeline.time[lo:hi]
        for e in events:
            start = lo + int(np.searchsorted(times, e["start"], side="left"))
            end = lo + int(np.searchsorted(times, e["end"], side="right")) - 1
            offset, length = start - int(crossings[v]), end - start + 1
            if length >= 1 and offset >= -width and offset + length - 1 <= width:
                weights[(offset, length)] = weights.get((offset, length), 0.0) + 1.0 / len(events)
    spans = sorted(weights.items(), key=lambda item: (-item[1], item[0]))
    return [[int(o), int(n), round(w / max(holding, 1), 6)] for (o, n), w in spans]


def boundary_candidates(timeline: Timeline, posteriors: list, landmark: str, spans: list, prob_weight: float,
                        count: int) -> Candidates:
    """The ranked events of `landmark` (module docstring, step 3), at most `count` per video,
    in each video's own time; `features`: the gate's evidence per `BOUNDARY_FEATURES`
    (-inf without a decoded boundary)."""
    k = LABEL_INDEX[landmark]
    n_videos = len(timeline.video_ids)
    ends = _video_ends(timeline)
    events: list = [[] for _ in range(n_videos)]
    features = {name: np.full(n_videos, -np.inf) for name in BOUNDARY_FEATURES}
    table = np.asarray(spans, np.float64).reshape(-1, 3)
    for v, posterior in enumerate(posteriors):
        if posterior is None or len(table) == 0:
            continue
        lo, p = posterior
        crossing = lo + np.arange(len(p))
        starts = (crossing[:, None] + table[None, :, 0]).astype(np.int64).ravel()  # (W x S,)
        lengths = np.broadcast_to(table[:, 1], (len(p), len(table))).astype(np.int64).ravel()
        mass = (p[:, None] * table[None, :, 2]).ravel()
        first, last = int(timeline.video_first[v]), int(ends[v]) - 1
        inside = (starts >= first) & (starts + lengths - 1 <= last)
        keys, where = np.unique(np.stack([starts[inside], lengths[inside]], axis=1), axis=0, return_inverse=True)
        score = np.bincount(where.ravel(), mass[inside], minlength=len(keys))
        if len(keys) == 0:
            continue
        a, b = keys[:, 0], keys[:, 0] + keys[:, 1] - 1
        if prob_weight:
            score = score * np.clip(mean_probs(timeline, k, a, b), 1e-6, 1.0) ** prob_weight
        order = np.lexsort((a, -score))[:count]
        events[v] = list(zip(timeline.time[a[order]].tolist(), timeline.time[b[order]].tolist()))
        window = timeline.probs[k, lo:lo + len(p)]
        features["all"][v] = 1.0
        features["sharpness"][v] = float(p.max())
        features["peak"][v] = float(np.nanmax(window)) if np.isfinite(window).any() else 0.0
        features["top"][v] = float(score[order[0]])
    return Candidates(events, [e[:1] for e in events], features["all"], features)


def fit_boundary(objective: LabelObjective, landmark: str, lists: dict, learn: np.ndarray,
                 features) -> tuple[float, tuple | None, float | None, str | None]:
    """The best (setting, gate feature, gate) of `lists` (setting -> (Candidates, per-video AP))
    on the videos `learn` (bool): (their summed AP, setting, gate, feature); setting None:
    silence wins there."""
    silent = objective.silent(landmark)
    best = (float(silent[learn].sum()), None, float("inf"), None)
    for setting, (candidates, per_video) in lists.items():
        for name in features:
            gate, value = fit_gate(candidates.features[name][learn], per_video[learn], silent[learn])
            if gate != float("inf") and value > best[0] + 1e-12:
                best = (value, setting, gate, name)
    return best


def boundary_policy(timeline: Timeline, objective: LabelObjective, params: EngineParams, scores: np.ndarray,
                    path: np.ndarray, truth: np.ndarray, gt: dict, landmark: str) -> tuple[float, BoundaryPolicy | None]:
    """(cross-fitted summed AP, the policy fitted on every tuning video) of `landmark`'s boundary
    candidates (module docstring, step 5; `cross_fitted_events`). The policy is None where the
    fit on every video is silent, or where the cross-fitted per-video gain over silence is under
    `landmark_min_z` standard errors above 0 (`gain_z`) at any tIoU threshold the objective
    weighs: the engine's margin is a bar on the summed gain alone, and a landmark's gain lives in
    few videos with gains of +-1, so a landmark without any signal passes it by chance; and a
    boundary placed a few frames off gains at 0.5 what it loses at 0.95, which their mean hides
    (docs/engine_measurements.md)."""
    fitted = _BoundaryFit(timeline, objective, params, scores, path, truth, gt, landmark)
    by_threshold = objective.per_threshold(landmark, fitted.cross_fitted_events())
    value = float(sum(objective.weights[t] * aps for t, aps in by_threshold.items()).sum())
    if not significant(by_threshold, objective.silent(landmark), objective.weights, params.landmark_min_z):
        return value, None
    everyone = np.ones(len(timeline.video_ids), bool)
    spans, lists = fitted.candidate_lists(everyone)
    _, setting, gate, name = fit_boundary(objective, landmark, lists, everyone, params.landmark_features)
    if setting is None:
        return value, None
    temperature, weight = setting
    return value, BoundaryPolicy(temperature=temperature, width=params.landmark_width, spans=spans,
                                 prob_weight=weight, candidates=params.landmark_candidates, evidence=name, gate=gate)


def significant(by_threshold: dict, silent: np.ndarray, weights: dict, min_z: float) -> bool:
    """Whether the per-video AP `by_threshold` (tIoU threshold -> (V,)) beats `silent` (V,) by
    `min_z` standard errors (`gain_z`) at every threshold of positive weight, not only in their
    weighted mean."""
    return all(gain_z(aps - silent) >= min_z for t, aps in by_threshold.items() if weights[t] > 0)


def gain_z(gain: np.ndarray) -> float:
    """The summed per-video `gain` in standard errors (its sample standard deviation x sqrt(V));
    0 where nothing changes, -inf with fewer than 2 videos."""
    if len(gain) < 2:
        return float("-inf")
    spread = float(np.std(gain, ddof=1)) * np.sqrt(len(gain))
    return 0.0 if spread == 0 else float(gain.sum()) / spread


class _BoundaryFit:
    """One landmark's boundary candidates on the tuning videos: the posteriors at every
    temperature (they do not depend on what is learned), the candidate lists of what one set of
    videos learns, and the cross-fitted submission."""

    def __init__(self, timeline: Timeline, objective: LabelObjective, params: EngineParams, scores: np.ndarray,
                 path: np.ndarray, truth: np.ndarray, gt: dict, landmark: str):
        self.timeline, self.objective, self.params, self.truth, self.landmark = timeline, objective, params, truth, landmark
        self.posteriors = {float(t): boundary_posteriors(timeline, scores, path, landmark, params.landmark_width, float(t))
                           for t in params.landmark_temperatures}
        self.by_id = {str(video["video_id"]): video for video in gt["videos"]}

    def candidates(self, learn: np.ndarray) -> tuple[list, dict]:
        """(the spans learned on the videos `learn` (bool), setting (temperature, probability
        weight) -> Candidates on every video)."""
        timeline, params = self.timeline, self.params
        learn_gt = {"videos": [self.by_id[v] for v, keep in zip(timeline.video_ids, learn) if keep and v in self.by_id]}
        spans = learn_boundary_spans(timeline, self.truth, learn_gt, self.landmark, params.landmark_width)
        return spans, {(t, float(weight)): boundary_candidates(timeline, posterior, self.landmark, spans, float(weight),
                                                               params.landmark_candidates)
                       for t, posterior in self.posteriors.items() for weight in params.landmark_prob_weights}

    def candidate_lists(self, learn: np.ndarray) -> tuple[list, dict]:
        """`candidates`, each with its per-video AP: setting -> (Candidates, (V,) AP)."""
        spans, by_setting = self.candidates(learn)
        return spans, {setting: (c, self.objective.per_video(self.landmark, c.events)) for setting, c in by_setting.items()}

    def cross_fitted_events(self) -> list:
        """Per tuning video, the events of the fit on the other half (alternate videos), [] where
        that fit is silent or its gate rejects the video: no video is scored by its own fit."""
        fold = np.arange(len(self.timeline.video_ids)) % 2
        events: list = [[] for _ in fold]
        for f in (0, 1):
            learn = fold != f
            _, lists = self.candidate_lists(learn)
            _, setting, gate, name = fit_boundary(self.objective, self.landmark, lists, learn, self.params.landmark_features)
            if setting is None:
                continue
            candidates = lists[setting][0]
            evidence = candidates.features[name]
            for v in np.flatnonzero(~learn & np.isfinite(evidence) & (True if gate is None else evidence >= gate)):
                events[v] = candidates.events[v]
        return events


def appended_boundary(timeline: Timeline, objective: LabelObjective, params: EngineParams, scores: np.ndarray,
                      path: np.ndarray, truth: np.ndarray, gt: dict, landmark: str, runs: list,
                      emitted: np.ndarray) -> tuple[float, float, BoundaryPolicy | None]:
    """A landmark emitted as runs (`runs`: per tuning video its decoded runs, `emitted`: (V,)
    where its gate admits them): (summed tuning AP of the runs alone, with the best boundary
    candidates appended, those candidates or None where none adds). Appended after a video's events they cannot lower its AP,
    and the runs' gate still decides where the landmark is emitted, so only the ranking is
    picked here, on the tuning videos (the spans learned on all of them)."""
    silent = objective.silent(landmark)
    alone = float(np.where(emitted, objective.per_video(landmark, runs), silent).sum())
    best = (alone, None)
    everyone = np.ones(len(timeline.video_ids), bool)
    fitted = _BoundaryFit(timeline, objective, params, scores, path, truth, gt, landmark)
    spans, by_setting = fitted.candidates(everyone)
    for (temperature, weight), c in by_setting.items():
        events = appended_events(runs, c.events, params.top_k)
        value = float(np.where(emitted, objective.per_video(landmark, events), silent).sum())
        if value > best[0] + 1e-12:
            best = (value, BoundaryPolicy(temperature=temperature, width=params.landmark_width, spans=spans,
                                          prob_weight=weight, candidates=params.landmark_candidates, evidence="all",
                                          gate=None))
    return alone, *best


def appended_events(events: list, extra: list, top_k: int) -> list:
    """Per video, `events` then those of `extra` not among them, up to `top_k` in all, where the
    video has events (a video without them stays silent)."""
    out = []
    for own, more in zip(events, extra):
        seen = set(own)
        out.append(own + [e for e in more if e not in seen][:max(top_k - len(own), 0)] if own else own)
    return out


def apply_boundary(timeline: Timeline, scores: np.ndarray, path: np.ndarray, landmark: str,
                   policy: BoundaryPolicy) -> Candidates:
    """A fitted boundary policy's candidates on new videos; `evidence` its gate's feature."""
    posteriors = boundary_posteriors(timeline, scores, path, landmark, policy.width, policy.temperature)
    c = boundary_candidates(timeline, posteriors, landmark, policy.spans, policy.prob_weight, policy.candidates)
    c.evidence = c.features[policy.evidence]
    return c
