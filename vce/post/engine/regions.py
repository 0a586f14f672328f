"""Regions: the ground truth on the frame axis, calibrated emissions, the decoded path, the region phase.

The five regions are one monotone path per video (`vce.post.anatomy.decode_regions`) on
*calibrated* emissions: a multinomial logistic regression from the five region logits to the
true region, fitted on frames sampled equally from each region, so the emission is close to
log P(region | frame) under a uniform prior, the HMM's scaled likelihood. A weight w on the
log region prior is added per frame (w < 0: a stay bonus for short regions); w and the switch
penalty are picked on the tuning videos' summed region APs (`phase_regions`).
"""

from __future__ import annotations

import numpy as np

from vce.core.errors import DataError
from vce.core.labels import LABEL_INDEX, NUM_LABELS, REGIONS
from vce.post.anatomy import EMISSION_FLOOR, REGION_ROWS, clipped_logits, decode_regions
from vce.post.engine.calibration import logistic
from vce.post.engine.candidates import region_candidates
from vce.post.engine.gate import LabelObjective, fit_gate
from vce.post.engine.params import EngineParams
from vce.post.engine.policies import RegionPolicy
from vce.post.runs import group_firsts, last_axis_max, runs_of, video_of
from vce.post.timeline import Timeline


def label_truth(timeline: Timeline, gt: dict) -> np.ndarray:
    """(17, P) int8 from the ground-truth events: 1 where a label is on, 0 where it is off, -1 on
    unobserved positions and on videos without ground truth."""
    truth = np.full((NUM_LABELS, len(timeline.observed)), -1, np.int8)
    position_of = {video_id: v for v, video_id in enumerate(timeline.video_ids)}
    bounds = np.append(timeline.video_first, truth.shape[1])
    for video in gt["videos"]:
        v = position_of.get(str(video["video_id"]))
        if v is None:
            continue
        lo, hi = int(bounds[v]), int(bounds[v + 1])
        truth[:, lo:hi] = 0
        times = timeline.time[lo:hi]
        for event in video["events"]:
            a = lo + np.searchsorted(times, event["start"], side="left")
            b = lo + np.searchsorted(times, event["end"], side="right")
            for label in event["label"]:
                if label not in LABEL_INDEX:
                    raise DataError(f"score engine: ground truth of video {video['video_id']} holds unknown label {label!r}")
                truth[LABEL_INDEX[label], a:b] = 1
    truth[:, ~timeline.observed] = -1
    return truth


def region_truth(timeline: Timeline, gt: dict, labels: np.ndarray | None = None) -> np.ndarray:
    """(P,) true region index (0..4) of every position, -1 unknown (`labels`: `label_truth` when made)."""
    on = (label_truth(timeline, gt) if labels is None else labels)[REGION_ROWS] == 1
    return np.where(on.any(axis=0), on.argmax(axis=0), -1).astype(np.int64)


def fit_calibration(timeline: Timeline, truth: np.ndarray, n_frames: int, seed: int = 0) -> tuple[list, list]:
    """(coef, intercept) of a multinomial logistic regression from the five region logits to the
    true region, on up to `n_frames` / 5 frames of each region (a region with fewer keeps all):
    fitted on equal shares, its prior is uniform, so the regions' prior is not counted again at
    every frame (it enters once, weighted, in `phase_regions`)."""
    rng = np.random.default_rng(seed)
    known = []
    for state in range(len(REGIONS)):  # stratified: up to n_frames / 5 frames of each region
        frames = np.flatnonzero(truth == state)
        per_state = n_frames // len(REGIONS)
        known.append(frames if len(frames) <= per_state else rng.choice(frames, per_state, replace=False))
    known = np.sort(np.concatenate(known))
    classes = np.unique(truth[known])
    if len(classes) < 2:  # nothing to learn: renormalised probabilities (identity on the logits)
        return np.eye(len(REGIONS)).tolist(), [0.0] * len(REGIONS)
    model = logistic(clipped_logits(timeline.probs[REGION_ROWS][:, known].T), truth[known], max_iter=300)
    coef = np.full((len(REGIONS), len(REGIONS)), 0.0)
    intercept = np.full(len(REGIONS), np.log(EMISSION_FLOOR))  # a region never seen: (almost) never decoded
    coef[classes] = model.coef_ if len(classes) > 2 else np.vstack([-model.coef_[0], model.coef_[0]]) / 2
    intercept[classes] = model.intercept_ if len(classes) > 2 else np.array([-1, 1]) * model.intercept_[0] / 2
    return coef.tolist(), intercept.tolist()


