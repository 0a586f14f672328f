"""The objective and the gates: what one label's candidates score, and where to emit them.

The metric scores every (video, label) on its own (REFERENCE.md "The official metric"), so
the tuning decomposes label by label: `LabelObjective` scores one label's candidates per
tuning video as the official scorer does. An absent label left silent scores 1 and a present
one 0, so a label is emitted in a video only where the video's evidence reaches a gate fitted
to maximise the label's summed AP (`fit_gate`). The evidence is one video-level feature of
its runs, or `joint`: a logistic model over all of them (`fit_presence_model`).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import numpy as np

from vce.core.errors import DataError
from vce.core.labels import LABEL_INDEX, LABELS, NUM_LABELS
from vce.eval.score import THRESHOLDS, average_precisions, group_average_precisions
from vce.post.anatomy import clipped_logits
from vce.post.engine.calibration import logistic
from vce.post.engine.candidates import Candidates, SpanLists
from vce.post.engine.newton import newton_logistic
from vce.post.engine.params import PRESENCE_FEATURES
from vce.post.timeline import Timeline

if TYPE_CHECKING:  # the policies decode through this module's gates: it must not import them
    from vce.post.engine.policies import RunsPolicy


def _span_arrays(spans: list) -> tuple | None:
    """(group, start, end) int64 arrays of per-group lists of (start, end) spans, group = list
    position (the scorer's layout, `group_average_precisions`); None if some span is not two
    integers or ends before it starts (the scorer's own checks then decide)."""
    counts = np.array([len(group) for group in spans], np.int64)
    flat = np.array([span for group in spans for span in group])
    if flat.size and (flat.dtype.kind not in "iu" or flat.ndim != 2 or flat.shape[1] != 2):
        return None
    flat = flat.astype(np.int64).reshape(-1, 2)
    if (flat[:, 1] < flat[:, 0]).any():
        return None
    return np.repeat(np.arange(len(spans)), counts), flat[:, 0].copy(), flat[:, 1].copy()


def _label_submission(video_ids: list, label: str, events: list) -> dict:
    return {"videos": [{"video_id": video_id, "events": [{"start": s, "end": e, "label": [label]} for s, e in spans]}
                       for video_id, spans in zip(video_ids, events)]}


class LabelObjective:
    """Per-video AP of one label's candidates on the tuning videos (objective over the thresholds)."""

    def __init__(self, timeline: Timeline, gt: dict, objective: str):
        self.video_ids = timeline.video_ids
        # Ids as the timeline holds them (str): truth with integer ids (which the scorer accepts)
        # would otherwise leave every video unscored, every AP 0, without an error.
        by_id = {str(video["video_id"]): {**video, "video_id": str(video["video_id"])} for video in gt["videos"]}
        missing = [v for v in self.video_ids if v not in by_id]
        if missing:
            raise DataError(f"score engine: ground truth lacks video(s) {missing[:5]} present in the frame probabilities")
        self.weights = {"mean": {0.5: 0.5, 0.95: 0.5}, "map@0.5": {0.5: 1.0, 0.95: 0.0}, "map@0.95": {0.5: 0.0, 0.95: 1.0}}[objective]
        scored, _ = average_precisions({"videos": [by_id[v] for v in self.video_ids]}, {"videos": []})
        self.scored = np.isin(self.video_ids, scored)  # a video without any labelled event is not scored
        # Per label, the ground truth of that label alone (the scorer's work shrinks to it); one
        # placeholder event of another label keeps every video scored.
        self.gt = {}
        for k, label in enumerate(LABELS):
            placeholder = {"start": 0, "end": 0, "label": [LABELS[(k + 1) % NUM_LABELS]]}
            self.gt[label] = {"videos": [
                {"video_id": v, "events": [{"start": e["start"], "end": e["end"], "label": [label]}
                                           for e in by_id[v]["events"] if label in e["label"]] + [placeholder]}
                for v in np.array(self.video_ids)[self.scored].tolist()]}
        self.present = {label: np.array([any(label in e["label"] for e in by_id[v]["events"]) for v in self.video_ids])
                        for label in LABELS}
        # ... and as the scorer's arrays (`group_average_precisions`: one group per scored video).
        self.scored_index = np.flatnonzero(self.scored)
        self.gt_arrays = {}
        for label in LABELS:
            spans = [[(e["start"], e["end"]) for e in by_id[self.video_ids[v]]["events"] if label in e["label"]]
                     for v in self.scored_index]
            self.gt_arrays[label] = _span_arrays(spans)
        self.evaluations = 0

    def per_video(self, label: str, events: list, spans: tuple | None = None) -> np.ndarray:
        """(V,) objective AP of `label` per tuning video when every video emits its `events`
        (`spans`: the same as `Candidates.spans` arrays, read instead of the lists)."""
        aps = self.per_threshold(label, events, spans)
        return sum(self.weights[t] * aps[t] for t in THRESHOLDS)

    def per_threshold(self, label: str, events: list, spans: tuple | None = None) -> dict:
        """tIoU threshold -> (V,) AP of `label` per tuning video (0 for unscored videos): what
        `per_video` weighs by the objective."""
        self.evaluations += 1
        pred = _span_arrays([events[v] for v in self.scored_index]) if spans is None else self._scored_spans(spans)
        truth = self.gt_arrays[label]
        aps = None if pred is None or truth is None else group_average_precisions(truth, pred, len(self.scored_index))
        if aps is None:  # spans the fast path cannot take (end < start, huge frames): the scorer's own checks
            _, by_label = average_precisions(self.gt[label], _label_submission(self.video_ids, label, events))
            aps = {t: by_label[t][:, LABEL_INDEX[label]] for t in THRESHOLDS}
        out = {t: np.zeros(len(self.video_ids)) for t in THRESHOLDS}
        for t in THRESHOLDS:
            out[t][self.scored] = aps[t]
        return out

    def _scored_spans(self, spans: tuple) -> tuple:
        """`_span_arrays` of the scored videos' events from (V,) counts, (N,) starts, (N,) ends."""
        counts, starts, ends = (np.asarray(a, np.int64) for a in spans)
        keep = np.repeat(self.scored, counts)
        if (ends[keep] < starts[keep]).any():
            return None
        return np.repeat(np.arange(len(self.scored_index)), counts[self.scored]), starts[keep], ends[keep]

    def silent(self, label: str) -> np.ndarray:
        """(V,) AP of leaving `label` out: 1 where absent, 0 where present."""
        return (~self.present[label]).astype(float)


def fit_gate(evidence: np.ndarray, emitted: np.ndarray, silent: np.ndarray) -> tuple[float | None, float]:
    """Gate g maximising sum_v (emitted_v if evidence_v >= g else silent_v): (g, that sum).

    g = inf: emit nowhere. Otherwise g is the midpoint between the weakest admitted video's
    evidence and the strongest rejected one's, or None (every video with evidence) when no
    video with evidence was rejected. Videos with equal evidence are admitted together.
    """
    order = np.argsort(-evidence, kind="stable")
    ranked = evidence[order]
    gain = np.cumsum((emitted - silent)[order])
    can = np.isfinite(ranked) & np.append(ranked[1:] < ranked[:-1], True)  # the end of a tie group
    base = float(silent.sum())
    if not can.any() or gain[can].max() <= 1e-12:
        return float("inf"), base
    i = int(np.flatnonzero(can)[np.argmax(gain[can])])
    below = ranked[i + 1] if i + 1 < len(ranked) and np.isfinite(ranked[i + 1]) else None
    return (float((ranked[i] + below) / 2) if below is not None else None), base + float(gain[i])


def presence_inputs(features: dict) -> np.ndarray:
    """(V, 6) the video-level features (`PRESENCE_FEATURES`, in that order) as the presence model
    reads them: logits of the three probabilities, log(1 + x) of frames and runs, the region
    share as it is; NaN rows for videos without a run."""
    has = np.isfinite(features["max"])
    out = np.full((len(has), len(PRESENCE_FEATURES)), np.nan)
    for j, name in enumerate(PRESENCE_FEATURES):
        x = features[name][has]
        out[has, j] = np.log1p(x) if name in ("frames", "count") else x if name == "region" else clipped_logits(x)
    return out


# Fits of `_fit_weighted_logistic` by their exact inputs: the grid's decodings of a label often
# give the same video-level features (a minimum length or a window that drops no run), and a
# fold's model is then fitted again on the same rows. Keyed by a digest; bounded (a few hundred bytes a fit).
_FITS: dict = {}
MAX_CACHED_FITS = 100_000


def _fit_weighted_logistic(x: np.ndarray, gain: np.ndarray) -> dict:
    """`_fit_logistic`, once per exact (x, gain): the cache returns the same fit (a copy)."""
    x, gain = np.ascontiguousarray(x, np.float64), np.ascontiguousarray(gain, np.float64)
    key = (x.shape, hashlib.blake2b(x.tobytes() + gain.tobytes(), digest_size=20).digest())
    if key not in _FITS:
        if len(_FITS) >= MAX_CACHED_FITS:
            _FITS.clear()
        _FITS[key] = _fit_logistic(x, gain)
    return {name: list(value) if isinstance(value, list) else value for name, value in _FITS[key].items()}


def _fit_logistic(x: np.ndarray, gain: np.ndarray) -> dict:
    mean, scale = x.mean(axis=0), np.maximum(x.std(axis=0), 1e-6)
    # sklearn's Newton-Cholesky iterations (`newton_logistic`): on a few dozen videos and 6
    # features sklearn's overheads are the fit's cost, and the engine fits this model often
    # (docs/engine.md); sklearn itself where it would leave Newton for L-BFGS.
    standard, target, weight = (x - mean) / scale, gain > 0, np.abs(gain)
    fitted = newton_logistic(standard, target, weight, max_iter=200)
    if fitted is None:
        model = logistic(standard, target, sample_weight=weight, one_thread=False, solver="newton-cholesky",
                         max_iter=200)
        fitted = model.coef_[0], float(model.intercept_[0])
    return {"mean": mean.tolist(), "scale": scale.tolist(), "coef": fitted[0].tolist(), "intercept": fitted[1]}


def presence_score(inputs: np.ndarray, model: dict) -> np.ndarray:
    """(V,) the presence model's log-odds that emitting pays; -inf for videos without a run."""
    z = ((inputs - np.asarray(model["mean"])) / np.asarray(model["scale"])) @ np.asarray(model["coef"]) + model["intercept"]
    return np.where(np.isnan(z), -np.inf, z)


def fit_presence_model(inputs: np.ndarray, gain: np.ndarray, folds: int = 5) -> tuple[np.ndarray, dict] | None:
    """The `joint` presence evidence: a logistic regression of "emitting beats silence here"
    (gain_v > 0, gain = the label's AP emitted minus silent) on the video-level `inputs`
    (`presence_inputs`), each video weighted by |gain_v|, so the videos where the decision
    matters most count most.

    Returns (each video's cross-fitted score — the videos of each of `folds` folds scored by the
    model fitted on the others; the model on all of them where a fold's complement lacks one
    side — and the model fitted on every video), or None with fewer than 2 videos on either
    side. The gate is fitted on the cross-fitted scores: fitted on its own videos, a 5-feature
    model would flatter itself against the one-feature gates it competes with."""
    has = ~np.isnan(inputs).any(axis=1)
    if min(((gain > 0) & has).sum(), ((gain < 0) & has).sum()) < 2:
        return None
    fit = has & (gain != 0)  # a video where the decision changes nothing has no say (nor in the scaling)
    model = _fit_weighted_logistic(inputs[fit], gain[fit])
    scores = presence_score(inputs, model)
    rows = np.flatnonzero(has)
    fold = np.full(len(gain), -1)
    fold[rows] = np.arange(len(rows)) % folds
    for f in range(min(folds, len(rows))):
        train = fit & (fold != f)
        if min((gain[train] > 0).sum(), (gain[train] < 0).sum()) >= 1:
            scores[fold == f] = presence_score(inputs[fold == f], _fit_weighted_logistic(inputs[train], gain[train]))
    return scores, model


def gate_evidence(features: dict, policy: RunsPolicy) -> np.ndarray:
    """(V,) the evidence a thresholded-run policy's gate reads: one feature, or the presence model's score."""
    return evidence_of(features, policy.evidence, policy.presence_model)


def evidence_of(features: dict, name: str, presence_model: dict | None = None) -> np.ndarray:
    """(V,) gate evidence `name` (a `PRESENCE_FEATURES` name, or "joint": `presence_model`'s score)."""
    if name == "joint":
        return presence_score(presence_inputs(features), presence_model)
    return features[name]


def gated(candidates: Candidates, gate: float | None) -> Candidates:
    """Only the videos whose evidence passes the gate (None: every video with evidence)."""
    keep = np.isfinite(candidates.evidence) & (True if gate is None else candidates.evidence >= gate)
    return Candidates(_kept(candidates.events, keep), _kept(candidates.clinical, keep), candidates.evidence)


def _kept(spans, keep: np.ndarray):
    """Per video, its spans where `keep` holds, else []: `SpanLists` stay arrays (their lists unbuilt)."""
    if isinstance(spans, SpanLists):
        return spans.only(keep)
    return [e if k else [] for e, k in zip(spans, keep)]
