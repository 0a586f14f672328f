"""Joining predictions to the frame index, the time axis events are written in, and the dense
frame axis every decoder reads (`Timeline`: the rule-based events, the score engine, the AR-HMM).

Events of Galar videos are in `index` units (the official ground truth is built that way);
events of RARE-VISION test videos use the file's frame number. The index says which, per
row, in `event_unit`; `t` is the resulting event time of every frame.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from vce.core.errors import DataError
from vce.core.labels import LABELS


def event_time(frames: pd.DataFrame) -> np.ndarray:
    """The event time of each index row: `index` or `frame`, as its `event_unit` says."""
    units = set(frames["event_unit"].unique())
    if not units <= {"index", "frame"}:
        raise DataError(f"unknown event_unit value(s) in the frame index: {sorted(units - {'index', 'frame'})}")
    return np.where(frames["event_unit"] == "index", frames["index"], frames["frame"]).astype(np.int64)


def labels_on_time(frames: pd.DataFrame) -> pd.DataFrame:
    """video_id, t and the 17 label columns of labelled index rows (for ground-truth events)."""
    out = frames[["video_id"] + list(LABELS)].copy()
    out.insert(1, "t", event_time(frames))
    return out.sort_values(["video_id", "t"], kind="stable").reset_index(drop=True)


def match_frames(left: pd.DataFrame, right: pd.DataFrame, what: str) -> pd.DataFrame:
    """`left` joined to `right` on (video_id, frame); every left row must find exactly one match.

    A mismatch means the two files come from different runs: the error names `what` and the
    first missing frame.
    """
    try:
        joined = left.merge(right, on=["video_id", "frame"], how="left", validate="one_to_one", indicator=True)
    except pd.errors.MergeError:  # a frame written twice on one side: files of different runs, or edited
        raise DataError(f"{what}: a (video_id, frame) appears more than once in one of the files") from None
    missing = joined["_merge"] != "both"
    if missing.any():
        row = joined[missing].iloc[0]
        raise DataError(f"{int(missing.sum())} {what}, e.g. video {row['video_id']} frame {row['frame']}: "
                         "rerun predict")
    return joined.drop(columns="_merge")


def join_probs(probs: pd.DataFrame, frames: pd.DataFrame):
    """Probabilities with their event time `t`, and the aligned (N, 17) labels if the index has them.

    Every probability row must match one index row (same video_id and frame): a mismatch
    means the files come from different runs, and the error says so.
    """
    has_labels = all(label in frames.columns for label in LABELS)
    index_rows = frames[["video_id", "frame"]].copy()
    index_rows["t"] = event_time(frames)
    if has_labels:
        index_rows[[f"true:{label}" for label in LABELS]] = frames[list(LABELS)].to_numpy()
    joined = match_frames(probs, index_rows, "predicted frame(s) are not in the frame index")
    joined = joined.sort_values(["video_id", "t"], kind="stable").reset_index(drop=True)
    if "valid" not in joined.columns:
        joined["valid"] = True
    truth_columns = [f"true:{label}" for label in LABELS]
    labels = joined[truth_columns].to_numpy(np.uint8) if has_labels else None
    return joined.drop(columns=truth_columns, errors="ignore"), labels


def _ranges(frames: np.ndarray, most: int = 3) -> str:
    """'301-648, 700' for sorted frame numbers (contiguous runs joined), the first `most` runs."""
    breaks = np.flatnonzero(np.diff(frames) != 1) + 1
    runs = [(int(r[0]), int(r[-1])) for r in np.split(frames, breaks)]
    text = ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in runs[:most])
    return text + (f" and {len(runs) - most} more run(s)" if len(runs) > most else "")


def require_every_frame(probs: pd.DataFrame, frames: pd.DataFrame, probs_path, index_path) -> None:
    """Every (video_id, frame) of the index has a probability row (an undecodable frame has one,
    `valid=false`), else one line naming the file, the first video lacking rows and those rows.
    Without this a video missing from the probabilities vanished from the submission, and a
    video cut short lost its events past the cut, with exit 0."""
    have = pd.MultiIndex.from_frame(probs[["video_id", "frame"]].astype({"video_id": str}))
    wanted = frames[["video_id", "frame"]].astype({"video_id": str})
    missing = wanted[~pd.MultiIndex.from_frame(wanted).isin(have)]
    if missing.empty:
        return
    videos = list(dict.fromkeys(missing["video_id"]))
    video = videos[0]
    rows = np.sort(missing.loc[missing["video_id"] == video, "frame"].to_numpy(np.int64))
    whole = len(rows) == int((wanted["video_id"] == video).sum())
    what = "every frame" if whole else f"frame(s) {_ranges(rows)}"
    raise DataError(f"{probs_path} lacks {len(missing)} row(s) of {index_path} in {len(videos)} video(s) "
                    f"{videos[:5]}: video {video} {what} ({len(rows)} row(s)); the submission would lack them: "
                    "rerun predict_test")


# ----------------------------------------------------------------------------- the frame axis


@dataclass
class Timeline:
    """All videos' frames on one dense axis of P positions (videos separated by unobserved gaps)."""

    video_ids: list[str]
    video_first: np.ndarray  # (V,) dense position of each video's first row
    time: np.ndarray  # (P,) int64 time (event unit) of each position; meaningless in separators
    observed: np.ndarray  # (P,) bool: a valid frame with probabilities
    probs: np.ndarray  # (17, P) float32, NaN where not observed; label-major for column passes
    observed_cum: np.ndarray  # (P+1,) int64 prefix count of observed positions
    max_reach: int  # no window or gap fill longer than this may be used on this timeline
    prob_cums: dict = field(default_factory=dict)  # caches derived from probs, filled lazily: label -> (P+1,) prefix sums; ("logits", k); ("peak", k), "region_logits", "seen_bounds", ("ar", k, ...) (vce.post.runs, vce.post.engine, vce.post.arhmm)
    region_paths: dict = field(default_factory=dict)  # decoding key -> (P,) decoded region path (vce.post.anatomy)

    def with_probs(self, probs: np.ndarray) -> Timeline:
        """The same axis with other (17, P) probabilities (caches of the old ones left behind)."""
        return replace(self, probs=probs, prob_cums={}, region_paths={})