def region_log_prior(truth: np.ndarray) -> np.ndarray:
    """(5,) log share of the labelled tuning frames in each region (floored for a region never seen)."""
    counts = np.bincount(truth[truth >= 0], minlength=len(REGIONS)).astype(float)
    return np.log(np.maximum(counts / max(counts.sum(), 1.0), EMISSION_FLOOR))


def region_emissions(timeline: Timeline, coef, intercept) -> np.ndarray:
    """(P, 5) calibrated log P(region | frame); 0 where unobserved (no evidence)."""
    if "region_logits" not in timeline.prob_cums:  # the same for every (coef, intercept) the fit tries
        timeline.prob_cums["region_logits"] = clipped_logits(timeline.probs[REGION_ROWS].T)
    from threadpoolctl import threadpool_limits

    # One BLAS thread: OpenBLAS splits this (P, 5) x (5, 5) product over threads that cost
    # ~9x the CPU time of one on a shared machine (the same rows, the same bits).
    with threadpool_limits(1):
        z = timeline.prob_cums["region_logits"] @ np.asarray(coef).T
    z += np.asarray(intercept)
    z -= last_axis_max(z)[:, None]
    total = np.exp(z).sum(axis=1, keepdims=True)
    z -= np.log(total, out=total)
    z[~timeline.observed] = 0.0
    return z


def learn_durations(timeline: Timeline, truth: np.ndarray, quantile: float, factor: float) -> list | None:
    """The duration prior [min (5,), max (5,)] in frames: per region, the `quantile` of its
    ground-truth run lengths (merged runs, per video) and `factor` times the longest (0: none).
    A region without training runs is not constrained."""
    if quantile == 0 and factor == 0:
        return None
    low, high = [1] * len(REGIONS), [0] * len(REGIONS)
    for state in range(len(REGIONS)):
        starts, ends = runs_of(truth == state)
        if len(starts) == 0:
            continue
        # Runs of one video broken only by unlabelled frames count as one run.
        video = video_of(timeline, starts)
        first = group_firsts(video)
        lengths = np.maximum.reduceat(ends, first) - starts[first] + 1
        low[state] = max(int(np.floor(np.quantile(lengths, quantile))), 1) if quantile > 0 else 1
        high[state] = int(np.ceil(factor * lengths.max())) if factor > 0 else 0
    return [low, [h if h > 0 else int(len(truth)) + 1 for h in high]]


def decode(timeline: Timeline, scores: np.ndarray, penalty: float, durations: list | None) -> np.ndarray:
    """The region path (`decode_regions`) under the duration prior `durations` (None: any length)."""
    low, high = (None, None) if durations is None else durations
    return decode_regions(timeline, scores, float(penalty), low, high)


def phase_regions(timeline, objective: LabelObjective, params: EngineParams, coef, intercept, log_prior, durations):
    """Pick the prior weight and switch penalty (and each region's gate) on the summed region APs
    of the tuning videos: (total, penalty, path, policies, intercept with the weighted prior, weight)."""
    best = None
    for weight in params.prior_weights:
        weighted = (np.asarray(intercept) + weight * log_prior).tolist()
        scores = region_emissions(timeline, coef, weighted)
        for penalty in params.switch_penalties:
            candidate = _regions_at(timeline, objective, scores, penalty, durations)
            if best is None or candidate[0] > best[0] + 1e-12:
                best = (*candidate, weighted, float(weight))
    return best


def _regions_at(timeline, objective: LabelObjective, scores, penalty, durations):
    """(summed region APs, penalty, path, region policies) of one decoding."""
    path = decode(timeline, scores, penalty, durations)
    total, policies = 0.0, {}
    for state, region in enumerate(REGIONS):
        candidates = region_candidates(timeline, path, state, [], None)
        gate, value = fit_gate(candidates.evidence, objective.per_video(region, candidates.events), objective.silent(region))
        total += value
        policies[region] = RegionPolicy(gate=gate)
    return total, float(penalty), path, policies
