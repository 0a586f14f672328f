"""Frame probabilities -> temporal events in the official submission format.

Pipeline (per label, then per video; every knob in `EventParams` / params.yaml `events`):

1. threshold: a frame is active for a label when its probability >= the label's threshold;
2. median filter over `median_window` frames (binary majority of the observed frames in the
   centred window; a tie, possible next to gaps, keeps the frame's own value);
3. fill gaps of at most `fill_gap` frames between active runs (missing and invalid frames are
   gaps too, so they can be bridged);
4. drop runs shorter than `min_length` frames;
5. presence decision per (video, label): an absent label left unpredicted scores AP 1 and a
   single false event scores 0 (REFERENCE.md "The official metric"), so a label is kept in a
   video only when its evidence passes `presence` (strongest event mean probability, or total
   event frames);
6. events: `tuple` cuts a new event whenever the set of active labels changes, as the official
   ground truth is built (so region labels are fragmented like the ground truth); `per_label`
   writes each label's runs on their own. Events of a video are written most confident first
   (mean probability inside the event), since file order is the ranking AP uses.

With `anatomy: viterbi`, before step 5 the five region labels are replaced by one monotone
region path per video and landmarks are confined to its boundaries (`vce.post.anatomy`): region
thresholds and smoothing knobs then have no effect.

All videos are laid end to end on one dense frame axis (`vce.post.timeline.Timeline`): missing times become
unobserved frames, long gaps are shortened to a length no step can see across, and videos are
separated by such gaps, so every step is one vectorised pass over all videos.
"""

from __future__ import annotations

import datetime
import re
import sys
import zipfile
from typing import Any, Literal

import numpy as np
import pandas as pd
import pydantic
from pydantic import Field, PrivateAttr, model_validator

from vce.core.errors import DataError, ParamsError
from vce.core.io import atomic_path
from vce.core.labels import LABEL_INDEX, LABELS, NUM_LABELS
from vce.core.params import FieldError, OddInt, Section, explain
from vce.post.anatomy import anatomy_runs
from vce.post.kernels import majority_runs
from vce.post.runs import clip_to_videos, mean_probs, runs_of, video_of
from vce.post.timeline import Timeline, build_timeline

# Knobs a label may override in `EventParams.per_label` (tuned per label by `tune_on_map`).
LABEL_KNOBS = {"median_window": int, "fill_gap": int, "min_length": int, "presence_threshold": float, "presence_min_frames": int}


