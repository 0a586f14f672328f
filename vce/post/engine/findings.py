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
from vce.post.anatomy import label_logits
from vce.post.arhmm import ar_decode_all, ar_run_strength, ar_runs, fit_ar_model
from vce.post.engine.candidates import (
    anchored_candidates,
    hysteresis_runs,
    learn_compatibility,
    region_shares,
    run_candidates,
)
from vce.post.engine.gate import (
    LabelObjective,
    evidence_of,
    fit_gate,
    fit_presence_model,
    gate_evidence,
    presence_inputs,
)
from vce.post.engine.landmarks import appended_boundary, boundary_policy
from vce.post.engine.params import EngineParams
from vce.post.engine.policies import AnchoredPolicy, OffPolicy, Policy, RunsPolicy
from vce.post.engine.quantile_runs import quantile_runs
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
                 labels: np.ndarray, rates: dict | None = None, scores: np.ndarray | None = None,
                 truth: np.ndarray | None = None) -> dict[str, Policy]:
    """Per finding / landmark (LABELS order): the best of off, decoded runs (the threshold grid;
    for labels that pass the decoder screen, `screened`, the rank detector's and, `ar_runs`, the
    autoregressive HMM's too) and, for landmarks, anchors and (`scores`: the calibrated region
    emissions of `path`, `truth`: `region_truth`) the boundary posterior's candidates
    (`vce.post.engine.landmarks`; `labels`: `label_truth`).

    Emitting must beat silence by `min_gain_sqrt_videos` x sqrt(the number of tuning videos)
    summed AP (the summed gain's noise grows as its square root), and, for a label that
    every tuning video holds, weighed against the absent videos its presence rate says it will
    meet (`presence_weighting`, `rates`: `presence_rates` over every labelled video)."""
    margin = params.min_gain_sqrt_videos * np.sqrt(len(timeline.video_ids))
    passed = screened(timeline, params, labels)
    models = ar_models(timeline, params, labels, passed)
    boundary = (scores, truth) if scores is not None and truth is not None else None
    return {label: _label_policy(timeline, objective, params, path, gt, labels, label, (rates or {}).get(label), margin,
                                 models.get(LABEL_INDEX[label]), LABEL_INDEX[label] in passed, boundary)
            for label in LABELS if label not in REGIONS}


def screened(timeline, params: EngineParams, labels: np.ndarray) -> set:
    """Indices of the findings and landmarks whose tuning frames' probabilities rank above the
    label's other frames by `decoder_min_auc` at least (`rank_auc`): the labels the rank detector
    and the AR(1) decoder are tried for. A screen that assumes no noise model, so it does not
    favour the model a decoder tests (the AR fit's own step in innovation units would)."""
    return {LABEL_INDEX[label] for label in LABELS if label not in REGIONS
            and rank_auc(label_logits(timeline, LABEL_INDEX[label]), labels[LABEL_INDEX[label]])
            >= params.decoder_min_auc}


def ar_models(timeline, params: EngineParams, labels: np.ndarray, passed: set) -> dict:
    """Label index -> the autoregressive model (`fit_ar_model`, on the tuning frames' `labels`)
    of every label `passed` (`screened`; `ar_runs`); their decodings at each switch bias done
    together (`ar_decode_all`) and cached on `timeline`."""
    if not params.ar_runs:
        return {}
    models = {}
    for k in sorted(passed):
        model = fit_ar_model(label_logits(timeline, k), labels[k], params.ar_off_phases, params.ar_on_phases)
        if model is not None:
            models[k] = model
    ar_decode_all(timeline, [(k, model, float(bias)) for k, model in models.items() for bias in params.ar_biases])
    return models


