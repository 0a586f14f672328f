"""Per-class frame thresholds: F1 on validation frames (the seed's way), or tuned on temporal mAP.

`f1_thresholds` maximises each class's frame F1 over a grid, searching from `low_start` for
classes under `low_support` frame support as the seed does (REFERENCE.md "The seed system").

`tune_on_map` searches thresholds and the events post-processing knobs directly on the
validation temporal mAP (`vce.eval.score`), because that is what is scored and its sharp edges
(an absent label left unpredicted is worth AP 1, one false event in that video makes it 0;
events are ranked by file order) are invisible to frame F1. Coordinate ascent, coarse to fine:

0. the given thresholds, or every label off (the empty submission) if that scores better;
1. each label's threshold over `coarse_grid`, which ends with `off_threshold` (> 1: the label
   never fires, so every video where it is absent keeps AP 1);
2. the event style and each shared post-processing knob over its grid;
3. per label that fires: its own knobs (`EventParams.per_label` overrides), then its threshold
   over the coarse grid again;
4. `rounds` refinement passes: each label's threshold +- `refine_step`, the step halved per round.

Each step is one function (`_phase_start`, `_phase_coarse`, `_phase_shared_knobs`,
`_phase_per_label`, `_phase_refine`) acting on the search state (`_Search`). A change is kept
only when it raises the objective, so the result never scores below the start.

`method: engine` skips all this: the score engine (`vce.post.engine`) is fitted instead.
"""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
import pandas as pd
from pydantic import Field, model_validator

from vce.core.errors import DataError
from vce.core.labels import LABELS, NUM_LABELS
from vce.core.params import OddInt, Section
from vce.eval.score import score
from vce.post.engine import EngineParams
from vce.post.events import EventParams, label_runs, runs_to_submission
from vce.post.timeline import Timeline, build_timeline

OBJECTIVES = ("mean", "map@0.5", "map@0.95")


Probability = Annotated[float, Field(ge=0, le=1)]


class ThresholdParams(Section):
    """`thresholds`: how per-class thresholds (and, for `map`, event knobs) are chosen."""

    method: Literal["f1", "map", "engine"]
    low_support: Probability
    low_start: Probability
    grid_start: Probability
    grid_stop: Probability
    grid_step: float = Field(gt=0, le=1)
    off_threshold: float = Field(gt=1)
    objective: Literal["mean", "map@0.5", "map@0.95"]
    coarse_grid: list[Annotated[float, Field(ge=0)]] = Field(min_length=1)
    rounds: int = Field(ge=0)
    refine_step: float = Field(gt=0, lt=1)
    styles: list[Literal["tuple", "per_label"]] = Field(min_length=1)
    median_windows: list[OddInt] = Field(min_length=1)
    fill_gaps: list[Annotated[int, Field(ge=0)]] = Field(min_length=1)
    min_lengths: list[Annotated[int, Field(ge=1)]] = Field(min_length=1)
    presence_thresholds: list[Probability] = Field(min_length=1)
    engine: EngineParams

    @model_validator(mode="after")
    def _grids(self):
        self.require(self.grid_start <= self.grid_stop, "grid_start", f"must be <= grid_stop ({self.grid_stop})")
        for i, value in enumerate(self.coarse_grid):
            self.require(value <= self.off_threshold, f"coarse_grid.{i}",
                         f"must be in [0, off_threshold ({self.off_threshold})]")
        return self


# ----------------------------------------------------------------------------- F1


def _best_f1_threshold(y_true: np.ndarray, y_prob: np.ndarray, grid: np.ndarray) -> float:
    """The grid threshold with the highest frame F1 (prob >= threshold fires); lowest on ties."""
    positives = np.sort(y_prob[y_true == 1])
    everything = np.sort(y_prob)
    fired = len(everything) - np.searchsorted(everything, grid, side="left")
    true_positives = len(positives) - np.searchsorted(positives, grid, side="left")
    f1 = 2 * true_positives / np.maximum(fired + len(positives), 1)
    return float(grid[int(np.argmax(f1))])