def build_timeline(
    frame_probs: pd.DataFrame, time_col: str = "t", max_reach: int = 64, columns=LABELS
) -> Timeline:
    """Lay the rows of `frame_probs` on a dense axis; gaps longer than `max_reach` are shortened.

    A gap of missing times is kept as unobserved positions up to `max_reach + 1` long: no median
    window half-width or gap fill up to `max_reach` can see across a longer one, so shortening
    it changes nothing.
    """
    missing = [c for c in ("video_id", time_col, *columns) if c not in frame_probs.columns]
    if missing:
        raise DataError(f"frame probabilities lack column(s) {missing}")
    cap = max_reach + 1
    video_codes, video_ids = pd.factorize(frame_probs["video_id"], sort=False)
    times = frame_probs[time_col].to_numpy(dtype=np.int64)
    order = np.lexsort((times, video_codes))
    video_codes, times = video_codes[order], times[order]
    n = len(times)
    new_video = np.ones(n, dtype=bool)
    new_video[1:] = video_codes[1:] != video_codes[:-1]
    step = np.zeros(n, dtype=np.int64)  # no rows (no test set, every frame invalid): an empty timeline
    step[1:] = times[1:] - times[:-1]
    duplicate = (~new_video) & (step == 0)
    if duplicate.any():
        r = int(np.flatnonzero(duplicate)[0])
        raise DataError(f"frame probabilities: duplicate row for video {video_ids[video_codes[r]]} {time_col}={times[r]}")
    # 1. Positions: each row after the missing frames before it (capped); `cap` separates videos.
    inserted = np.where(new_video, cap, np.minimum(step - 1, cap))
    position = np.arange(n) + np.cumsum(inserted)
    size = int(position[-1]) + 1 + cap if n else cap
    # 2. Time of every position: the last row at or before it, plus the frames since.
    last_row = np.full(size, -1, dtype=np.int64)
    last_row[position] = np.arange(n)
    last_row = np.maximum.accumulate(last_row)
    before_first = last_row < 0
    last_row[before_first] = 0
    time = times[last_row] + (np.arange(size) - position[last_row]) if n else np.zeros(size, np.int64)
    # 3. Observed frames and their probabilities (invalid rows stay unobserved), column by column.
    in_order = bool((order == np.arange(n)).all())
    probs = np.full((len(columns), size), np.nan, dtype=np.float32)
    valid = np.ones(n, dtype=bool)
    for k, label in enumerate(columns):
        column = frame_probs[label].to_numpy(dtype=np.float32)
        column = column if in_order else column[order]
        valid &= np.isfinite(column)
        probs[k, position] = column
    if "valid" in frame_probs.columns:
        flags = frame_probs["valid"].to_numpy(dtype=bool)
        valid &= flags if in_order else flags[order]
    if not valid.all():
        probs[:, position[~valid]] = np.nan
    observed = np.zeros(size, dtype=bool)
    observed[position[valid]] = True
    observed_cum = np.concatenate([[0], np.cumsum(observed, dtype=np.int64)])
    return Timeline(
        video_ids=[str(v) for v in video_ids],
        video_first=position[new_video],
        time=time,
        observed=observed,
        probs=probs,
        observed_cum=observed_cum,
        max_reach=max_reach,
    )