class EventParams(Section):
    """`events`: frame probabilities → events (per-label overrides in `per_label`)."""

    style: Literal["tuple", "per_label"]
    median_window: OddInt
    fill_gap: int = Field(ge=0)
    min_length: int = Field(ge=1)
    presence: Literal["none", "max", "frames"]
    presence_threshold: float = Field(ge=0, le=1)
    presence_min_frames: int = Field(ge=1)
    multi_label: bool
    per_label: dict[str, dict[str, Any]]
    anatomy: Literal["none", "viterbi"]
    emission: Literal["probs", "runs"]
    switch_penalty: float = Field(ge=0)
    landmarks: Literal["window", "peak"]
    landmark_window: int = Field(ge=0)
    landmark_length: int = Field(ge=1)
    _label_params: dict = PrivateAttr(default_factory=dict)  # for_label's cache

    @model_validator(mode="after")
    def _overrides(self):
        """Each label's overrides: a known label, known knobs, values valid as the shared knob."""
        for label, overrides in self.per_label.items():
            self.require(label in LABEL_INDEX, f"per_label.{label}", f"unknown label; allowed: {list(LABELS)}")
            for knob in overrides:
                self.require(knob in LABEL_KNOBS, f"per_label.{label}.{knob}",
                             f"unknown knob; allowed: {list(LABEL_KNOBS)}")
            try:
                self.for_label(label)
            except pydantic.ValidationError as err:
                error = err.errors(include_url=False)[0]
                knob = error["loc"][0]
                raise FieldError(f"per_label.{label}.{knob}", explain(error)) from None
        return self

    def for_label(self, label: str) -> EventParams:
        """The knobs that apply to `label` (its overrides over the shared values), validated."""
        overrides = self.per_label.get(label)
        if not overrides:
            return self
        key = (label, tuple(sorted(overrides.items())))  # validated once (tuning calls this often)
        if key not in self._label_params:
            self._label_params[key] = self.replace(**overrides, per_label={})
        return self._label_params[key]

    def max_reach(self) -> int:
        """Longest median half-window or gap fill any label uses (the timeline must allow it)."""
        labels = [self] + [self.for_label(label) for label in self.per_label]
        return max(max(p.median_window // 2, p.fill_gap) for p in labels)


# ----------------------------------------------------------------------------- per-label runs


def label_runs(timeline: Timeline, k: int, threshold: float, params: EventParams) -> tuple[np.ndarray, np.ndarray]:
    """Steps 1-4 for label k: (start, end) dense positions (inclusive) of its runs, in time order."""
    params = params.for_label(LABELS[k])
    if params.max_reach() > timeline.max_reach:
        raise ParamsError(f"events: median_window/fill_gap reach {params.max_reach()} exceeds the timeline's {timeline.max_reach}")
    return smooth_runs(timeline, timeline.probs[k] >= threshold, params.median_window, params.fill_gap, params.min_length)


def smooth_runs(timeline: Timeline, active: np.ndarray, median_window: int, fill_gap: int, min_length: int):
    """Steps 2-4 on a (P,) bool mask: (start, end) dense positions (inclusive) of its runs."""
    # 2. Median filter = majority of observed frames in the window (separators pad the ends),
    #    with the runs of its result: one compiled pass (`majority_runs`).
    half = median_window // 2
    if half > 0:
        starts, ends = majority_runs(np.ascontiguousarray(active, bool), timeline.observed, half)
    else:
        starts, ends = runs_of(active)
    # 3. Fill gaps of at most fill_gap frames (a gap of missing frames counts the same).
    if len(starts) > 1:
        bridged = (starts[1:] - ends[:-1] - 1) <= fill_gap
        starts = starts[np.concatenate([[True], ~bridged])]
        ends = ends[np.concatenate([~bridged, [True]])]
    # 4. Drop short runs.
    long_enough = ends - starts + 1 >= min_length
    return starts[long_enough], ends[long_enough]


def apply_presence(timeline, runs, confidences, params: EventParams):
    """Step 5: keep a label's runs in a video only when the video's evidence for it passes."""
    if params.presence == "none":
        return runs
    n_videos = len(timeline.video_ids)
    kept = []
    for label, (starts, ends), confidence in zip(LABELS, runs, confidences):
        label_params = params.for_label(label)
        video = video_of(timeline, starts)
        if label_params.presence == "max":
            best = np.full(n_videos, -np.inf)
            np.maximum.at(best, video, confidence)
            present = best >= label_params.presence_threshold
        else:
            frames = np.bincount(video, weights=ends - starts + 1, minlength=n_videos)
            present = frames >= label_params.presence_min_frames
        keep = present[video]
        kept.append((starts[keep], ends[keep]))
    return kept


# ----------------------------------------------------------------------------- events


def _tuple_segments(timeline: Timeline, runs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cut the axis wherever the set of active labels changes: (start, end, label bitmask)."""
    size = len(timeline.observed)
    code = np.zeros(size, dtype=np.int32)
    for k, (starts, ends) in enumerate(runs):
        if len(starts) == 0:
            continue
        marks = np.zeros(size + 1, dtype=np.int8)
        marks[starts] = 1
        marks[ends + 1] = -1  # runs of one label are separated by >= 1 frame: no collision
        code |= np.cumsum(marks[:-1], dtype=np.int8).astype(np.int32) << k
    change = np.flatnonzero(code[1:] != code[:-1]) + 1
    seg_starts = np.concatenate([[0], change])
    seg_ends = np.concatenate([change - 1, [size - 1]])
    seg_codes = code[seg_starts]
    active = seg_codes != 0
    return seg_starts[active], seg_ends[active], seg_codes[active]


def _event_records(timeline: Timeline, runs, params: EventParams, with_confidence: bool):
    """(start, end, label mask, confidence) per event; confidence = mean probability inside."""

    def confidence(k, starts, ends):
        if not with_confidence:
            return np.zeros(len(starts))
        return mean_probs(timeline, k, starts, ends)

    records = []  # list of (starts, ends, masks, confidences)
    if params.style == "per_label":
        for k, (starts, ends) in enumerate(runs):
            records.append((starts, ends, np.full(len(starts), 1 << k, np.int64), confidence(k, starts, ends)))
    else:
        seg_starts, seg_ends, seg_codes = _tuple_segments(timeline, runs)
        per_label_conf = np.zeros((NUM_LABELS, len(seg_starts)))
        for k in range(NUM_LABELS):
            has = (seg_codes >> k) & 1 == 1
            if has.any():
                per_label_conf[k, has] = confidence(k, seg_starts[has], seg_ends[has])
                if not params.multi_label:
                    records.append((seg_starts[has], seg_ends[has], np.full(int(has.sum()), 1 << k, np.int64), per_label_conf[k, has]))
        if params.multi_label:
            bits = (seg_codes[None, :] >> np.arange(NUM_LABELS)[:, None]) & 1  # (17, S)
            n_labels = np.maximum(bits.sum(axis=0), 1)
            records.append((seg_starts, seg_ends, seg_codes.astype(np.int64), (per_label_conf * bits).sum(axis=0) / n_labels))
    if not records:
        empty = np.empty(0, np.int64)
        return empty, empty, empty, np.empty(0)
    return tuple(np.concatenate(parts) for parts in zip(*records))


def _label_names(mask: int, cache: dict) -> list[str]:
    """Label list of a bitmask, alphabetical as in the official ground truth."""
    if mask not in cache:
        cache[mask] = sorted(LABELS[k] for k in range(NUM_LABELS) if mask >> k & 1)
    return list(cache[mask])


def _submission(timeline: Timeline, starts, ends, masks, confidences, by_confidence: bool) -> dict:
    video = video_of(timeline, starts)
    # Per video: most confident first (ties and time order: earliest first).
    order = np.lexsort((starts, -confidences, video)) if by_confidence else np.lexsort((starts, video))
    names: dict = {}
    videos = [{"video_id": video_id, "events": []} for video_id in timeline.video_ids]
    for v, s, e, m in zip(
        video[order].tolist(),
        timeline.time[starts[order]].tolist(),
        timeline.time[ends[order]].tolist(),
        masks[order].tolist(),
    ):
        videos[v]["events"].append({"start": s, "end": e, "label": _label_names(m, names)})
    return clip_to_videos(timeline, {"videos": videos})


def timeline_runs(timeline: Timeline, thresholds: dict[str, float], params: EventParams) -> list:
    """Steps 1-4 for every label: [(starts, ends)] in LABELS order."""
    missing = [label for label in LABELS if label not in thresholds]
    if missing:
        raise DataError(f"thresholds lack label(s) {missing}")
    return [label_runs(timeline, k, float(thresholds[label]), params) for k, label in enumerate(LABELS)]


def runs_to_submission(timeline: Timeline, runs, params: EventParams) -> dict:
    """Steps 5-6 from per-label runs (regions and landmarks decoded first when `anatomy` asks)."""
    if params.anatomy != "none":
        runs = anatomy_runs(timeline, runs, params)
    if params.presence != "none":
        confidences = [
            mean_probs(timeline, k, starts, ends) if len(starts) else np.empty(0)
            for k, (starts, ends) in enumerate(runs)
        ]
        runs = apply_presence(timeline, runs, confidences, params)
    return _submission(timeline, *_event_records(timeline, runs, params, with_confidence=True), by_confidence=True)


def probs_to_submission(
    frame_probs: pd.DataFrame, thresholds: dict[str, float], params: EventParams, time_col: str = "t"
) -> dict:
    """Official submission dict from frame probabilities (columns video_id, time_col, 17 labels[, valid])."""
    timeline = build_timeline(frame_probs, time_col, max_reach=params.max_reach())
    return runs_to_submission(timeline, timeline_runs(timeline, thresholds, params), params)


def labels_to_submission(frame_labels: pd.DataFrame, time_col: str = "t") -> dict:
    """Ground-truth events from 0/1 label columns, built as the official ground truth is.

    A new event whenever the set of active labels changes (no smoothing); frames with no active
    label, and missing times, produce no event; events in time order, label lists alphabetical.
    """
    raw = EventParams(  # the official ground truth's decoding: no smoothing, no presence rule, no anatomy
        style="tuple", median_window=1, fill_gap=0, min_length=1, presence="none", presence_threshold=0.0,
        presence_min_frames=1, multi_label=True, per_label={}, anatomy="none", emission="probs",
        switch_penalty=0.0, landmarks="window", landmark_window=0, landmark_length=1,
    )
    timeline = build_timeline(frame_labels, time_col, max_reach=1)
    runs = timeline_runs(timeline, {label: 0.5 for label in LABELS}, raw)
    return _submission(timeline, *_event_records(timeline, runs, raw, with_confidence=False), by_confidence=False)


_XLSX_TIME = datetime.datetime(2026, 1, 1)
XLSX_MAX_ROWS = 1_048_576  # rows per worksheet, header included (the .xlsx format's limit)


def write_xlsx(sub: dict, path) -> None:
    """The submission as a spreadsheet: video_id, start, end, label (comma-joined), atomically.

    More events than one worksheet holds continue on sheets `Sheet2`, `Sheet3`, … (each
    with the header), so no event is lost; the JSON stays the submission of record.
    """
    rows = [
        (video["video_id"], event["start"], event["end"], ",".join(event["label"]))
        for video in sub["videos"]
        for event in video["events"]
    ]
    table = pd.DataFrame(rows, columns=["video_id", "start", "end", "label"])
    per_sheet = XLSX_MAX_ROWS - 1
    with atomic_path(path) as tmp:
        with pd.ExcelWriter(tmp, engine="openpyxl") as writer:
            for sheet, first in enumerate(range(0, max(len(table), 1), per_sheet), start=1):
                table.iloc[first:first + per_sheet].to_excel(writer, sheet_name=f"Sheet{sheet}", index=False)
            writer.book.properties.created = _XLSX_TIME
        _fix_zip_times(tmp)
    if len(table) > per_sheet:
        print(f"warning: {path}: {len(table)} events exceed one worksheet's {per_sheet} rows; "
              f"written on {-(-len(table) // per_sheet)} sheets (Sheet1, Sheet2, ...)", file=sys.stderr)


def _fix_zip_times(path) -> None:
    """Same events, same bytes (and DVC hash): rewrite the .xlsx zip with fixed entry times."""
    with zipfile.ZipFile(path) as source:
        entries = [(info.filename, source.read(info)) for info in source.infolist()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as target:
        for name, data in entries:
            if name == "docProps/core.xml":  # openpyxl stamps the save time as `modified`
                data = re.sub(rb"(<dcterms:modified[^>]*>)[^<]*", rb"\g<1>2026-01-01T00:00:00Z", data)
            target.writestr(zipfile.ZipInfo(name, date_time=_XLSX_TIME.timetuple()[:6]), data,
                            compress_type=zipfile.ZIP_DEFLATED)
