"""Fitting the engine on tuning videos: the phases in order, then the region gates once the labels are known.

1. read the findings through per-video centres and per-label temperatures (`calibration`);
2. the region phase: calibration, prior weight and switch penalty, region gates (`regions`);
3. the label phase: each finding's and landmark's policy (`findings`);
4. the regions' learned variants, then their gates again with the variants and the cut pieces
   appended, in the cut order that scores best per region;
5. the mouth and the esophagus from the head posterior, where it beats those candidates.

`cross_fit` estimates what the engine scores on videos it did not tune on.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from vce.core.labels import LABELS, REGIONS
from vce.post.anatomy import label_logits
from vce.post.engine.apply import all_region_candidates, engine_submission_on, label_candidates
from vce.post.engine.calibration import calibrated, fit_temperatures, recentred
from vce.post.engine.candidates import gc_paused, head_candidates
from vce.post.engine.findings import phase_labels
from vce.post.engine.fitted import Engine
from vce.post.engine.gate import LabelObjective, fit_gate
from vce.post.engine.params import EngineParams
from vce.post.engine.policies import HeadPolicy, OffPolicy
from vce.post.engine.regions import (
    fit_calibration,
    label_truth,
    learn_durations,
    phase_regions,
    region_emissions,
    region_log_prior,
    region_truth,
)
from vce.post.engine.variants import learn_variants
from vce.post.head import HEAD_REGIONS, head_lengths, length_prior
from vce.post.timeline import Timeline


@gc_paused
def fit_engine(timeline: Timeline, gt: dict, params: EngineParams, seed: int = 0, rates: dict | None = None) -> Engine:
    """Fit the engine on tuning videos (their probabilities on `timeline`, their ground truth `gt`).

    `rates`: each label's share of every labelled video (`presence_rates`, e.g. the training and
    validation videos' ground truth), read where every tuning video holds a label (`phase_labels`);
    None: the tuning videos alone.

    `cross_fit`: the report also holds `cross_fitted`, the official mAP of the videos of each
    half (alternate videos) under the engine fitted on the other half: an estimate on videos
    the post-processing did not tune on (the engine itself is fitted on all of them)."""
    began = time.perf_counter()
    cross_fitted = cross_fit(timeline, gt, params, seed, rates) if params.cross_fit else None
    timeline, centres, labels, temperatures = _read_findings(timeline, gt, params, seed)
    objective = LabelObjective(timeline, gt, params.objective)
    truth = region_truth(timeline, gt, labels)
    coef, intercept = fit_calibration(timeline, truth, params.calibration_frames, seed)
    durations = learn_durations(timeline, truth, params.min_duration_quantile, params.max_duration_factor)
    _, penalty, path, region_policies, intercept, weight = phase_regions(timeline, objective, params, coef, intercept,
                                                                         region_log_prior(truth), durations)
    label_policies = phase_labels(timeline, objective, params, path, gt, labels, rates,
                                  region_emissions(timeline, coef, intercept), truth)
    for state, region in enumerate(REGIONS):
        region_policies[region].variants = learn_variants(timeline, path, gt, state, params.region_variants,
                                                          params.variant_reach)
    engine = Engine(coef, intercept, penalty, params.region_cuts, params.top_k,
                    {label: {**region_policies, **label_policies}[label] for label in LABELS}, centres, durations,
                    temperatures)
    best = _fit_region_gates(timeline, engine, path, objective, params)
    if params.head_candidates > 0:
        _fit_heads(timeline, engine, path, objective, params, gt, best)
    engine.report = {"seconds": round(time.perf_counter() - began, 1), "evaluations": objective.evaluations,
                     "switch_penalty": penalty, "prior_weight": weight, "durations": durations}
    if cross_fitted is not None:
        engine.report["cross_fitted"] = cross_fitted
    return engine


def _read_findings(timeline: Timeline, gt: dict, params: EngineParams, seed: int) -> tuple:
    """(the timeline the fit reads, the centres (`recentre`), `label_truth`, the temperatures
    (`finding_calibration`)): findings re-centred per video, then read through temperatures."""
    centres = None
    if params.recentre and timeline.observed.any():
        centres = [None if label in REGIONS else float(np.median(label_logits(timeline, k)[timeline.observed]))
                   for k, label in enumerate(LABELS)]
        timeline = recentred(timeline, centres)
    labels = label_truth(timeline, gt)
    temperatures = None
    if params.finding_calibration:
        temperatures = fit_temperatures(timeline, labels, params.calibration_frames, seed)
        timeline = calibrated(timeline, temperatures)
    return timeline, centres, labels, temperatures


def beats(value: float, best: float | None) -> bool:
    """Whether a candidate scoring `value` replaces the best so far: only by more than rounding,
    so a tie keeps the first (the first `cut_orders` item, as documented)."""
    return best is None or value > best + 1e-12


def _fit_region_gates(timeline: Timeline, engine: Engine, path: np.ndarray, objective: LabelObjective,
                      params: EngineParams) -> dict:
    """The region gates again, now with the variants and the cut pieces appended, each region's
    pieces in the order (`cut_orders`) that scores best on the tuning videos (ties: the first);
    a region no gate helps is off. Returns each region's summed tuning AP."""
    best: dict = {}
    _, cuts, shadow = label_candidates(timeline, engine, path, appended=False)  # the cuts: decoded runs only
    for order in params.cut_orders:
        candidates = all_region_candidates(timeline, engine, path, cuts, shadow, order)
        for region in REGIONS:
            c = candidates[region]
            gate, value = fit_gate(c.evidence, objective.per_video(region, c.events), objective.silent(region))
            if beats(value, best[region][1] if region in best else None):
                best[region] = (gate, value, order, len(c.evidence))
    for region, (gate, value, order, n_videos) in best.items():
        tuning_ap = round(value / max(n_videos, 1), 4)
        engine.policies[region] = OffPolicy(tuning_ap=tuning_ap) if gate == float("inf") else \
            replace(engine.policies[region], gate=gate, cut_order=order, tuning_ap=tuning_ap)
    return {region: value for region, (_, value, _, _) in best.items()}