def f1_thresholds(y_true: np.ndarray, y_prob: np.ndarray, params: ThresholdParams) -> dict[str, float]:
    """Per-class threshold maximising frame F1 on validation frames.

    Grid: `grid_start` .. `grid_stop` by `grid_step`, from `low_start` instead for classes whose
    positive fraction is under `low_support`. A class without validation positives gets
    `off_threshold` (never fires): an absent label left unpredicted scores AP 1 in every video.
    Rows with a NaN probability (invalid frames) are ignored.
    """
    y_true = np.asarray(y_true)
    y_prob = np.asarray(y_prob, dtype=np.float64)
    if y_true.shape != y_prob.shape or y_true.ndim != 2 or y_true.shape[1] != NUM_LABELS:
        raise ValueError(f"f1_thresholds: expected two (N, {NUM_LABELS}) arrays, got {y_true.shape} and {y_prob.shape}")
    valid = np.isfinite(y_prob).all(axis=1)
    y_true, y_prob = y_true[valid], y_prob[valid]
    thresholds = {}
    for k, label in enumerate(LABELS):
        support = float(y_true[:, k].mean()) if len(y_true) else 0.0
        if support == 0.0:
            thresholds[label] = params.off_threshold
            continue
        start = params.low_start if support < params.low_support else params.grid_start
        grid = np.round(np.arange(start, params.grid_stop + params.grid_step / 2, params.grid_step), 6)
        thresholds[label] = _best_f1_threshold(y_true[:, k], y_prob[:, k], grid)
    return thresholds


# ----------------------------------------------------------------------------- temporal mAP


class _MapObjective:
    """Validation temporal mAP of (thresholds, event params), with per-label runs cached."""

    def __init__(self, timeline: Timeline, gt: dict, objective: str):
        self.timeline, self.gt, self.objective = timeline, gt, objective
        self.runs_cache: dict = {}
        self.evaluations = 0

    def runs(self, k: int, threshold: float, params: EventParams):
        knobs = params.for_label(LABELS[k])
        key = (k, threshold, knobs.median_window, knobs.fill_gap, knobs.min_length)
        if key not in self.runs_cache:
            if len(self.runs_cache) > 4000:
                self.runs_cache.clear()
            self.runs_cache[key] = label_runs(self.timeline, k, threshold, params)
        return self.runs_cache[key]

    def __call__(self, thresholds: dict, params: EventParams) -> float:
        runs = [self.runs(k, thresholds[label], params) for k, label in enumerate(LABELS)]
        result = score(self.gt, runs_to_submission(self.timeline, runs, params), check=False)
        self.evaluations += 1
        if self.objective == "mean":
            return (result["map@0.5"] + result["map@0.95"]) / 2
        return result[self.objective]


def _validation_gt(gt: dict, video_ids: list[str]) -> dict:
    by_id = {str(video["video_id"]): video for video in gt["videos"]}
    missing = [v for v in video_ids if v not in by_id]
    if missing:
        raise DataError(f"tune_on_map: ground truth lacks video(s) {missing[:5]} present in the frame probabilities")
    return {"videos": [by_id[v] for v in video_ids]}


def _with_override(params: EventParams, label: str, knob: str, value) -> EventParams:
    per_label = {**params.per_label, label: {**params.per_label.get(label, {}), knob: value}}
    return params.replace(per_label=per_label)


class _Search:
    """The search state: the best (thresholds, event params) so far, and the changes that improved it."""

    def __init__(self, evaluate: _MapObjective, thresholds: dict, event_params: EventParams):
        self.evaluate = evaluate
        self.thresholds, self.event_params = thresholds, event_params
        self.best = self.start = evaluate(thresholds, event_params)
        self.steps: list = []

    def consider(self, thresholds: dict, event_params: EventParams, what: str) -> None:
        """Keep the candidate only when it raises the objective (so the search never goes down)."""
        value = self.evaluate(thresholds, event_params)
        if value > self.best + 1e-12:
            self.steps.append({"change": what, "objective": value})
            self.best, self.thresholds, self.event_params = value, thresholds, event_params

    def try_thresholds(self, label: str, values) -> None:
        for value in values:
            if value != self.thresholds[label]:
                self.consider({**self.thresholds, label: float(value)}, self.event_params, f"{label}={value}")

    def firing(self) -> list[str]:
        return [label for label in LABELS if self.thresholds[label] <= 1.0]


