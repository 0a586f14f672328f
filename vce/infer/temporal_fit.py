"""The temporal model fitted on the pipeline's splits: training, cross-fitted validation, test.

The stage `temporal` reads the frame model's embeddings (`<split>_embeddings.parquet` beside
its probabilities) and the split frame index. The model learns from the training videos and
refines validation and test. With k > 1 folds (data/ensemble: every labelled video is out of
fold, so "train" and "val" are the same videos) the validation probabilities are
**cross-fitted**: the videos fold j held out are refined by a model trained on the other
folds' videos only, so thresholds and the score engine tune on probabilities no model saw the
labels of; the test set (and the saved model) gets the model trained on every labelled video.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from vce.core.contracts import label_matrix, read_probs
from vce.core.errors import DataError
from vce.core.labels import LABELS
from vce.eval.frame_metrics import frame_metrics
from vce.infer.temporal import (
    Sequences,
    TemporalConvNet,
    TemporalParams,
    align,
    build_sequences,
    read_embeddings,
    refine,
    select_videos,
    train_temporal,
)
from vce.train.losses import LossParams

SPLITS = ("train", "val", "test")


@dataclass
class TemporalFit:
    """The model trained on every training video, the refined (cross-fitted) validation and the
    test probabilities with their sequences, and what the stage writes to metrics/temporal.json."""

    model: TemporalConvNet
    val: Sequences
    val_probs: np.ndarray  # (N, 17) float32
    test: Sequences
    test_probs: np.ndarray
    metrics: dict


def missing_embeddings(predict_dir: Path) -> list[str]:
    """The `<split>_embeddings.parquet` files of `SPLITS` that `predict_dir` lacks."""
    return [str(predict_dir / f"{split}_embeddings.parquet") for split in SPLITS
            if not (predict_dir / f"{split}_embeddings.parquet").is_file()]


def load_split(predict_dir: Path, split: str, labelled_frames: pd.DataFrame | None) -> Sequences:
    """Sequences of one split: embeddings, valid flags from its probabilities, labels if given."""
    frames, embeddings = read_embeddings(predict_dir / f"{split}_embeddings.parquet")
    probs_path = predict_dir / f"{split}.parquet"
    valid = None
    if probs_path.is_file():
        valid = align(frames, read_probs(probs_path, ["valid"]), ["valid"], str(probs_path))
        valid = valid["valid"].to_numpy(bool)
    labels = None
    if labelled_frames is not None:
        labels = align(frames, labelled_frames, list(LABELS), "the split frame index").to_numpy("uint8")
    return build_sequences(frames, embeddings, valid, labels)


def video_ids(seq: Sequences) -> list[str]:
    """The videos of `seq`, in order."""
    return list(dict.fromkeys(seq.frames["video_id"].astype(str)))


def held_out_folds(frames: pd.DataFrame, val: Sequences, train: Sequences) -> dict[int, set[str]]:
    """fold → its validation videos, when validation must be cross-fitted (k folds), else {}.

    Cross-fitting is needed when the temporal model's training videos include validation
    videos (data/ensemble with k folds trains on every out-of-fold video); the folds come from
    the index's `fold` column (the fold that held each video out).
    """
    val_videos = set(video_ids(val))
    if not val_videos & set(video_ids(train)):
        return {}
    first = frames.drop_duplicates("video_id")
    fold_of = dict(zip(first["video_id"].astype(str), first["fold"].astype(int))) if "fold" in frames else {}
    folds: dict[int, set[str]] = {}
    for video in sorted(val_videos):
        folds.setdefault(int(fold_of.get(video, -1)), set()).add(video)
    if -1 in folds or len(folds) < 2:
        raise DataError(f"{sorted(val_videos & set(video_ids(train)))[:5]}…: validation videos are also the "
                        "temporal model's training videos but the frame index gives them no two folds to cross-fit "
                        "(its `fold` column): rerun the split and ensemble stages")
    return folds


def fit_temporal(predict_dir: Path, frames: pd.DataFrame, params: TemporalParams, loss_params: LossParams,
                 seed: int, device: torch.device) -> TemporalFit:
    """Train on the training split's embeddings (labels from `frames`, the split frame index), refine
    validation (cross-fitted when it shares videos with training: `held_out_folds`) and test.

    Labels come from the whole index: with k folds every labelled video is "val" and its
    out-of-fold embeddings are also the training set. Fold j's model is seeded `seed + 1 + j`."""
    label_matrix(frames)  # raises naming a missing label column
    train = load_split(predict_dir, "train", frames)
    val = load_split(predict_dir, "val", frames[frames["split"] == "val"])
    test = load_split(predict_dir, "test", None)
    model, losses = train_temporal(train, params, loss_params, seed, device)
    held_out = held_out_folds(frames, val, train)
    val_probs = refine(model, val, device)
    for fold, videos in held_out.items():  # each fold's videos refined by a model that never saw them
        fold_model, _ = train_temporal(select_videos(train, set(video_ids(train)) - videos), params, loss_params,
                                       seed + 1 + fold, device)
        rows = val.frames["video_id"].astype(str).isin(videos).to_numpy()
        val_probs[rows] = refine(fold_model, select_videos(val, videos), device)
    metrics = {"enabled": True, "device": device.type, "train_frames": len(train.frames),
               "train_videos": len(train.offsets) - 1, "final_loss": losses[-1] if losses else None,
               "cross_fitted_folds": len(held_out)}
    metrics |= _frame_maps(predict_dir, val, val_probs)
    return TemporalFit(model, val, val_probs, test, refine(model, test, device), metrics)


def _frame_maps(predict_dir: Path, val: Sequences, val_probs: np.ndarray) -> dict:
    """Validation frame mAP of the refined probabilities (`frame_map`) and of the frame model's
    (`input_frame_map`), where validation is labelled."""
    out = {}
    if val.labels is None:
        return out
    if len(val.frames):
        out["frame_map"] = frame_metrics(val.labels, val_probs)["map"]
    if (predict_dir / "val.parquet").is_file():
        frame_probs = align(val.frames, read_probs(predict_dir / "val.parquet"), list(LABELS), "val probabilities")
        out["input_frame_map"] = frame_metrics(val.labels, frame_probs.to_numpy("float32"))["map"]
    return out
