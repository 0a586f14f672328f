"""The score engine: decode what the official metric rewards, label by label, learned on held-out videos.

The metric (REFERENCE.md "The official metric") scores every (video, label) on its own and
ranks a label's events by file order, so the submission is built label by label and the tuning
decomposes the same way (one label's events never change another label's AP):

1. **Regions** (mouth → colon) are one monotone path per video (`vce.post.anatomy.monotone_path`)
   on *calibrated* emissions: a multinomial logistic regression from the five region logits to
   the true region, fitted on up to `calibration_frames` / 5 tuning frames of each region (a
   region with fewer keeps all of its frames), so the emission is close to log P(region | frame)
   under a uniform prior — the HMM's scaled likelihood. (Class weights that balance the rare
   regions fully lowered `bench.simulate2` by 0.005 at @0.5 and moved `bench.simulate` by
   under 0.001, so they are not used. Fitted on
   frames sampled uniformly, the regression's prior — mouth and esophagus hold ~0.03 % of the
   frames each — was counted again at every frame: on `bench.simulate2`'s tuning half the path
   held an esophagus in 8 of the 36 videos that have one; 26 with the equal-share fit.) A
   weight w on the log region prior (its share of the tuning frames) is added per frame: w < 0
   is a stay bonus for short regions. w and the switch penalty are picked on the tuning videos'
   region APs (`phase_regions`). A duration prior (each region at least a quantile, at most a
   multiple, of its training run lengths: `learn_durations`) is available and off by default
   (it lowered both simulations).
2. A region's submission events, in rank order: its merged run; then learned variants of it
   (`learn_variants`: spans placed relative to the run's start and end where the tuning ground
   truth's fragments sit, e.g. the run minus a landmark's frames at its end); then the run cut
   at the start and end of every other label's emitted events (the official ground truth is cut
   wherever the set of active labels changes: `make_json`); then (`shadow_cuts`) cut also at
   the best runs of the labels left silent; the pieces of each cut longest or shortest first,
   whichever scores better for the region on the tuning videos (`cut_orders`: the piece
   between two close cuts, e.g. a finding's own frames, matches to the frame when that
   finding's event is decoded to the frame). Candidates appended after a present
   label's first events can only add to its AP (a later false positive adds a zero term; a
   later match adds precision × recall step) — `tests/test_engine.py` holds the scorer to that.
   The mouth and the esophagus, the shortest regions, may come instead from the **head**
   (`vce.post.head`): both ends placed at once over a video's first positions, from the
   calibrated emissions (tempered) and length priors learned from the tuning ground truth,
   every end ranked by its posterior probability, gated on the region's probability of being
   there at all; a region takes it only where it beats the decoded run's candidates on the
   tuning videos (`head_candidates`, `head_temperatures`).
3. **Findings and landmarks**: per label, the best of `off` (never emitted: AP 1 wherever
   absent), thresholded (with hysteresis: a run starts at the threshold and lasts while
   above a lower one, `hysteresis_runs`), median-filtered runs over a small grid, and
   (`ar_runs`) the runs of an autoregressive HMM fitted on the tuning frames
   (`vce.post.arhmm`: a step in AR(1) logit noise, placed to the frame where a threshold on the
   level is not, with run and gap lengths drawn from phases fitted to the tuning ground truth);
   thresholded runs ranked by mean probability, decoded ones by their strength
   (`ar_run_strength`) and followed by the runs of the decoder's posterior at `ar_levels` that its
   path did not decode (`ar_posterior_runs`: where the video emits the label; the choice, the gate
   and the region cuts read the decoded runs alone), at most `top_k` per video, optionally only inside the decoded regions that
   hold the finding in the tuning ground truth (`learn_compatibility`); landmarks may also be
   `anchored`: events at offsets and lengths from the decoded boundary they mark, learned from
   the tuning ground truth and chosen only if they win when learned on the other half of the
   tuning videos (`phase_labels`). A finding must beat silence by `min_gain_sqrt_videos` x
   sqrt(V) summed AP over the V tuning videos to be emitted at all: the summed gain's noise grows
   as sqrt(V), so the bar is a significance bar (a summed bar of 1.0 switched every finding off
   on a 2-video demo; one of 0.025 x V let two demo validation videos emit a finding on a gain
   of 0.08 AP in one of them).
4. **Presence per (video, label)**: a label is emitted in a video only when the video's evidence
   (its decoded run length for a region, its strongest event's mean probability otherwise)
   reaches a gate fitted on the tuning videos to maximise the label's summed AP, knowing that
   an absent label left silent scores 1 and a present one 0 (`fit_gate`).

The presence gate's evidence may be picked per label among several video-level features
(`presence_features`, `PRESENCE_FEATURES`) or be `joint`: a logistic model over all of them at
once (`fit_presence_model`: weighted by what the decision is worth in each tuning video, its
gate fitted on cross-fitted scores). Findings are re-centred per video (`recentre`: device
drift) and may be read through a temperature and offset per label fitted on the tuning frames
(`finding_calibration`, `fit_temperatures`), so one grid of run thresholds suits every label.

`fit_engine` learns everything from the tuning videos' probabilities and ground truth only
(`cross_fit`: its report adds the mAP of each half of them under the engine fitted on the other half);
`engine_submission` applies it to other videos and returns the metric-optimal submission and
the clinical event list (one event per run, no appended candidates).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Annotated, Literal

import numpy as np
import pandas as pd
from pydantic import Field

from vce.core.errors import DataError
from vce.core.labels import LABEL_INDEX, LABELS, LANDMARKS, NUM_LABELS, REGIONS
from vce.core.params import OddInt, Section
from vce.eval.score import THRESHOLDS, average_precisions, group_average_precisions
from vce.post.anatomy import EMISSION_FLOOR, REGION_ROWS, boundaries, decode_regions
from vce.post.anatomy import clipped_logits as _logits
from vce.post.arhmm import ar_posterior_runs, ar_run_strength, ar_runs, fit_ar_model
from vce.post.events import Timeline, build_timeline, smooth_runs
from vce.post.head import HEAD_REGIONS, head_lengths, head_spans, length_prior

REGION_SET = set(REGIONS)


# Video-level evidence a finding's presence gate may use (`run_candidates`; -inf without a run):
# the strongest run's mean probability, the mean of the 3 strongest, the frames and the number
# of runs, the video's highest frame probability, and the region context: the mean, over the
# run frames, of the share of the label's training frames that lie in the decoded region the
# run sits in (`region_shares`).
PRESENCE_FEATURES = ("max", "top3", "frames", "count", "peak", "region")
# ... or `joint`: a logistic model over all of them (`fit_presence_model`).
GATE_FEATURES = PRESENCE_FEATURES + ("joint",)


class EngineParams(Section):
    """`thresholds.engine`: what the score engine searches (its fitted values go to thresholds.json)."""

    switch_penalties: list[Annotated[float, Field(ge=0)]] = Field(min_length=1)  # region path: switch penalties tried (log-probability units)
    prior_weights: list[float] = Field(min_length=1)  # region path: weights w tried on the log region prior added per frame (0: HMM emission; < 0: a stay bonus for short regions)
    min_duration_quantile: float = Field(ge=0, le=1)  # region path: a region lasts at least this quantile of its training run lengths (0: no minimum)
    max_duration_factor: float = Field(ge=0)  # region path: ... and at most this times its longest training run (0: no maximum)
    region_variants: int = Field(ge=0)  # region candidates: learned (start, end) moves appended after the run
    variant_reach: int = Field(ge=0)  # region candidates: learn from fragments within this many frames of a run end
    region_cuts: bool  # region candidates: also the run cut at other labels' event boundaries
    shadow_cuts: bool  # region candidates: then also cut at the best runs of labels left silent
    cut_orders: list[Literal["longest", "shortest"]] = Field(min_length=1)  # region candidates: cut pieces ranked longest or shortest first, picked per region (ties: the first)
    head_candidates: int = Field(ge=0)  # mouth, esophagus: ranked ends from the head posterior (vce/post/head.py), where they beat the run's candidates (0: never)
    head_width: int = Field(ge=1)  # head: the first positions of a video the mouth and esophagus are placed in
    head_bandwidth: float = Field(gt=0)  # head: the log-length bandwidth of the length priors learned from the tuning ground truth
    head_temperatures: list[Annotated[float, Field(gt=0)]] = Field(min_length=1)  # head: temperatures on the summed frame evidence tried (picked per region)
    thresholds: list[Annotated[float, Field(ge=0, le=1)]] = Field(min_length=1)  # findings/landmarks: run thresholds tried
    median_windows: list[OddInt] = Field(min_length=1)  # findings/landmarks: median windows tried (odd)
    min_lengths: list[Annotated[int, Field(ge=1)]] = Field(min_length=1)  # findings/landmarks: minimum run lengths tried
    hysteresis: list[Annotated[float, Field(gt=0, le=1)]] = Field(min_length=1)  # findings/landmarks: low/high threshold ratios tried (1: no hysteresis)
    ar_runs: bool  # findings/landmarks: also try the runs an autoregressive HMM decodes (vce/post/arhmm.py)
    ar_biases: list[float] = Field(min_length=1)  # ar_runs: log-odds added to every exit rate of its length phases (0: as learned)
    ar_off_phases: int = Field(ge=1)  # ar_runs: geometric length phases fitted to the tuning ground truth's gaps (1: one switch rate)
    ar_on_phases: int = Field(ge=1)  # ar_runs: ... and to its runs
    ar_levels: list[Annotated[float, Field(gt=0, lt=1)]]  # ar_runs: posterior levels whose runs follow the decoded ones ([]: none)
    ar_min_separation: float = Field(ge=0)  # ar_runs: only labels whose fitted step is at least this many innovation standard deviations
    compatibility: bool  # findings: emitted only inside decoded regions where the training GT holds them
    compatibility_min_share: float = Field(ge=0, lt=1)  # compatibility: a region must hold more than this share of the finding's GT frames
    top_k: int = Field(ge=1)  # findings/landmarks: at most this many events per (video, label)
    presence_features: list[Literal[GATE_FEATURES]] = Field(min_length=1)  # findings/landmarks: video-level evidence the presence gate may use (picked per label; joint: a logistic model over all six)
    anchor_candidates: int = Field(ge=0)  # landmarks: events per boundary from learned offsets (0: never anchored)
    min_gain_sqrt_videos: float = Field(ge=0)  # a finding/landmark is emitted only if it beats silence by this x sqrt(tuning videos) summed AP
    recentre: bool  # findings/landmarks: logits re-centred per video on their median (device drift)
    finding_calibration: bool  # findings/landmarks: a temperature and offset per label fitted on the tuning frames, equal positive and negative shares
    objective: Literal["mean", "map@0.5", "map@0.95"]  # what the tuning maximises
    calibration_frames: int = Field(ge=100)  # frames sampled to fit the calibrations (the region path's: stratified by region; finding_calibration's: half positive, half negative)
    cross_fit: bool  # report: also fit on each half of the tuning videos and score the other half (doubles the time)


# What a thresholded-run policy holds (`phase_labels`), checked when an engine is read.
RUNS_KEYS = ("detector", "threshold", "ratio", "median_window", "min_length", "regions", "shares", "gate", "evidence")
# ... and what decodes its runs: `threshold` (hysteresis_runs) or `ar` (vce.post.arhmm, with these).
AR_KEYS = ("ar_model", "ar_bias", "ar_levels")
AR_MODEL_KEYS = ("a", "b", "g", "rho", "sigma", "p01", "p10", "off_phases", "on_phases")  # its `ar_model`
SPEC_KEYS = ("detector", "threshold", "ratio", "median_window", "min_length", "regions")  # a shadow run spec
REGION_KEYS = ("gate", "variants", "cut_order")  # what a region policy holds
HEAD_KEYS = ("gate", "temperature", "candidates", "length_priors")  # ... and a head policy (vce.post.head)


@dataclass
class Engine:
    """The fitted decoder: region calibration and penalty, one policy per label (JSON via `to_dict`)."""

    coef: list  # (5, 5) multinomial logistic regression weights on the region logits
    intercept: list  # (5,)
    switch_penalty: float
    region_cuts: bool
    top_k: int
    policies: dict = field(default_factory=dict)  # label -> {"kind": off|region|head|runs|anchored, knobs, "gate"}
    centres: list | None = None  # per label: the tuning videos' median logit (recentre), None for regions / off
    durations: list | None = None  # [min (5,), max (5,)] region run lengths in frames (the duration prior), None: any
    temperatures: list | None = None  # per label: [slope, offset] on the logit (finding_calibration), None: as it is
    report: dict = field(default_factory=dict)

    KEYS = ("coef", "intercept", "switch_penalty", "region_cuts", "top_k", "policies", "centres", "durations",
            "temperatures")

    def to_dict(self) -> dict:
        return {key: getattr(self, key) for key in self.KEYS}

    @classmethod
    def from_dict(cls, data: dict, where: str = "engine") -> Engine:
        try:
            engine = cls(**{key: data[key] for key in cls.KEYS})
        except (KeyError, TypeError) as err:
            raise DataError(f"{where}: not a fitted score engine ({err})") from None
        missing = [label for label in LABELS if label not in engine.policies]
        if missing:
            raise DataError(f"{where}: no policy for label(s) {missing}")
        for label, policy in engine.policies.items():
            specs = []
            if policy.get("kind") == "runs":
                specs.append((policy, RUNS_KEYS + (("presence_model",) if policy.get("evidence") == "joint" else ())))
            if "shadow" in policy:
                specs.append((policy["shadow"], SPEC_KEYS))
            if policy.get("kind") == "region":
                specs.append((policy, REGION_KEYS))
            if policy.get("kind") == "head":
                specs.append((policy, HEAD_KEYS))
            for spec, needed in specs:
                needed += AR_KEYS if spec.get("detector") == "ar" else ()
                lacking = [key for key in needed if key not in spec]
                if spec.get("detector") == "ar" and isinstance(spec.get("ar_model"), dict):
                    lacking += [f"ar_model.{key}" for key in AR_MODEL_KEYS if key not in spec["ar_model"]]
                if lacking:
                    raise DataError(f"{where}: the {label!r} policy lacks {lacking}: fitted by an older version, "
                                    "rerun the thresholds stage")
        return engine


# ----------------------------------------------------------------------------- regions


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


def _logistic(x: np.ndarray, y: np.ndarray, sample_weight: np.ndarray | None = None, one_thread: bool = True,
              **options):
    """sklearn's LogisticRegression fitted on one BLAS thread (problems of a few features: more
    threads only contend on a shared machine). `one_thread` False: no thread limit, whose set-up
    costs more than a fit on a few dozen rows (the presence model)."""
    from sklearn.linear_model import LogisticRegression
    from threadpoolctl import threadpool_limits

    if not one_thread:
        return LogisticRegression(**options).fit(x, y, sample_weight=sample_weight)
    with threadpool_limits(1):
        return LogisticRegression(**options).fit(x, y, sample_weight=sample_weight)


def fit_calibration(timeline: Timeline, truth: np.ndarray, n_frames: int, seed: int = 0) -> tuple[list, list]:
    """Multinomial logistic regression region logits → true region on up to `n_frames` frames."""
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
    model = _logistic(_logits(timeline.probs[REGION_ROWS][:, known].T), truth[known], max_iter=300)
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
        timeline.prob_cums["region_logits"] = _logits(timeline.probs[REGION_ROWS].T)
    z = timeline.prob_cums["region_logits"] @ np.asarray(coef).T + np.asarray(intercept)
    z -= z.max(axis=1, keepdims=True)
    scores = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    scores[~timeline.observed] = 0.0
    return scores


# Fewer positive (or negative) tuning frames than this: a label keeps its probabilities as they are.
MIN_CALIBRATION_FRAMES = 20


def fit_temperatures(timeline: Timeline, labels: np.ndarray, n_frames: int, seed: int = 0) -> list:
    """Per finding / landmark, [a, b] of p' = sigmoid(a logit(p) + b): a logistic regression of the
    label on its own logit over up to n_frames / 2 positive and n_frames / 2 negative tuning
    frames (`labels`: `label_truth`). Equal shares make p' the posterior under an even prior, so
    a run threshold means the same likelihood ratio for every label, whatever its temperature
    and offset (a model that reads one finding overconfident and another timid gets the same
    grid of thresholds for both). None for regions (their calibration is the region path's), for
    a label with fewer than `MIN_CALIBRATION_FRAMES` frames on either side, and where the fitted
    slope is not positive (the scores rank the wrong way on the tuning videos: kept as they are)."""
    rng = np.random.default_rng(seed)
    out: list = []
    for k, label in enumerate(LABELS):
        sides = [np.flatnonzero(labels[k] == value) for value in (0, 1)]
        if label in REGION_SET or min(len(side) for side in sides) < MIN_CALIBRATION_FRAMES:
            out.append(None)
            continue
        negatives, positives = (side if len(side) <= n_frames // 2 else rng.choice(side, n_frames // 2, replace=False)
                                for side in sides)
        rows = np.concatenate([negatives, positives])
        target = np.repeat([0, 1], [len(negatives), len(positives)])
        # "balanced": each side weighs half whatever its sample size, the even prior.
        model = _logistic(_logits(timeline.probs[k, rows])[:, None], target, C=100.0, max_iter=200,
                          class_weight="balanced")
        slope, offset = float(model.coef_[0, 0]), float(model.intercept_[0])
        out.append([slope, offset] if slope > 0 else None)
    return out


def calibrated(timeline: Timeline, temperatures: list) -> Timeline:
    """A copy of `timeline` with each label that has a temperature read through it (`fit_temperatures`)."""
    probs = timeline.probs.copy()
    for k, fitted in enumerate(temperatures):
        if fitted is not None:
            z = fitted[0] * _logits(probs[k]) + fitted[1]
            probs[k] = np.where(timeline.observed, 1 / (1 + np.exp(-z)), np.nan)
    return timeline.with_probs(probs)


def learn_durations(timeline: Timeline, truth: np.ndarray, quantile: float, factor: float) -> list | None:
    """The duration prior [min (5,), max (5,)] in frames: per region, the `quantile` of its
    ground-truth run lengths (merged runs, per video) and `factor` times the longest (0: none).
    A region without training runs is not constrained."""
    if quantile == 0 and factor == 0:
        return None
    low, high = [1] * len(REGIONS), [0] * len(REGIONS)
    for state in range(len(REGIONS)):
        starts, ends = _runs_of_path(truth, state)
        if len(starts) == 0:
            continue
        # Runs of one video broken only by unlabelled frames count as one run.
        video = _video_of(timeline, starts)
        first = np.flatnonzero(np.diff(video, prepend=-1) != 0)
        lengths = np.maximum.reduceat(ends, first) - starts[first] + 1
        low[state] = max(int(np.floor(np.quantile(lengths, quantile))), 1) if quantile > 0 else 1
        high[state] = int(np.ceil(factor * lengths.max())) if factor > 0 else 0
    return [low, [h if h > 0 else int(len(truth)) + 1 for h in high]]


def decode(timeline: Timeline, scores: np.ndarray, penalty: float, durations: list | None) -> np.ndarray:
    """The region path (`decode_regions`) under the duration prior `durations` (None: any length)."""
    low, high = (None, None) if durations is None else durations
    return decode_regions(timeline, scores, float(penalty), low, high)


def select_videos(timeline: Timeline, videos) -> Timeline:
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


def _runs_of_path(path: np.ndarray, state: int) -> tuple[np.ndarray, np.ndarray]:
    mask = (path == state).view(np.int8)
    edges = np.diff(mask, prepend=np.int8(0), append=np.int8(0))
    return np.flatnonzero(edges == 1), np.flatnonzero(edges == -1) - 1


def recentred(timeline: Timeline, centres: list) -> Timeline:
    """A copy of `timeline` whose labels with a centre have their logits moved, per video, so that
    the video's median logit is that centre: a capsule (or a video) that reads every frame a
    little more "blood" than another no longer fires everywhere (findings are rare, so a
    video's median frame is a negative one)."""
    probs = timeline.probs.copy()
    bounds = np.append(timeline.video_first, probs.shape[1])
    for k, centre in enumerate(centres):
        if centre is None:
            continue
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            seen = timeline.observed[lo:hi]
            if seen.any():
                z = _logits(probs[k, lo:hi])
                z += centre - np.median(z[seen])
                probs[k, lo:hi] = np.where(seen, 1 / (1 + np.exp(-z)), np.nan)
    return timeline.with_probs(probs)


# ----------------------------------------------------------------------------- candidates per label


def _video_of(timeline: Timeline, positions: np.ndarray) -> np.ndarray:
    return np.searchsorted(timeline.video_first, positions, side="right") - 1


def _mean_probs(timeline: Timeline, k: int, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    if k not in timeline.prob_cums:
        probs = np.nan_to_num(timeline.probs[k], nan=0.0)
        timeline.prob_cums[k] = np.concatenate([[0.0], np.cumsum(probs, dtype=np.float64)])
    cum = timeline.prob_cums[k]
    frames = timeline.observed_cum[ends + 1] - timeline.observed_cum[starts]
    return (cum[ends + 1] - cum[starts]) / np.maximum(frames, 1)


@dataclass
class Candidates:
    """One label's ranked events per video (time units), and the video's evidence for the gate."""

    events: list  # per video: list of (start, end) in rank order (the submission)
    clinical: list  # per video: the clean list, one event per run (for people and the report)
    evidence: np.ndarray  # (V,) the gate feature; -inf where the label has no event
    features: dict = field(default_factory=dict)  # run labels: every video-level feature (`PRESENCE_FEATURES`)


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
    confidence = _mean_probs(timeline, k, starts, ends)
    rank_by = confidence if strength is None else strength[keep]
    video = _video_of(timeline, starts)
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
    spans = list(zip(timeline.time[starts[kept]].tolist(), timeline.time[ends[kept]].tolist()))
    events = clinical = [spans[bounds[v]:bounds[v + 1]] for v in range(n_videos)]
    if alternatives is not None:
        events = _appended(timeline, clinical, alternatives, min_length, top_k, path, regions)
    has = np.isfinite(evidence)
    count = np.bincount(video, minlength=n_videos).astype(float)
    top = rank < 3
    top3 = np.bincount(video[top], confidence[order][top], minlength=n_videos) / np.maximum(np.minimum(count, 3), 1)
    lengths = (ends - starts + 1)[order].astype(float)
    frames = np.bincount(video, lengths, minlength=n_videos)
    # The region a run sits in: its middle frame's state on the path (-1, no region: share 0).
    share = np.ones(len(order))
    if shares is not None and path is not None:
        state = path[(starts + ends)[order] // 2]
        share = np.where(state >= 0, np.asarray(shares)[np.maximum(state, 0)], 0.0)
    region = np.bincount(video, lengths * share, minlength=n_videos) / np.maximum(frames, 1)
    features = {"max": evidence, "top3": np.where(has, top3, -np.inf), "frames": np.where(has, frames, -np.inf),
                "count": np.where(has, count, -np.inf), "peak": np.where(has, _video_peaks(timeline, k), -np.inf),
                "region": np.where(has, region, -np.inf)}
    return Candidates(events, clinical, evidence, features)


def _appended(timeline: Timeline, events: list, alternatives: tuple, min_length: int, top_k: int,
              path: np.ndarray | None, regions: list | None) -> list:
    """Per video, `events` then the `alternatives` (starts, ends, strength) runs there (at least
    `min_length` frames, `compatible`), strongest first, while the video holds under `top_k`."""
    starts, ends, strength = alternatives
    keep = (ends - starts + 1 >= min_length) & compatible(starts, ends, path, regions)
    starts, ends, strength = starts[keep], ends[keep], strength[keep]
    video = _video_of(timeline, starts)
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


def _pieces(start: int, end: int, times, order: str = "longest") -> list:
    """[start, end] cut at the sorted `times` inside it, longest (`order`: or shortest) first,
    equal lengths in time order; [] when nothing cuts it."""
    inner = [c for c in times if start < c <= end]
    edges = [start, *inner, end + 1]
    pieces = [(a, b - 1) for a, b in zip(edges[:-1], edges[1:]) if b - 1 >= a]
    sign = 1 if order == "shortest" else -1
    return sorted(pieces, key=lambda p: sign * (p[1] - p[0])) if len(pieces) > 1 else []


def region_candidates(timeline: Timeline, path: np.ndarray, state: int, variants: list, cuts: dict | None,
                      shadow: dict | None = None, order: str = "longest") -> Candidates:
    """Region `state`'s decoded run per video, then the spans each of `variants` places on it
    ((mode, a, b) in rank order, `learn_variants`), then its cut pieces, then (`shadow`) its
    pieces cut at those and at the shadow times too. The clinical event is the run itself.

    `cuts`: per video, sorted event times where another label's event starts or ends + 1;
    `shadow`: the same for runs of labels that are not emitted (`shadow_cuts`);
    `order`: the pieces of each, longest or shortest first (`cut_order`).
    """
    starts, ends = _runs_of_path(path, state)
    n_videos = len(timeline.video_ids)
    events: list = [[] for _ in range(n_videos)]
    clinical: list = [[] for _ in range(n_videos)]
    evidence = np.full(n_videos, -np.inf)
    for v, s, e in zip(_video_of(timeline, starts).tolist(), starts.tolist(), ends.tolist()):
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
            times = sorted(set(shadow[v]) | set((cuts or {}).get(v, [])))
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
    for v, c in zip(_video_of(timeline, crossings).tolist(), crossings.tolist()):
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


def learn_anchors(timeline: Timeline, path: np.ndarray, gt: dict, landmark: str, n: int) -> list:
    """Up to `n` (offset, length) from the decoded boundary that `landmark` marks, matching its
    ground-truth events in the most tuning videos (`_greedy_cover`)."""
    if n == 0:
        return []
    crossings = boundaries(path, REGIONS.index(LANDMARKS[landmark][1]))
    crossing_of = {}
    for v, c in zip(_video_of(timeline, crossings).tolist(), crossings.tolist()):
        crossing_of.setdefault(timeline.video_ids[v], int(timeline.time[c]))
    rows = []  # (boundary, event start, event end)
    for video in gt["videos"]:
        at = crossing_of.get(str(video["video_id"]))
        if at is not None:
            rows += [(at, e["start"], e["end"]) for e in video["events"] if landmark in e["label"]]
    if not rows:
        return []
    table = np.array(rows, np.int64)
    options = np.unique(np.stack([table[:, 1] - table[:, 0], table[:, 2] - table[:, 1] + 1], axis=1), axis=0)
    return _greedy_cover(options, lambda o: (table[:, 0] + o[0], table[:, 0] + o[0] + o[1] - 1), table[:, 1:], n)


def _greedy_cover(options: np.ndarray, predict, truth: np.ndarray, n: int, given=None) -> list:
    """Up to `n` options, each the one whose prediction matches (tIoU >= 0.5 and >= 0.95, both
    counted) the most ground-truth spans not matched yet (two at least at one threshold), after the spans
    that the `given` option (ranked before them all) matches."""
    unmatched = {t: np.ones(len(truth), bool) for t in THRESHOLDS}

    def hits_of(option):
        a, b = predict(option)  # (F,) predicted span per ground-truth span
        inter = np.maximum(0, np.minimum(b, truth[:, 1]) - np.maximum(a, truth[:, 0]) + 1)
        iou = inter / np.maximum((b - a + 1) + (truth[:, 1] - truth[:, 0] + 1) - inter, 1)
        return {t: (iou >= t) & unmatched[t] for t in THRESHOLDS}

    if given is not None:
        for t, hits in hits_of(given).items():
            unmatched[t] &= ~hits
    chosen, options = [], [tuple(o) for o in options if given is None or tuple(o) != tuple(given)]
    while len(chosen) < n and options:
        best, best_value, best_hits = None, 0, None
        for option in options:
            hits = hits_of(option)
            value = sum(int(h.sum()) for h in hits.values())
            if value > best_value and max(int(h.sum()) for h in hits.values()) >= 2:
                best, best_value, best_hits = option, value, hits
        if best is None:
            break
        chosen.append([int(x) for x in best])
        options.remove(best)
        for t in THRESHOLDS:
            unmatched[t] &= ~best_hits[t]
    return chosen


# How a region variant (mode, a, b) places its span on a decoded run [s, e].
RUN, FROM_START, FROM_END = 0, 1, 2  # [s + a, e + b]; [s + a, s + b]; [e + a, e + b]


def place_variant(mode, a, b, start, end):
    """The span variant (mode, a, b) gives on the run [start, end] (numbers or arrays)."""
    if mode == RUN:
        return start + a, end + b
    base = start if mode == FROM_START else end
    return base + a, base + b


def learn_variants(timeline: Timeline, path: np.ndarray, gt: dict, state: int, n: int, reach: int) -> list:
    """Up to `n` variants (mode, a, b) of a decoded region run (`place_variant`), ranked by how
    many of its ground-truth fragments the run itself does not match they match in the tuning
    videos (`_greedy_cover`; the run is always ranked first: it is the likeliest fragment, and
    appended candidates cannot lower a present label's AP). The ground truth cuts a region wherever another
    label starts or ends, so its fragments sit at the run's ends (a landmark's frames, a moved
    boundary): options come from fragments within `reach` frames of a run end (RUN), or wholly
    within `reach` of its start (FROM_START) or of its end (FROM_END)."""
    if n == 0:
        return []
    region = REGIONS[state]
    starts, ends = _runs_of_path(path, state)
    run_of = {timeline.video_ids[v]: (int(timeline.time[s]), int(timeline.time[e]))
              for v, s, e in zip(_video_of(timeline, starts).tolist(), starts.tolist(), ends.tolist())}
    rows = []  # (run start, run end, fragment start, fragment end)
    for video in gt["videos"]:
        run = run_of.get(str(video["video_id"]))
        if run is not None:
            rows += [(*run, e["start"], e["end"]) for e in video["events"] if region in e["label"]]
    if not rows:
        return []
    s, e, fs, fe = np.array(rows, np.int64).T
    by_mode = [
        (RUN, fs - s, fe - e, (np.abs(fs - s) <= reach) | (np.abs(fe - e) <= reach)),
        (FROM_START, fs - s, fe - s, np.abs(fe - s) <= reach),
        (FROM_END, fs - e, fe - e, np.abs(fs - e) <= reach),
    ]
    options = np.unique(np.vstack([np.stack([np.full(near.sum(), mode), a[near], b[near]], axis=1)
                                   for mode, a, b, near in by_mode]), axis=0)
    return _greedy_cover(options, lambda o: place_variant(o[0], o[1], o[2], s, e), np.stack([fs, fe], axis=1), n,
                         given=(RUN, 0, 0))


# ----------------------------------------------------------------------------- scoring one label


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
        by_id = {str(video["video_id"]): video for video in gt["videos"]}
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

    def per_video(self, label: str, events: list) -> np.ndarray:
        """(V,) objective AP of `label` per tuning video when every video emits its `events`."""
        self.evaluations += 1
        pred = _span_arrays([events[v] for v in self.scored_index])
        truth = self.gt_arrays[label]
        aps = None if pred is None or truth is None else group_average_precisions(truth, pred, len(self.scored_index))
        if aps is None:  # spans the fast path cannot take (end < start, huge frames): the scorer's own checks
            _, by_label = average_precisions(self.gt[label], _label_submission(self.video_ids, label, events))
            aps = {t: by_label[t][:, LABEL_INDEX[label]] for t in THRESHOLDS}
        out = np.zeros(len(self.video_ids))
        out[self.scored] = sum(self.weights[t] * aps[t] for t in THRESHOLDS)
        return out

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
        out[has, j] = np.log1p(x) if name in ("frames", "count") else x if name == "region" else _logits(x)
    return out


def _fit_weighted_logistic(x: np.ndarray, gain: np.ndarray) -> dict:
    mean, scale = x.mean(axis=0), np.maximum(x.std(axis=0), 1e-6)
    # Newton-Cholesky, not lbfgs under a thread limit: on these few dozen videos and 6 features
    # the fit's overheads were its cost (about 4.4 ms a fit against 1.8 ms, and the engine
    # fits this model some 1,600 times on `bench.simulate2`'s tuning half).
    model = _logistic((x - mean) / scale, gain > 0, sample_weight=np.abs(gain), one_thread=False,
                      solver="newton-cholesky", max_iter=200)
    return {"mean": mean.tolist(), "scale": scale.tolist(), "coef": model.coef_[0].tolist(),
            "intercept": float(model.intercept_[0])}


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


def gate_evidence(features: dict, policy: dict) -> np.ndarray:
    """(V,) the evidence a thresholded-run policy's gate reads: one feature, or the presence model's score."""
    if policy["evidence"] == "joint":
        return presence_score(presence_inputs(features), policy["presence_model"])
    return features[policy["evidence"]]


def gated(candidates: Candidates, gate: float | None) -> Candidates:
    """Only the videos whose evidence passes the gate (None: every video with evidence)."""
    keep = np.isfinite(candidates.evidence) & (True if gate is None else candidates.evidence >= gate)
    return Candidates([e if k else [] for e, k in zip(candidates.events, keep)],
                      [c if k else [] for c, k in zip(candidates.clinical, keep)], candidates.evidence)


# ----------------------------------------------------------------------------- fitting (phases)


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
        policies[region] = {"kind": "region", "gate": gate}
    return total, float(penalty), path, policies


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
                 labels: np.ndarray, rates: dict | None = None) -> dict:
    """Per finding / landmark: the best of off, decoded runs (the threshold grid; `ar_runs`: the
    autoregressive HMM's too) and, for landmarks, anchors (`labels`: `label_truth`).

    Emitting must beat silence by `min_gain_sqrt_videos` x sqrt(the number of tuning videos)
    summed AP (the summed gain's noise grows as its square root), and, for a label that
    every tuning video holds, weighed against the absent videos its presence rate says it will
    meet (`presence_weighting`, `rates`: `presence_rates` over every labelled video)."""
    policies = {}
    margin = params.min_gain_sqrt_videos * np.sqrt(len(timeline.video_ids))
    for label in LABELS:
        if label in REGION_SET:
            continue
        k = LABEL_INDEX[label]
        silent = objective.silent(label)
        weight, unseen = presence_weighting(objective.present[label], (rates or {}).get(label))
        regions = learn_compatibility(gt, label, params.compatibility_min_share) \
            if params.compatibility and label not in LANDMARKS else None
        shares = region_shares(gt, label)  # the region context of its presence evidence
        best = (weight * float(silent.sum()) + unseen + margin, {"kind": "off"})  # beat silence by the margin
        best_runs = None  # the best runs even if they lose to silence (their cuts: shadow_cuts)
        for spec, runs, strength in _decodings(timeline, k, params, labels[k]):
            for min_length in params.min_lengths:
                candidates = run_candidates(timeline, k, spec["threshold"], spec["median_window"], min_length,
                                            params.top_k, runs, path=path, regions=regions, shares=shares,
                                            strength=strength)
                if not np.isfinite(candidates.evidence).any():
                    continue
                per_video = objective.per_video(label, candidates.events)
                value, gate, extra = _best_gate(candidates.features, per_video, silent, params.presence_features)
                if extra is None:
                    continue
                value *= weight
                runs_policy = {"kind": "runs", **spec, "min_length": int(min_length), "regions": regions,
                               "shares": shares, "gate": gate, **extra}
                if value > best[0] + 1e-12:
                    best = (value, runs_policy)
                if best_runs is None or value > best_runs[0] + 1e-12:
                    best_runs = (value, runs_policy)
        if label in LANDMARKS and params.anchor_candidates > 0:
            value = weight * _cross_fitted_anchors(timeline, objective, path, gt, label, params.anchor_candidates)
            anchors = learn_anchors(timeline, path, gt, label, params.anchor_candidates)
            if anchors and value > best[0] + 1e-12:
                best = (value, {"kind": "anchored", "anchors": anchors, "gate": 0.0})
        value = best[0] - margin if best[1]["kind"] == "off" else best[0]
        policies[label] = {**best[1], "tuning_ap": round(value / max(len(silent), 1), 4)}
        if best[1]["kind"] == "off" and params.shadow_cuts and best_runs is not None:
            keys = SPEC_KEYS + (AR_KEYS if best_runs[1]["detector"] == "ar" else ())
            policies[label]["shadow"] = {key: best_runs[1][key] for key in keys}
    return policies


def _decodings(timeline, k: int, params: EngineParams, truth: np.ndarray):
    """(run spec, (starts, ends), strength or None) of every run decoding tried for label k: the
    threshold grid, then (`ar_runs`) the autoregressive HMM at each switch bias when its model,
    fitted on the tuning frames' `truth`, separates the label by `ar_min_separation` at least
    (its runs ranked by `ar_run_strength`). Its spec carries `ar_levels`, but the choice and
    the gate read the decoded runs alone: the posterior runs are appended where it is emitted
    (`_policy_runs`)."""
    for threshold in params.thresholds:
        for ratio in params.hysteresis:
            for window in params.median_windows:
                spec = {"detector": "threshold", "threshold": float(threshold), "ratio": float(ratio),
                        "median_window": int(window)}
                yield spec, hysteresis_runs(timeline, k, threshold, ratio, window), None
    if not params.ar_runs:
        return
    model = fit_ar_model(_logits(timeline.probs[k]), truth, params.ar_off_phases, params.ar_on_phases)
    if model is None or model["separation"] < params.ar_min_separation:
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
    centres = None
    if params.recentre and timeline.observed.any():
        centres = [None if label in REGION_SET else float(np.median(_logits(timeline.probs[k][timeline.observed])))
                   for k, label in enumerate(LABELS)]
        timeline = recentred(timeline, centres)
    labels = label_truth(timeline, gt)
    temperatures = None
    if params.finding_calibration:
        temperatures = fit_temperatures(timeline, labels, params.calibration_frames, seed)
        timeline = calibrated(timeline, temperatures)
    objective = LabelObjective(timeline, gt, params.objective)
    truth = region_truth(timeline, gt, labels)
    coef, intercept = fit_calibration(timeline, truth, params.calibration_frames, seed)
    durations = learn_durations(timeline, truth, params.min_duration_quantile, params.max_duration_factor)
    _, penalty, path, region_policies, intercept, weight = phase_regions(timeline, objective, params, coef, intercept,
                                                                         region_log_prior(truth), durations)
    label_policies = phase_labels(timeline, objective, params, path, gt, labels, rates)
    for state, region in enumerate(REGIONS):
        region_policies[region]["variants"] = learn_variants(timeline, path, gt, state, params.region_variants,
                                                             params.variant_reach)
    engine = Engine(coef, intercept, penalty, params.region_cuts, params.top_k,
                    {label: {**region_policies, **label_policies}[label] for label in LABELS}, centres, durations,
                    temperatures)
    # The region gates again, now with the variants and cut pieces appended, each region's
    # pieces in the order (`cut_orders`) that scores best on the tuning videos.
    best: dict = {}
    _, cuts, shadow = _label_candidates(timeline, engine, path, appended=False)  # the cuts: decoded runs only
    for order in params.cut_orders:
        candidates = _region_candidates_all(timeline, engine, path, cuts, shadow, order)
        for region in REGIONS:
            c = candidates[region]
            gate, value = fit_gate(c.evidence, objective.per_video(region, c.events), objective.silent(region))
            if region not in best or value > best[region][1] + 1e-12:
                best[region] = (gate, value, order, len(c.evidence))
    for region, (gate, value, order, n_videos) in best.items():
        policy = {"kind": "off"} if gate == float("inf") else {**engine.policies[region], "gate": gate, "cut_order": order}
        engine.policies[region] = {**policy, "tuning_ap": round(value / max(n_videos, 1), 4)}
    # The mouth and the esophagus from the head posterior instead, where it beats those candidates.
    if params.head_candidates > 0:
        scores = region_emissions(timeline, coef, intercept)
        priors = [length_prior(head_lengths(gt, timeline.video_ids, region), params.head_width, params.head_bandwidth)
                  for region in HEAD_REGIONS]
        for temperature in params.head_temperatures:
            heads = head_candidates(timeline, path, scores, priors, temperature, params.head_candidates)
            for region, c in heads.items():
                gate, value = fit_gate(c.evidence, objective.per_video(region, c.events), objective.silent(region))
                if gate != float("inf") and value > best[region][1] + 1e-12:
                    best[region] = (gate, value, None, len(c.evidence))
                    engine.policies[region] = {
                        "kind": "head", "gate": gate, "temperature": float(temperature),
                        "candidates": params.head_candidates, "length_priors": [p.tolist() for p in priors],
                        "tuning_ap": round(value / max(len(c.evidence), 1), 4)}
    engine.report = {"seconds": round(time.perf_counter() - began, 1), "evaluations": objective.evaluations,
                     "switch_penalty": penalty, "prior_weight": weight, "durations": durations}
    if cross_fitted is not None:
        engine.report["cross_fitted"] = cross_fitted
    return engine


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
        fit_timeline = select_videos(timeline, fit_on)
        fit_gt = {"videos": [by_id[v] for v in fit_timeline.video_ids if v in by_id]}
        submission, _ = engine_submission_on(select_videos(timeline, score_on), fit_engine(fit_timeline, fit_gt, inner, seed, rates))
        videos += submission["videos"]
    truth = {"videos": [by_id[v["video_id"]] for v in videos if v["video_id"] in by_id]}
    result = score(truth, {"videos": videos})
    empty = score(truth, {"videos": [{"video_id": v["video_id"], "events": []} for v in videos]})
    return {"map@0.5": round(result["map@0.5"], 4), "map@0.95": round(result["map@0.95"], 4),
            "empty": round(empty["map@0.5"], 4)}


# ----------------------------------------------------------------------------- applying


def _run_specs(engine: Engine):
    """(label, knobs) of every thresholded-run decoding the engine applies: emitted runs and the
    shadow runs of labels left silent (`shadow_cuts`)."""
    for label in LABELS:
        policy = engine.policies[label]
        if policy["kind"] == "runs":
            yield label, policy
        if "shadow" in policy:
            yield label, policy["shadow"]


def _alternatives(timeline: Timeline, k: int, spec: dict) -> tuple | None:
    """The posterior runs an autoregressive spec appends after its decoded runs (None: no levels)."""
    if not spec["ar_levels"]:
        return None
    return ar_posterior_runs(timeline, k, spec["ar_model"], spec["ar_bias"], spec["ar_levels"])


def _policy_runs(timeline: Timeline, label: str, spec: dict, top_k: int, path: np.ndarray,
                 appended: bool = True) -> Candidates:
    """A runs policy's candidates; `appended` False: without the posterior runs (a shadow only cuts)."""
    k = LABEL_INDEX[label]
    runs = strength = alternatives = None
    if spec["detector"] == "ar":
        runs = ar_runs(timeline, k, spec["ar_model"], spec["ar_bias"])
        strength = ar_run_strength(timeline, k, spec["ar_model"], spec["ar_bias"])
        alternatives = _alternatives(timeline, k, spec) if appended else None
    return run_candidates(timeline, k, spec["threshold"], spec["median_window"], spec["min_length"], top_k, runs,
                          ratio=spec["ratio"], path=path, regions=spec["regions"], shares=spec.get("shares"),
                          strength=strength, alternatives=alternatives)


def _cut_times(candidates) -> dict:
    """Per video, the sorted times where one of the `candidates`' clinical events starts or ends + 1."""
    cuts: dict = {}
    for c in candidates:
        for v, events in enumerate(c.clinical):
            for s, e in events:
                cuts.setdefault(v, set()).update((s, e + 1))
    return {v: sorted(times) for v, times in cuts.items()}


def _all_candidates(timeline: Timeline, engine: Engine, path: np.ndarray, scores: np.ndarray) -> dict:
    """Gated candidates of every label: findings and landmarks first, regions cut at their events,
    the head's regions from its posterior (`scores`: the calibrated region emissions)."""
    out, cuts, shadow = _label_candidates(timeline, engine, path)
    out |= _region_candidates_all(timeline, engine, path, cuts, shadow)
    heads: dict = {}  # one posterior per (temperature, count): both regions read it
    for region in HEAD_REGIONS:
        policy = engine.policies[region]
        if policy["kind"] != "head":
            continue
        key = (policy["temperature"], policy["candidates"], json.dumps(policy["length_priors"]))
        if key not in heads:
            heads[key] = head_candidates(timeline, path, scores, policy["length_priors"], policy["temperature"],
                                         policy["candidates"])
        out[region] = gated(heads[key][region], policy["gate"])
    return out


def _label_candidates(timeline: Timeline, engine: Engine, path: np.ndarray,
                      appended: bool = True) -> tuple[dict, dict | None, dict | None]:
    """(gated candidates of every emitted finding and landmark, the times their events cut the
    regions at, the times the runs of labels left silent cut them at (`shadow_cuts`))."""
    out = {}
    for label in LABELS:
        policy = engine.policies[label]
        if policy["kind"] == "runs":
            c = _policy_runs(timeline, label, policy, engine.top_k, path, appended)
            c.evidence = gate_evidence(c.features, policy)
        elif policy["kind"] == "anchored":
            c = anchored_candidates(timeline, path, label, [tuple(a) for a in policy["anchors"]])
        else:
            continue
        out[label] = gated(c, policy["gate"])
    cuts = _cut_times(out.values()) if engine.region_cuts else None
    shadow = None
    if engine.region_cuts and any("shadow" in p for p in engine.policies.values()):
        # The runs of labels left silent cut the regions too, after the emitted ones.
        shadow = _cut_times(_policy_runs(timeline, label, engine.policies[label]["shadow"], engine.top_k, path, False)
                            for label in LABELS if "shadow" in engine.policies[label])
    return out, cuts, shadow


def _region_candidates_all(timeline: Timeline, engine: Engine, path: np.ndarray, cuts, shadow,
                           order: str | None = None) -> dict:
    """Each region's candidates, cut at `cuts` and `shadow` (`_label_candidates`): gated, their
    pieces in the policy's `cut_order`; or (`order`, while fitting) ungated, in that order."""
    out = {}
    for state, region in enumerate(REGIONS):
        policy = engine.policies[region]
        if policy["kind"] != "region":
            continue
        c = region_candidates(timeline, path, state, [tuple(v) for v in policy["variants"]], cuts, shadow,
                              order or policy["cut_order"])
        out[region] = c if order else gated(c, policy["gate"])
    return out


def engine_submission(frame_probs: pd.DataFrame, engine: Engine, time_col: str = "t") -> tuple[dict, dict]:
    """(metric-optimal submission, clinical event list) for the videos of `frame_probs`."""
    timeline = build_timeline(frame_probs, time_col, max_reach=_reach(engine))
    return engine_submission_on(timeline, engine)


def _reach(engine: Engine) -> int:
    """The timeline reach the engine's median windows need (shadow runs included): no window
    sees across two videos."""
    return max([1] + [spec["median_window"] // 2 for _, spec in _run_specs(engine)])


def engine_submission_on(timeline: Timeline, engine: Engine) -> tuple[dict, dict]:
    if engine.centres is not None:
        timeline = recentred(timeline, engine.centres)
    if engine.temperatures is not None:
        timeline = calibrated(timeline, engine.temperatures)
    scores = region_emissions(timeline, engine.coef, engine.intercept)
    path = decode(timeline, scores, engine.switch_penalty, engine.durations)
    candidates = _all_candidates(timeline, engine, path, scores)
    submission, clinical = [], []
    for v, video_id in enumerate(timeline.video_ids):
        ranked, clean = [], []
        for label in LABELS:
            if label not in candidates:
                continue
            c = candidates[label]
            ranked += [{"start": s, "end": e, "label": [label]} for s, e in c.events[v]]
            clean += [{"start": s, "end": e, "label": [label]} for s, e in c.clinical[v]]
        submission.append({"video_id": video_id, "events": ranked})
        clinical.append({"video_id": video_id, "events": sorted(clean, key=lambda e: (e["start"], e["end"], e["label"]))})
    return {"videos": submission}, {"videos": clinical}


def tuning_timeline(frame_probs: pd.DataFrame, params: EngineParams, time_col: str = "t") -> Timeline:
    return build_timeline(frame_probs, time_col, max_reach=max(max(params.median_windows) // 2, 1))


__all__ = ["Engine", "EngineParams", "engine_submission", "fit_engine", "tuning_timeline", "NUM_LABELS"]