def _knob_grids(params: ThresholdParams, event_params: EventParams) -> dict:
    grids = {"median_window": params.median_windows, "fill_gap": params.fill_gaps, "min_length": params.min_lengths}
    if event_params.presence == "max":
        grids["presence_threshold"] = params.presence_thresholds
    return grids


def _phase_start(search: _Search, params: ThresholdParams) -> None:
    """0. Every label off (the empty submission: AP 1 wherever a label is absent) is a start too."""
    search.consider({label: params.off_threshold for label in LABELS}, search.event_params, "all labels off")


def _phase_coarse(search: _Search, params: ThresholdParams) -> None:
    """1. Per label, its threshold over the coarse grid (the last value switches it off)."""
    for label in LABELS:
        search.try_thresholds(label, params.coarse_grid)


def _phase_shared_knobs(search: _Search, params: ThresholdParams) -> None:
    """2. Shared knobs: event style, then each knob over its grid."""
    for style in params.styles:
        if style != search.event_params.style:
            search.consider(search.thresholds, search.event_params.replace(style=style), f"style={style}")
    for knob, grid in _knob_grids(params, search.event_params).items():
        for value in grid:
            if value != getattr(search.event_params, knob):
                search.consider(search.thresholds, search.event_params.replace(**{knob: value}), f"{knob}={value}")


def _phase_per_label(search: _Search, params: ThresholdParams) -> None:
    """3. Per firing label: its own knobs (regions want long windows, short lesions short ones),
    then its threshold over the coarse grid once more under them."""
    grids = _knob_grids(params, search.event_params)
    for label in search.firing():
        for knob, grid in grids.items():
            for value in grid:
                if value != getattr(search.event_params.for_label(label), knob):
                    search.consider(search.thresholds, _with_override(search.event_params, label, knob, value),
                                    f"{label}.{knob}={value}")
        search.try_thresholds(label, params.coarse_grid)


def _phase_refine(search: _Search, params: ThresholdParams) -> None:
    """4. `rounds` passes of each firing label's threshold +- step, the step halved per round."""
    step = params.refine_step
    for _ in range(params.rounds):
        for label in search.firing():
            current = search.thresholds[label]
            search.try_thresholds(label, [v for v in (round(current - step, 6), round(current + step, 6)) if 0.0 <= v <= 1.0])
        step /= 2


def tune_on_map(
    frame_probs: pd.DataFrame,
    gt: dict,
    thresholds: dict,
    event_params: EventParams,
    params: ThresholdParams,
    time_col: str = "t",
) -> tuple[dict, EventParams, dict]:
    """Coarse-to-fine search on validation temporal mAP; returns (thresholds, event_params, report).

    `gt` may hold more videos than `frame_probs` (only those with frames are scored). The
    objective is `params.objective` (default: the mean of mAP@0.5 and mAP@0.95). Per-label knobs
    found are returned as `event_params.per_label` overrides. Phases: the module docstring.
    """
    reach = max(max(params.median_windows) // 2, max(params.fill_gaps), event_params.max_reach())
    timeline = build_timeline(frame_probs, time_col, max_reach=reach)
    evaluate = _MapObjective(timeline, _validation_gt(gt, timeline.video_ids), params.objective)
    search = _Search(evaluate, {label: float(thresholds[label]) for label in LABELS}, event_params)
    for phase in (_phase_start, _phase_coarse, _phase_shared_knobs, _phase_per_label, _phase_refine):
        phase(search, params)
    report = {
        "objective": params.objective,
        "start": search.start,
        "best": search.best,
        "evaluations": evaluate.evaluations,
        "labels_off": [label for label in LABELS if search.thresholds[label] > 1.0],
        "event_params": search.event_params.model_dump(),
        "steps": search.steps,
    }
    return search.thresholds, search.event_params, report

