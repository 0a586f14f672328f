"""Joining predictions to the frame index, and the time axis events are written in.

Events of Galar videos are in `index` units (the official ground truth is built that way);
events of RARE-VISION test videos use the file's frame number. The index says which, per
row, in `event_unit`; `t` is the resulting event time of every frame.
"""

from __future__ import annotations

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
