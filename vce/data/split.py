"""Train/validation split by video, stratified so validation sees as many rare labels as it can.

No video is in both parts (frames of one video are strongly correlated). Among `candidates`
random assignments of videos to parts (deterministic from the seed), the kept one maximises, in
order: labels with positives in both train and validation; labels with positives in validation;
coverage weighted towards labels present in few videos; then balance (each label's share of
positive frames in validation close to the validation share of videos).
With k = len(`folds`) > 1 the videos are cut into k folds, scored summed over folds; the
`split` column then marks fold 0 as the validation part (each fold's model reads its own view,
`vce.data.folds.fold_frames`).
`test_videos` are labelled videos held out before any of that: in no part and no fold, never
trained on nor tuned on, predicted and scored like the test set (split "test").
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from pydantic import Field, model_validator

from vce.core.errors import DataError, ParamsError
from vce.core.labels import LABELS
from vce.core.params import Section, Seed


class SplitParams(Section):
    """`split`: the train/validation split by video."""

    seed: Seed
    val_fraction: float = Field(gt=0, lt=1)
    folds: list[int] = Field(min_length=1)
    candidates: int = Field(ge=1)
    val_videos: list[str | int]
    test_videos: list[str | int]

    @property
    def n_folds(self) -> int:
        """k: the one key `folds` lists the fold ids 0..k-1 (DVC's train/predict matrix iterates it)."""
        return len(self.folds)

    @model_validator(mode="after")
    def _fold_exists(self):
        self.require(len(set(map(str, self.test_videos))) == len(self.test_videos), "test_videos",
                     f"lists a video twice: {self.test_videos}")
        both = sorted(set(map(str, self.val_videos)) & set(map(str, self.test_videos)))
        self.require(not both, "test_videos",
                     f"video(s) {both} are also in split.val_videos: a video is validation or test, not both")
        self.require(not self.val_videos or self.n_folds == 1, "val_videos",
                     f"explicit validation videos need one split, split.folds = [0] (it lists {self.n_folds} folds)")
        self.require(len(set(map(str, self.val_videos))) == len(self.val_videos), "val_videos",
                     f"lists a video twice: {self.val_videos}")
        self.require(self.folds == list(range(self.n_folds)), "folds",
                     f"must be the fold ids 0..k-1 in order, e.g. {list(range(self.n_folds))} for k = {self.n_folds} "
                     "folds ([0]: one train/validation split; dvc.yaml's train/predict matrix runs one entry per item)")
        return self


def video_positives(frames: pd.DataFrame) -> pd.DataFrame:
    """Positive frame counts per video (rows, sorted ids) and label (columns)."""
    missing = [label for label in LABELS if label not in frames.columns]
    if missing:
        raise DataError(f"frame index has no label column(s) {missing}")
    return frames.groupby("video_id", sort=True)[list(LABELS)].sum().astype(np.int64)


def group_sizes(n_videos: int, cfg: SplitParams) -> list[int]:
    """Videos per group: [train, val] for one split, else the folds' sizes."""
    if cfg.n_folds == 1:
        if n_videos < 2:
            raise DataError(f"a split by video needs at least 2 videos, the index has {n_videos}")
        n_val = int(np.clip(round(cfg.val_fraction * n_videos), 1, n_videos - 1))
        return [n_videos - n_val, n_val]
    if n_videos < cfg.n_folds:
        raise DataError(f"split.folds = {cfg.folds}: {cfg.n_folds} folds need at least that many videos, "
                         f"the index has {n_videos}")
    return [len(part) for part in np.array_split(np.arange(n_videos), cfg.n_folds)]


def _scores(held_out: np.ndarray, positives: np.ndarray, held_share: float) -> np.ndarray:
    """Score keys (4, C) of candidates whose held-out videos are `held_out` (C, V) bool."""
    present = (positives > 0).astype(np.int64)  # (V, L)
    rarity = 1.0 / np.maximum(present.sum(0), 1)  # (L,) labels in few videos weigh more
    val_has = held_out.astype(np.int64) @ present > 0  # (C, L)
    train_has = (~held_out).astype(np.int64) @ present > 0
    val_frames = held_out.astype(np.float64) @ positives  # (C, L)
    share = val_frames / np.maximum(positives.sum(0), 1)
    return np.stack([
        (val_has & train_has).sum(1),
        val_has.sum(1),
        (val_has & train_has) @ rarity,
        -np.abs(share - held_share).sum(1),
    ])


def assign_groups(positives: pd.DataFrame, cfg: SplitParams) -> np.ndarray:
    """Group of each video (V,): 0 train / 1 val for one split, else the fold number."""
    n_videos = len(positives)
    sizes = group_sizes(n_videos, cfg)
    rng = np.random.default_rng(cfg.seed)
    # 1. Candidates: random orders of the videos cut into consecutive groups of `sizes`.
    order = np.argsort(rng.random((cfg.candidates, n_videos)), axis=1)  # (C, V)
    block = np.repeat(np.arange(len(sizes)), sizes)  # (V,) group of each position
    groups = np.empty_like(order)
    np.put_along_axis(groups, order, block[None, :], axis=1)  # (C, V) group of each video
    # 2. Score every candidate; for k folds sum the scores of each fold held out.
    values = positives.to_numpy().astype(np.float64)
    held = [1] if cfg.n_folds == 1 else range(cfg.n_folds)
    keys = sum(_scores(groups == g, values, sizes[g] / n_videos) for g in held)
    # 3. Keep the best (lexsort: last key is primary); the earliest candidate wins ties.
    ranking = np.lexsort((np.arange(cfg.candidates), *(-k for k in keys[::-1])))
    return groups[ranking[0]]


def checked_ids(ids: list, known: list[str], key: str) -> list[str]:
    """`ids` as strings, each one a video of the index, else a ParamsError naming `split.<key>`."""
    wanted = [str(v) for v in ids]
    unknown = [v for v in wanted if v not in set(known)]
    if unknown:
        shown = list(known[:20]) + (["..."] if len(known) > 20 else [])
        raise ParamsError(f"split.{key}: unknown video id(s) {unknown}; the frame index has {shown}")
    return wanted


def explicit_groups(positives: pd.DataFrame, val_videos: list) -> np.ndarray:
    """Group of each video (V,): 1 for the ids of `split.val_videos`, checked against the index."""
    known = positives.index.astype(str)
    wanted = checked_ids(val_videos, list(known), "val_videos")
    if len(wanted) == len(known):
        raise ParamsError(f"split.val_videos: lists all {len(known)} videos; training needs at least one")
    return np.isin(known, wanted).astype(np.int64)


def held_out_mask(frames: pd.DataFrame, cfg: SplitParams) -> np.ndarray:
    """(N,) bool: the frames of the videos `split.test_videos` holds out, ids checked against the index."""
    videos = frames["video_id"].astype(str)
    known = sorted(set(videos))
    wanted = checked_ids(cfg.test_videos, known, "test_videos")
    left, needed = len(known) - len(wanted), 2 if cfg.n_folds == 1 else cfg.n_folds
    if wanted and left < needed:
        raise ParamsError(f"split.test_videos: holds out {len(wanted)} of the {len(known)} labelled videos, "
                          f"{left} left for training and validation; split.folds = {cfg.folds} needs at least {needed}")
    return videos.isin(wanted).to_numpy()


def split_frames(frames: pd.DataFrame, cfg: SplitParams) -> tuple[pd.DataFrame, dict]:
    """(frames with a `split` column "train"/"val"/"test", summary of counts per split).

    "test" rows are the videos of `split.test_videos` (fold -1: no fold trains on them, none
    validates on them); every other video is assigned among the remaining ones only.
    """
    held = held_out_mask(frames, cfg)
    test = frames[held]
    frames = frames[~held].reset_index(drop=True)
    positives = video_positives(frames)
    groups = explicit_groups(positives, cfg.val_videos) if cfg.val_videos else assign_groups(positives, cfg)
    val_group = 1 if cfg.n_folds == 1 else 0
    is_val = pd.Series(groups == val_group, index=positives.index)
    out = frames.copy()
    out["split"] = np.where(out["video_id"].map(is_val).to_numpy(dtype=bool), "val", "train")
    # The fold that holds each video out (vce.data.folds): with one split, validation is fold 0
    # and training videos are held out by no fold (-1).
    held_out_by = groups if cfg.n_folds > 1 else np.where(groups == 1, 0, -1)
    out["fold"] = out["video_id"].map(pd.Series(held_out_by, index=positives.index)).to_numpy(np.int64)
    summary = summarise(out, positives, is_val, groups, cfg)
    if len(test):
        out = pd.concat([out, test.assign(split="test", fold=np.int64(-1))], ignore_index=True)
        test_positives = video_positives(test)
        summary["test"] = {  # only when set: metrics/split.json is unchanged without test videos
            "videos": test_positives.index.tolist(), "n_frames": len(test),
            "positive_frames": {label: int(test_positives[label].sum()) for label in LABELS},
            "positive_videos": {label: int((test_positives[label] > 0).sum()) for label in LABELS}}
    return out, summary


def summarise(frames: pd.DataFrame, positives: pd.DataFrame, is_val: pd.Series,
              groups: np.ndarray, cfg: SplitParams) -> dict:
    parts = {"train": ~is_val, "val": is_val}
    summary = {
        "seed": cfg.seed, "n_folds": cfg.n_folds, "fold": 0,
        "chosen_by": "split.val_videos" if cfg.val_videos else "search",
        "n_videos": {name: int(mask.sum()) for name, mask in parts.items()},
        "n_frames": {name: int((frames["split"] == name).sum()) for name in parts},
        "videos": {name: positives.index[mask.to_numpy()].tolist()
                   for name, mask in parts.items()},
        "positive_frames": {label: {name: int(positives.loc[mask.to_numpy(), label].sum())
                                    for name, mask in parts.items()} for label in LABELS},
        "positive_videos": {label: {name: int((positives.loc[mask.to_numpy(), label] > 0).sum())
                                    for name, mask in parts.items()} for label in LABELS},
    }
    summary["labels_without_val_positives"] = [
        label for label in LABELS if summary["positive_videos"][label]["val"] == 0]
    if cfg.n_folds > 1:
        summary["fold_of_video"] = {v: int(g) for v, g in zip(positives.index, groups)}
    return summary
