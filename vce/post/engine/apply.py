"""Applying a fitted engine: the metric-optimal submission and the clinical event list of new videos.

Per video and label, in LABELS order: findings and landmarks first (their runs, gated), then
the regions cut at those events (and at the runs of labels left silent), then the head's
regions. The submission holds every ranked candidate; the clinical list one event per run,
in time order, for people and the report.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from vce.core.labels import LABEL_INDEX, LABELS, REGIONS
from vce.post.arhmm import ar_decode_all
from vce.post.engine.calibration import calibrated, recentred
from vce.post.engine.candidates import SpanLists, gc_paused
from vce.post.engine.fitted import Engine
from vce.post.engine.gate import gated
from vce.post.engine.params import EngineParams
from vce.post.engine.regions import decode, region_emissions
from vce.post.head import HEAD_REGIONS
from vce.post.runs import clip_to_videos
from vce.post.timeline import Timeline, build_timeline


@gc_paused
def engine_submission(frame_probs: pd.DataFrame, engine: Engine, time_col: str = "t") -> tuple[dict, dict]:
    """(metric-optimal submission, clinical event list) for the videos of `frame_probs`."""
    timeline = build_timeline(frame_probs, time_col, max_reach=_reach(engine))
    return engine_submission_on(timeline, engine)


def tuning_timeline(frame_probs: pd.DataFrame, params: EngineParams, time_col: str = "t") -> Timeline:
    """The timeline `fit_engine` reads: reach enough for the widest median window it tries."""
    return build_timeline(frame_probs, time_col, max_reach=max(max(params.median_windows) // 2, 1))


@gc_paused
def engine_submission_on(timeline: Timeline, engine: Engine) -> tuple[dict, dict]:
    """`engine_submission` on a timeline already built."""
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
    return clip_to_videos(timeline, {"videos": submission}), clip_to_videos(timeline, {"videos": clinical})


@dataclass
class Decoding:
    """What the policies decode from (their `decode_*` methods): the timeline, the engine, its
    decoded region `path`; `appended` False: runs without what is appended after them (the fit's
    cuts). The calibrated region emissions are computed once, when a policy first needs them."""

    timeline: Timeline
    engine: Engine
    path: np.ndarray
    appended: bool = True
    scores: np.ndarray | None = None
    heads: dict = field(default_factory=dict)  # the head posteriors' candidates by their settings (`decode_head`)

    def region_scores(self) -> np.ndarray:
        if self.scores is None:
            self.scores = region_emissions(self.timeline, self.engine.coef, self.engine.intercept)
        return self.scores


def _run_specs(engine: Engine):
    """(label, spec) of every run decoding the engine applies: emitted runs and the shadow runs
    of labels left silent (`shadow_cuts`)."""
    for label in LABELS:
        policy = engine.policies[label]
        for spec in (policy.emitted_runs, policy.shadow_runs):
            if spec is not None:
                yield label, spec


def _reach(engine: Engine) -> int:
    """The timeline reach the engine's median windows need (shadow runs included): no window
    sees across two videos."""
    return max([1] + [spec.median_window // 2 for _, spec in _run_specs(engine)])


def _cut_times(candidates) -> dict:
    """Per video (those with an event), the sorted distinct times (int64) where one of the
    `candidates`' clinical events starts or ends + 1."""
    keys = [np.zeros(0, np.int64)]  # (video << 32) | time (times < 2**32): one sort orders and dedupes the pairs
    for c in candidates:
        video, starts, ends = _clinical_arrays(c.clinical)
        keys += [(video << 32) | starts, (video << 32) | (ends + 1)]
    key = np.unique(np.concatenate(keys))
    video, time = key >> 32, key & 0xFFFFFFFF
    splits = np.flatnonzero(np.diff(video)) + 1
    return {int(v[0]): t for v, t in zip(np.split(video, splits), np.split(time, splits)) if len(v)}


def _clinical_arrays(clinical) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(N,) int64 video, start and end of every event of per-video lists of (start, end)."""
    if isinstance(clinical, SpanLists):
        return tuple(np.asarray(a, np.int64) for a in clinical.arrays())
    counts = [len(events) for events in clinical]
    flat = np.array([span for events in clinical for span in events], np.int64).reshape(-1, 2)
    return np.repeat(np.arange(len(counts)), counts), flat[:, 0], flat[:, 1]


def _all_candidates(timeline: Timeline, engine: Engine, path: np.ndarray, scores: np.ndarray) -> dict:
    """Gated candidates of every label: findings and landmarks first, regions cut at their events,
    the head's regions from its posterior (`scores`: the calibrated region emissions)."""
    out, cuts, shadow = label_candidates(timeline, engine, path, scores=scores)
    out |= all_region_candidates(timeline, engine, path, cuts, shadow)
    decoding = Decoding(timeline, engine, path, scores=scores)
    for region in HEAD_REGIONS:
        policy = engine.policies[region]
        c = policy.decode_head(region, decoding)
        if c is not None:
            out[region] = gated(c, policy.gate)
    return out


def label_candidates(timeline: Timeline, engine: Engine, path: np.ndarray, appended: bool = True,
                     scores: np.ndarray | None = None) -> tuple[dict, dict | None, dict | None]:
    """(gated candidates of every emitted finding and landmark, the times their events cut the
    regions at, the times the runs of labels left silent cut them at (`shadow_cuts`));
    `scores`: the calibrated region emissions of `path` (computed here when a landmark needs them)."""
    out = {}
    ar_decode_all(timeline, [(LABEL_INDEX[label], spec.ar_model, spec.ar_bias) for label, spec in _run_specs(engine)
                             if spec.detector == "ar"])  # every decoding at once, then read from the cache
    decoding = Decoding(timeline, engine, path, appended, scores)
    for label in LABELS:
        policy = engine.policies[label]
        c = policy.decode_label(label, decoding)
        if c is not None:
            out[label] = gated(c, policy.gate)
    if not engine.region_cuts:
        return out, None, None
    shadows = [(label, engine.policies[label].shadow_runs) for label in LABELS
               if engine.policies[label].shadow_runs is not None]
    # The runs of labels left silent cut the regions too, after the emitted ones.
    shadow = _cut_times(spec.decode_runs(timeline, label, engine.top_k, path, False)
                        for label, spec in shadows) if shadows else None
    return out, _cut_times(out.values()), shadow


def all_region_candidates(timeline: Timeline, engine: Engine, path: np.ndarray, cuts, shadow,
                          order: str | None = None) -> dict:
    """Each region's candidates, cut at `cuts` and `shadow` (`label_candidates`): gated, their
    pieces in the policy's `cut_order`; or (`order`, while fitting) ungated, in that order."""
    out = {}
    decoding = Decoding(timeline, engine, path)
    for region in REGIONS:
        policy = engine.policies[region]
        c = policy.decode_region(region, decoding, cuts, shadow, order)
        if c is not None:
            out[region] = c if order else gated(c, policy.gate)
    return out
