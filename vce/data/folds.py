"""K-fold views of the split frame index: which videos fold k trains on and which it holds out.

The split stage writes a `fold` column: the fold whose model holds each video out (never
trains on it). With one split (`split.folds: [0]`) the validation videos are fold 0 and the training
videos -1 (held out by no fold), so fold 0 of one split is today's train/validation split.
`fold_frames(frames, k)` rewrites the `split` column for model k: "val" for its held-out
videos, "train" for every other labelled video.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from vce.core.errors import DataError


def fold_frames(frames: pd.DataFrame, fold: int, where: str = "the split frame index") -> pd.DataFrame:
    """`frames` with `split` = "val" where fold `fold` holds the video out, else "train"."""
    if "fold" not in frames.columns:
        raise DataError(f"{where} has no 'fold' column (written by an older split stage): rerun the split stage")
    held_out = frames["fold"].to_numpy() == fold
    if not held_out.any():
        folds = sorted(int(f) for f in frames["fold"].unique() if f >= 0)
        raise DataError(f"{where}: fold {fold} holds out no video (folds present: {folds}); "
                        "split.folds must agree with the split stage's output: rerun the split stage")
    out = frames.copy()
    out["split"] = np.where(held_out, "val", "train")
    return out


def held_out_videos(frames: pd.DataFrame, fold: int) -> list[str]:
    """Sorted ids of the videos fold `fold` holds out."""
    return sorted(frames.loc[frames["fold"].to_numpy() == fold, "video_id"].astype(str).unique())


def check_unseen(held_out: list[str], trained_on: list[str] | None, fold: int, where: str,
                 holder: str | None = None) -> None:
    """Raise unless no held-out video (of fold `fold`, or of `holder`) is among the model's training videos."""
    holder = holder or f"fold {fold}"
    if trained_on is None:
        raise DataError(f"{where} does not record its training videos (an older train stage): "
                        f"retrain it before predicting fold {fold} out of fold")
    seen = sorted(set(held_out) & set(trained_on))
    if seen:
        raise DataError(f"{where} was trained on {len(seen)} video(s) that {holder} holds out, "
                        f"e.g. {seen[0]}: its predictions would not be out of fold (retrain, or rerun split)")
