"""`thresholds.engine`: what the score engine searches (each knob described once, in params.yaml)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from vce.core.params import OddInt, Section

# Video-level evidence a finding's presence gate may use (`run_candidates`; -inf without a run):
# the strongest run's mean probability, the mean of the 3 strongest, the frames and the number
# of runs, the video's highest frame probability, and the region context: the mean, over the
# run frames, of the share of the label's training frames that lie in the decoded region the
# run sits in (`region_shares`).
PRESENCE_FEATURES = ("max", "top3", "frames", "count", "peak", "region")
# ... or `joint`: a logistic model over all of them (`fit_presence_model`).
GATE_FEATURES = PRESENCE_FEATURES + ("joint",)
# A landmark's boundary candidates' presence evidence (`vce.post.engine.landmarks`): every video
# with a decoded boundary, the boundary posterior's largest probability, the landmark's highest
# frame probability in the window, the best candidate's score.
BOUNDARY_FEATURES = ("all", "sharpness", "peak", "top")


class EngineParams(Section):
    """`thresholds.engine`: what the score engine searches (its fitted values go to thresholds.json)."""

    switch_penalties: list[Annotated[float, Field(ge=0)]] = Field(min_length=1)
    prior_weights: list[float] = Field(min_length=1)
    min_duration_quantile: float = Field(ge=0, le=1)
    max_duration_factor: float = Field(ge=0)
    region_variants: int = Field(ge=0)
    variant_reach: int = Field(ge=0)
    region_cuts: bool
    shadow_cuts: bool
    cut_orders: list[Literal["longest", "shortest"]] = Field(min_length=1)
    head_candidates: int = Field(ge=0)
    head_width: int = Field(ge=1)
    head_bandwidth: float = Field(gt=0)
    head_temperatures: list[Annotated[float, Field(gt=0)]] = Field(min_length=1)
    thresholds: list[Annotated[float, Field(ge=0, le=1)]] = Field(min_length=1)
    median_windows: list[OddInt] = Field(min_length=1)
    min_lengths: list[Annotated[int, Field(ge=1)]] = Field(min_length=1)
    hysteresis: list[Annotated[float, Field(gt=0, le=1)]] = Field(min_length=1)
    ar_runs: bool
    ar_biases: list[float] = Field(min_length=1)
    ar_off_phases: int = Field(ge=1)
    ar_on_phases: int = Field(ge=1)
    ar_levels: list[Annotated[float, Field(gt=0, lt=1)]]
    decoder_min_auc: float = Field(ge=0, le=1)
    rank_shares: list[Annotated[float, Field(gt=0, lt=1)]]
    detector_choice: Literal["in_sample", "cross_fitted"]
    compatibility: bool
    compatibility_min_share: float = Field(ge=0, lt=1)
    top_k: int = Field(ge=1)
    presence_features: list[Literal[GATE_FEATURES]] = Field(min_length=1)
    anchor_candidates: int = Field(ge=0)
    landmark_candidates: int = Field(ge=0)
    landmark_width: int = Field(ge=1)
    landmark_temperatures: list[Annotated[float, Field(gt=0)]] = Field(min_length=1)
    landmark_prob_weights: list[Annotated[float, Field(ge=0)]] = Field(min_length=1)
    landmark_features: list[Literal[BOUNDARY_FEATURES]] = Field(min_length=1)
    landmark_min_z: float
    min_gain_sqrt_videos: float = Field(ge=0)
    recentre: bool
    finding_calibration: bool
    objective: Literal["mean", "map@0.5", "map@0.95"]
    calibration_frames: int = Field(ge=100)
    cross_fit: bool