def _fit_heads(timeline: Timeline, engine: Engine, path: np.ndarray, objective: LabelObjective, params: EngineParams,
               gt: dict, best: dict) -> None:
    """The mouth and the esophagus from the head posterior (`vce.post.head`) where, at one of
    `head_temperatures`, it beats their summed tuning AP `best` (ties keep the run)."""
    scores = region_emissions(timeline, engine.coef, engine.intercept)
    priors = [length_prior(head_lengths(gt, timeline.video_ids, region), params.head_width, params.head_bandwidth)
              for region in HEAD_REGIONS]
    for temperature in params.head_temperatures:
        heads = head_candidates(timeline, path, scores, priors, temperature, params.head_candidates)
        for region, c in heads.items():
            gate, value = fit_gate(c.evidence, objective.per_video(region, c.events), objective.silent(region))
            if gate != float("inf") and value > best[region] + 1e-12:
                best[region] = value
                engine.policies[region] = HeadPolicy(
                    gate=gate, temperature=float(temperature), candidates=params.head_candidates,
                    length_priors=[p.tolist() for p in priors], tuning_ap=round(value / max(len(c.evidence), 1), 4))


def cross_fit(timeline: Timeline, gt: dict, params: EngineParams, seed: int = 0, rates: dict | None = None) -> dict | None:
    """Official mAP@0.5/@0.95 over the tuning videos, each half (alternate videos) scored by the
    engine fitted on the other half, and the empty submission's mAP there (the same at both
    thresholds); None with fewer than 2 videos."""
    from vce.eval.score import score

    n_videos = len(timeline.video_ids)
    if n_videos < 2:
        return None
    halves = [np.arange(0, n_videos, 2), np.arange(1, n_videos, 2)]
    by_id = {str(video["video_id"]): video for video in gt["videos"]}
    inner = params.replace(cross_fit=False)
    videos = []
    for fit_on, score_on in (halves, halves[::-1]):
        fit_timeline = timeline_of_videos(timeline, fit_on)
        fit_gt = {"videos": [by_id[v] for v in fit_timeline.video_ids if v in by_id]}
        engine = fit_engine(fit_timeline, fit_gt, inner, seed, rates)
        videos += engine_submission_on(timeline_of_videos(timeline, score_on), engine)[0]["videos"]
    truth = {"videos": [by_id[v["video_id"]] for v in videos if v["video_id"] in by_id]}
    result = score(truth, {"videos": videos})
    empty = score(truth, {"videos": [{"video_id": v["video_id"], "events": []} for v in videos]})
    return {"map@0.5": round(result["map@0.5"], 4), "map@0.95": round(result["map@0.95"], 4),
            "empty": round(empty["map@0.5"], 4)}


def timeline_of_videos(timeline: Timeline, videos) -> Timeline:
    """The timeline of some of its videos (indices, in that order), separators kept."""
    cap = int(timeline.video_first[0]) if len(timeline.video_first) else 1
    size = len(timeline.observed)
    ends = np.append(timeline.video_first[1:] - cap, size - cap)
    pieces = [np.arange(timeline.video_first[v] - cap, ends[v]) for v in videos] + [np.arange(size - cap, size)]
    idx = np.concatenate(pieces)
    lengths = np.array([len(p) for p in pieces[:-1]], np.int64)
    observed = timeline.observed[idx]
    return Timeline([timeline.video_ids[v] for v in videos], np.cumsum(lengths) - lengths + cap, timeline.time[idx],
                    observed, timeline.probs[:, idx], np.concatenate([[0], np.cumsum(observed, dtype=np.int64)]),
                    timeline.max_reach)
