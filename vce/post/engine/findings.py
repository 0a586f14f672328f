"""The label phase: per finding and landmark, the best of silence, decoded runs and anchors.

Per label the engine tries `off` (never emitted: AP 1 wherever absent), thresholded runs over
a small grid (with hysteresis and median filters), the runs of an autoregressive HMM fitted on
the tuning frames (`vce.post.arhmm`) and, for landmarks, events anchored at the decoded
boundary they mark; each decoding with the presence gate that scores it best. Emitting must
beat silence by `min_gain_sqrt_videos` x sqrt(V) summed AP over the V tuning videos: the
summed gain's noise grows as sqrt(V), so the bar is a significance bar.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from vce.core.labels import LABEL_INDEX, LABELS, LANDMARKS, REGIONS
from vce.post.anatomy import clipped_logits
from vce.post.arhmm import ar_decode_all, ar_run_strength, ar_runs, fit_ar_model
from vce.post.engine.candidates import (
    anchored_candidates,
    hysteresis_runs,
    learn_compatibility,
    region_shares,
    run_candidates,
)
from vce.post.engine.gate import LabelObjective, fit_gate, fit_presence_model, presence_inputs
from vce.post.engine.params import EngineParams
from vce.post.engine.policies import AnchoredPolicy, OffPolicy, Policy, RunsPolicy
from vce.post.engine.variants import learn_anchors


def presence_weighting(present: np.ndarray, rate: float | None) -> tuple[float, float]:
    """(weight of the tuning videos' APs, AP of silence in the absent videos they do not show) of
    a label's decision: (rate, (1 - rate) x their number) when every tuning video holds the label
    (`present`), `rate` its share of every labelled video (`presence_rates`); else (1, 0).

    With no absent tuning video a gate has nothing to learn from and admits every video, so
    the tuning videos stand for the share `rate` of the videos to come, and the others lack the
    label: emitting it there scores 0 (a video without it holds a run at some threshold),
    silence 1. Two validation videos that both hold a finding otherwise emit it everywhere."""
    if rate is None or len(present) == 0 or not present.all():
        return 1.0, 0.0
    return float(rate), (1.0 - float(rate)) * len(present)


def presence_rates(frame_labels: pd.DataFrame) -> dict:
    """Per label, the share of the videos of `frame_labels` (video_id and the 17 0/1 label
    columns) with at least one frame of it: `fit_engine`'s `rates`, from every labelled video
    the pipeline learns from (the tuning videos are a small sample of them). With a `split`
    column only its "train" and "val" rows count: held-out test videos are never tuned on."""
    if "split" in frame_labels.columns:
        frame_labels = frame_labels[frame_labels["split"].isin(["train", "val"])]
    if len(frame_labels) == 0:
        return {}
    held = frame_labels.groupby("video_id", sort=False)[list(LABELS)].max() > 0
    return {label: float(share) for label, share in held.mean().items()}


def phase_labels(timeline, objective: LabelObjective, params: EngineParams, path: np.ndarray, gt: dict,
                 labels: np.ndarray, rates: dict | None = None) -> dict[str, Policy]:
    """Per finding / landmark (LABELS order): the best of off, decoded runs (the threshold grid;
    `ar_runs`: the autoregressive HMM's too) and, for landmarks, anchors (`labels`: `label_truth`).

    Emitting must beat silence by `min_gain_sqrt_videos` x sqrt(the number of tuning videos)
    summed AP (the summed gain's noise grows as its square root), and, for a label that
    every tuning video holds, weighed against the absent videos its presence rate says it will
    meet (`presence_weighting`, `rates`: `presence_rates` over every labelled video)."""
    margin = params.min_gain_sqrt_videos * np.sqrt(len(timeline.video_ids))
    models = ar_models(timeline, params, labels)
    return {label: _label_policy(timeline, objective, params, path, gt, labels, label, (rates or {}).get(label), margin,
                                 models.get(LABEL_INDEX[label]))
            for label in LABELS if label not in REGIONS}


def ar_models(timeline, params: EngineParams, labels: np.ndarray) -> dict:
    """Label index -> the autoregressive model (`fit_ar_model`, on the tuning frames' `labels`)
    of every finding and landmark that separates by `ar_min_separation` at least (`ar_runs`);
    their decodings at each switch bias done together (`ar_decode_all`) and cached on `timeline`."""
    if not params.ar_runs:
        return {}
    models = {}
    for label in LABELS:
        if label in REGIONS:
            continue
        k = LABEL_INDEX[label]
        model = fit_ar_model(clipped_logits(timeline.probs[k]), labels[k], params.ar_off_phases, params.ar_on_phases)
        if model is not None and model["separation"] >= params.ar_min_separation:
            models[k] = model
    ar_decode_all(timeline, [(k, model, float(bias)) for k, model in models.items() for bias in params.ar_biases])
    return models


def _label_policy(timeline, objective: LabelObjective, params: EngineParams, path: np.ndarray, gt: dict,
                  labels: np.ndarray, label: str, rate: float | None, margin: float, model: dict | None) -> Policy:
    """One label's policy (`phase_labels`; `model`: its `ar_models` entry), with its tuning AP per video and, when it is off,
    the shadow of its best runs (`shadow_cuts`: they still cut the regions)."""
    silent = objective.silent(label)
    weight, unseen = presence_weighting(objective.present[label], rate)
    best = (weight * float(silent.sum()) + unseen + margin, OffPolicy())  # beat silence by the margin
    best_runs = None  # the best runs even if they lose to silence
    for value, policy in _runs_policies(timeline, objective, params, path, gt, model, label):
        value *= weight
        if value > best[0] + 1e-12:
            best = (value, policy)
        if best_runs is None or value > best_runs[0] + 1e-12:
            best_runs = (value, policy)
    if label in LANDMARKS and params.anchor_candidates > 0:
        value = weight * _cross_fitted_anchors(timeline, objective, path, gt, label, params.anchor_candidates)
        anchors = learn_anchors(timeline, path, gt, label, params.anchor_candidates)
        if anchors and value > best[0] + 1e-12:
            best = (value, AnchoredPolicy(anchors=anchors, gate=0.0))
    value, policy = best
    off = isinstance(policy, OffPolicy)
    tuning_ap = round((value - margin if off else value) / max(len(silent), 1), 4)
    if off and params.shadow_cuts and best_runs is not None:
        return replace(policy, tuning_ap=tuning_ap, shadow=best_runs[1].spec())
    return replace(policy, tuning_ap=tuning_ap)


def _runs_policies(timeline, objective: LabelObjective, params: EngineParams, path: np.ndarray, gt: dict,
                   model: dict | None, label: str):
    """(summed tuning AP, runs policy) of every run decoding and minimum length tried for
    `label` (`model`: its autoregressive model, `ar_models`), each with its best presence gate."""
    k = LABEL_INDEX[label]
    silent = objective.silent(label)
    regions = learn_compatibility(gt, label, params.compatibility_min_share) \
        if params.compatibility and label not in LANDMARKS else None
    shares = region_shares(gt, label)  # the region context of its presence evidence
    for spec, runs, strength in _decodings(timeline, k, params, model):
        for min_length in params.min_lengths:
            candidates = run_candidates(timeline, k, spec["threshold"], spec["median_window"], min_length,
                                        params.top_k, runs, path=path, regions=regions, shares=shares,
                                        strength=strength)
            if not np.isfinite(candidates.evidence).any():
                continue
            per_video = objective.per_video(label, candidates.events, candidates.spans)
            value, gate, extra = _best_gate(candidates.features, per_video, silent, params.presence_features)
            if extra is None:
                continue
            yield value, RunsPolicy(**spec, min_length=int(min_length), regions=regions, shares=shares, gate=gate,
                                    **extra)


def _decodings(timeline, k: int, params: EngineParams, model: dict | None):
    """(run spec, (starts, ends), strength or None) of every run decoding tried for label k: the
    threshold grid, then (`model`, its `ar_models` entry: fitted on the tuning frames, separating
    the label by `ar_min_separation` at least) the autoregressive HMM at each switch bias (its
    runs ranked by `ar_run_strength`). Its spec carries `ar_levels`, but the choice and
    the gate read the decoded runs alone: the posterior runs are appended where it is emitted
    (`vce.post.engine.apply`)."""
    for threshold in params.thresholds:
        for ratio in params.hysteresis:
            for window in params.median_windows:
                spec = {"detector": "threshold", "threshold": float(threshold), "ratio": float(ratio),
                        "median_window": int(window)}
                yield spec, hysteresis_runs(timeline, k, threshold, ratio, window), None
    if not params.ar_runs or model is None:
        return
    for bias in params.ar_biases:
        spec = {"detector": "ar", "threshold": None, "ratio": 1.0, "median_window": 1, "ar_model": model,
                "ar_bias": float(bias), "ar_levels": [float(level) for level in params.ar_levels]}
        yield spec, ar_runs(timeline, k, model, float(bias)), ar_run_strength(timeline, k, model, float(bias))


def _best_gate(features: dict, per_video: np.ndarray, silent: np.ndarray, names) -> tuple:
    """(summed AP, gate, {"evidence": name[, "presence_model": ...]}) of the best of the gate
    features `names` for one decoding; (None, None, None) when none applies (`joint` alone, too
    few videos on a side)."""
    best = (None, None, None)
    for name in names:
        if name == "joint":
            fitted = fit_presence_model(presence_inputs(features), per_video - silent)
            if fitted is None:
                continue
            gate, value = fit_gate(fitted[0], per_video, silent)
            extra = {"evidence": name, "presence_model": fitted[1]}
        else:
            gate, value = fit_gate(features[name], per_video, silent)
            extra = {"evidence": name}
        if best[0] is None or value > best[0] + 1e-12:
            best = (value, gate, extra)
    return best


def _cross_fitted_anchors(timeline, objective: LabelObjective, path, gt: dict, label: str, n: int) -> float:
    """Summed AP of anchored events when the anchors of each half of the tuning videos are learned
    on the other half (anchors are free-form: their in-sample AP flatters them)."""
    videos = {str(video["video_id"]): video for video in gt["videos"]}
    fold = np.arange(len(timeline.video_ids)) % 2
    total = 0.0
    for f in (0, 1):
        learn_on = {"videos": [videos[v] for v, g in zip(timeline.video_ids, fold) if g != f and v in videos]}
        anchors = learn_anchors(timeline, path, learn_on, label, n)
        if anchors:
            per_video = objective.per_video(label, anchored_candidates(timeline, path, label, anchors).events)
        else:
            per_video = objective.silent(label)
        total += float(per_video[fold == f].sum())
    return total
