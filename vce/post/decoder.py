"""The decoder `thresholds.method` names, fitted and applied in one place (the thresholds and events stages).

    f1      per-class thresholds maximising frame F1 (`vce.post.thresholds.f1_thresholds`),
            decoded into events by `probs_to_submission` under params.yaml `events`;
    map     those thresholds and the events post-processing tuned on validation temporal mAP
            (`tune_on_map`), decoded the same way under the tuned `events` block;
    engine  the score engine (`vce.post.engine`), fitted on the validation videos; it decodes
            the metric-optimal submission and the clinical list itself (the thresholds are a report).

`fit_decoder` fits one on validation probabilities; `read_decoder` reads the fitted one back from
`models/thresholds.json` (`vce.post.thresholds_file`, the schema's owner) and `decode` applies it.
A new method is one fitter in `_FITTERS` here and its block in that schema.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from vce.core.labels import LABELS
from vce.core.params import from_dict
from vce.post.engine import engine_submission, fit_engine, presence_rates, tuning_timeline
from vce.post.events import EventParams, labels_to_submission, probs_to_submission
from vce.post.thresholds import ThresholdParams, f1_thresholds, tune_on_map
from vce.post.thresholds_file import SavedThresholds, read_thresholds
from vce.post.timeline import labels_on_time


@dataclass(frozen=True)
class FittedDecoder:
    """What `fit_decoder` found: the blocks `write_thresholds` saves, and what the fit measured."""

    method: str
    thresholds: dict[str, float]  # label -> threshold (under engine a report only: the engine decides)
    events: dict | None  # map: the tuned `EventParams`, dumped; else None
    engine: dict | None  # engine: the fitted `Engine.to_dict()`; else None
    report: dict  # the tuning report (metrics "tuning"; "seconds" printed, not written); {} under f1


def fit_decoder(frame_probs: pd.DataFrame, frame_labels: np.ndarray, frames: pd.DataFrame, params: ThresholdParams,
                events_section: dict, seed: int) -> FittedDecoder:
    """Fit the decoder `params.method` names on validation probabilities.

    `frame_probs`: the validation probabilities joined to the index (`join_probs`: "valid", `t`,
    the 17 labels); `frame_labels`: their (N, 17) labels; `frames`: the labelled index (the
    ground truth of the validation videos, and the engine's presence rates over every labelled
    video); `events_section`: params.yaml `events`, read under map only (where it is the start).
    1. the F1 thresholds on the valid frames (every method starts from them);
    2. map and engine: the validation videos' ground-truth events, and that method's fit.
    """
    valid = frame_probs["valid"].to_numpy()
    thresholds = f1_thresholds(frame_labels[valid], frame_probs[list(LABELS)].to_numpy()[valid], params)
    if params.method == "f1":
        return FittedDecoder("f1", thresholds, None, None, {})
    validation_frames = frames[frames["video_id"].isin(set(frame_probs["video_id"]))]
    gt = labels_to_submission(labels_on_time(validation_frames))
    reads = events_section if params.method in FIT_READS_EVENTS else None
    return _FITTERS[params.method](frame_probs, gt, frames, thresholds, params, reads, seed)


def _fit_map(frame_probs, gt, frames, thresholds, params: ThresholdParams, events_section, seed) -> FittedDecoder:
    # `events` is read under map only (dvc.yaml: metrics/thresholds_reads.json says when).
    event_params = from_dict(EventParams, events_section, "events")
    thresholds, tuned, report = tune_on_map(frame_probs, gt, thresholds, event_params, params)
    return FittedDecoder("map", thresholds, tuned.model_dump(), None, report)


def _fit_engine(frame_probs, gt, frames, thresholds, params: ThresholdParams, events_section, seed) -> FittedDecoder:
    # Presence rates over every labelled video it may learn from: a validation split is a small sample.
    rates = presence_rates(frames)
    fitted = fit_engine(tuning_timeline(frame_probs, params.engine), gt, params.engine, seed, rates)
    return FittedDecoder("engine", thresholds, None, fitted.to_dict(), fitted.report)


_FITTERS = {"map": _fit_map, "engine": _fit_engine}
# The methods whose fit reads params.yaml `events` (map: the search starts there). The others get
# None, and the params stage writes the section into metrics/thresholds_reads.json for these only
# (the thresholds stage's dvc.yaml dependency in place of `events`).
FIT_READS_EVENTS = frozenset({"map"})


@dataclass(frozen=True)
class Decoder:
    """A fitted decoder read back (`read_decoder`): thresholds.json as checked, and the events
    post-processing the thresholds decode with (unused under engine)."""

    saved: SavedThresholds
    event_params: EventParams


def read_decoder(path, events_section: dict) -> Decoder:
    """thresholds.json read and checked once, before any output, with its events post-processing:
    params.yaml `events` (checked even where the tuned block replaces it), or under map the tuned
    block (its errors name `path:events`)."""
    event_params = from_dict(EventParams, events_section, "events")
    saved = read_thresholds(path)
    if saved.events:
        event_params = from_dict(EventParams, saved.events, f"{path}:events")
    return Decoder(saved, event_params)


def decode(decoder: Decoder, frame_probs: pd.DataFrame) -> tuple[dict, dict]:
    """(submission, clinical event list) of the videos of `frame_probs` (`join_probs`' table).

    The engine writes the metric-optimal submission (candidates appended per label) and one
    event per run for people; thresholds write the same events to both."""
    if decoder.saved.engine is not None:
        return engine_submission(frame_probs, decoder.saved.engine)
    submission = probs_to_submission(frame_probs, decoder.saved.thresholds, decoder.event_params)
    return submission, submission