def rank_auc(scores: np.ndarray, truth: np.ndarray, cap: int = 100_000) -> float:
    """The ROC AUC of (P,) `scores` for (P,) int8 `truth` (1 on, 0 off, -1 not counted): the
    share of (on, off) frame pairs the scores order right, ties half. At most `cap` frames of
    each side are read, every n-th in time order (deterministic; the AUC's sampling error at
    100,000 is ~0.002); 0.5 without frames on both sides."""
    on, off = scores[truth == 1], scores[truth == 0]
    if len(on) == 0 or len(off) == 0:
        return 0.5
    on, off = on[::-(-len(on) // cap)], np.sort(off[::-(-len(off) // cap)])
    below = np.searchsorted(off, on, side="left") + np.searchsorted(off, on, side="right")
    return float(below.sum() / (2.0 * len(on) * len(off)))


def _label_policy(timeline, objective: LabelObjective, params: EngineParams, path: np.ndarray, gt: dict,
                  labels: np.ndarray, label: str, rate: float | None, margin: float, model: dict | None,
                  passed: bool, boundary: tuple | None = None) -> Policy:
    """One label's policy (`phase_labels`; `model`: its `ar_models` entry; `passed`: the decoder
    screen's verdict; `boundary`: (region emissions, `region_truth`) for a landmark's boundary
    candidates), with its tuning AP per video and, when it is off, the shadow of its best runs
    (`shadow_cuts`: they still cut the regions). Anchors and boundary candidates are weighed by
    their cross-fitted AP (each half of the tuning videos scored by what the other half
    learned): free-form, their in-sample AP flatters them.

    `detector_choice: cross_fitted`: the detector (thresholded runs, rank, the autoregressive
    HMM) is the one whose selection scores best on held-out tuning videos (`_detector_family`),
    and the label's runs are the best of that detector's decodings; `in_sample`: the best
    decoding of any."""
    silent = objective.silent(label)
    weight, unseen = presence_weighting(objective.present[label], rate)
    best = (weight * float(silent.sum()) + unseen + margin, OffPolicy())  # beat silence by the margin
    tried = list(_runs_policies(timeline, objective, params, path, gt, model, label, passed))
    detectors = None
    if params.detector_choice == "cross_fitted":
        detectors = _detector_family(tried, silent, params.presence_features)
    best_runs = None  # the best runs even if they lose to silence
    for value, policy, _, _ in tried:
        value *= weight
        if (detectors is None or policy.detector == detectors["chosen"]) and value > best[0] + 1e-12:
            best = (value, policy)
        if best_runs is None or value > best_runs[0] + 1e-12:
            best_runs = (value, policy)
    if label in LANDMARKS and params.anchor_candidates > 0:
        value = weight * _cross_fitted_anchors(timeline, objective, path, gt, label, params.anchor_candidates)
        anchors = learn_anchors(timeline, path, gt, label, params.anchor_candidates)
        if anchors and value > best[0] + 1e-12:
            best = (value, AnchoredPolicy(anchors=anchors, gate=0.0))
    if label in LANDMARKS and params.landmark_candidates > 0 and boundary is not None:
        scores, truth = boundary
        value, policy = boundary_policy(timeline, objective, params, scores, path, truth, gt, label)
        if policy is not None and weight * value > best[0] + 1e-12:
            best = (weight * value, policy)
    value, policy = best
    if label in LANDMARKS and params.landmark_candidates > 0 and boundary is not None and policy.emitted_runs is not None:
        value, policy = _with_boundary(timeline, objective, params, path, gt, label, boundary, policy, value, weight)
    off = policy.silent
    tuning_ap = round((value - margin if off else value) / max(len(silent), 1), 4)
    policy = replace(policy, tuning_ap=tuning_ap, detectors=detectors)
    if off and params.shadow_cuts and best_runs is not None:
        return replace(policy, shadow=best_runs[1].spec())
    return policy


def _detector_family(tried: list, silent: np.ndarray, names) -> dict | None:
    """The detector whose decodings generalise best across tuning videos: {"chosen": detector,
    "held_out": {detector: summed AP}}, or None with fewer than 4 tuning videos or one detector.

    Per detector, each half of the tuning videos (alternate videos) is scored by the decoding and
    gate that win on the other half (`_best_gate` there, its gate applied here), so a detector
    with many free settings (the AR model's, a grid's) is not credited for fitting the videos
    it is scored on. `tried`: `_runs_policies`' (value, policy, per-video AP, gate features)."""
    families: dict = {}
    for _, policy, per_video, features in tried:
        families.setdefault(policy.detector, []).append((per_video, features))
    if len(families) < 2 or len(silent) < 4:
        return None
    fold = np.arange(len(silent)) % 2
    held_out = {detector: round(sum(_held_out_value(items, silent, names, fold == f) for f in (0, 1)), 6)
                for detector, items in families.items()}
    chosen = max(held_out, key=lambda d: (held_out[d], d == "threshold"))  # ties: the simpler detector
    return {"chosen": chosen, "held_out": held_out}


def _held_out_value(items: list, silent: np.ndarray, names, scored: np.ndarray) -> float:
    """Summed AP over the videos `scored` of the (per-video AP, features) decoding whose best
    gate wins on the other videos, that gate applied (silence where none applies)."""
    learn = ~scored
    best = None
    for per_video, features in items:
        value, gate, extra = _best_gate({name: x[learn] for name, x in features.items()}, per_video[learn],
                                        silent[learn], names)
        if extra is not None and (best is None or value > best[0] + 1e-12):
            best = (value, gate, extra, per_video, features)
    if best is None:
        return float(silent[scored].sum())
    _, gate, extra, per_video, features = best
    evidence = evidence_of(features, extra["evidence"], extra.get("presence_model"))[scored]
    admitted = np.isfinite(evidence) & (True if gate is None else evidence >= gate)
    return float(np.where(admitted, per_video[scored], silent[scored]).sum())


def _with_boundary(timeline, objective: LabelObjective, params: EngineParams, path: np.ndarray, gt: dict, label: str,
                   boundary: tuple, policy: RunsPolicy, value: float, weight: float) -> tuple[float, RunsPolicy]:
    """A landmark emitted as runs, with its boundary candidates appended where they add to its
    tuning AP (`appended_boundary`; the runs' gate unchanged); (its weighted value, the policy)."""
    runs = policy.decode_runs(timeline, label, params.top_k, path, appended=False)
    evidence = gate_evidence(runs.features, policy)
    emitted = np.isfinite(evidence) & (True if policy.gate is None else evidence >= policy.gate)
    scores, truth = boundary
    alone, appended, added = appended_boundary(timeline, objective, params, scores, path, truth, gt, label,
                                               runs.events, emitted)
    if added is None:
        return value, policy
    return value + weight * (appended - alone), replace(policy, boundary=added)


def _runs_policies(timeline, objective: LabelObjective, params: EngineParams, path: np.ndarray, gt: dict,
                   model: dict | None, label: str, passed: bool):
    """(summed tuning AP, runs policy, per-video AP ungated, gate features) of every run decoding
    and minimum length tried for `label` (`model`: its autoregressive model, `ar_models`;
    `passed`: the decoder screen's verdict), each with its best presence gate."""
    k = LABEL_INDEX[label]
    silent = objective.silent(label)
    regions = learn_compatibility(gt, label, params.compatibility_min_share) \
        if params.compatibility and label not in LANDMARKS else None
    shares = region_shares(gt, label)  # the region context of its presence evidence
    for spec, runs, strength in _decodings(timeline, k, params, model, passed):
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
                                    **extra), per_video, candidates.features


def _decodings(timeline, k: int, params: EngineParams, model: dict | None, passed: bool):
    """(run spec, (starts, ends), strength or None) of every run decoding tried for label k: the
    threshold grid; where the label `passed` the decoder screen (`screened`), the rank detector
    at each share and window (`quantile_runs`); then (`model`, its `ar_models` entry, fitted on
    the tuning frames) the autoregressive HMM at each switch bias (its runs ranked by
    `ar_run_strength`). Its spec carries `ar_levels`, but the choice and the gate read the
    decoded runs alone: the posterior runs are appended where it is emitted
    (`vce.post.engine.apply`)."""
    for threshold in params.thresholds:
        for ratio in params.hysteresis:
            for window in params.median_windows:
                spec = {"detector": "threshold", "threshold": float(threshold), "ratio": float(ratio),
                        "median_window": int(window)}
                yield spec, hysteresis_runs(timeline, k, threshold, ratio, window), None
    if passed:  # the label passed the decoder screen (`screened`): the rank detector too
        for share in params.rank_shares:
            for window in params.median_windows:
                spec = {"detector": "rank", "threshold": None, "ratio": 1.0, "median_window": int(window),
                        "share": float(share)}
                yield spec, quantile_runs(timeline, k, share, window), None
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
