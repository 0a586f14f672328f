"""The temporal model fitted without in-sample outputs: cross-fitted validation, test, the route.

The frame model's probabilities and embeddings of its own training videos are in-sample: it
has memorised their labels (training loss ~6e-4), so a sequence model trained on them learns
how the frame model behaves where it is always right (issue 31 measured the temporal route
lowering held-out blood AUC in 4 of 4 real-pixel runs). The temporal model therefore learns
only from embeddings of videos the frame model never trained on, and every probability it
outputs for a labelled video comes from a model that did not train on that video:

1. The training set is the validation split (`val_embeddings.parquet`): with one split, the
   videos the frame model validated on; with k > 1 folds (data/ensemble), every labelled video,
   each embedded by the fold model that held it out (out of fold). `train` embeddings are never read.
2. Validation is **cross-fitted** over groups of validation videos: with k folds the folds
   (the index's `fold` column), with one split `min(#validation videos, temporal.cross_fit)`
   groups dealt from a seeded shuffle. Group g's videos are refined by a model trained on the
   other groups (seed `seed + 1 + g`).
3. The test set, and the saved model, get the model trained on every validation video (seed `seed`).

`provenance` records, per refined video, the training videos of the model that refined it
(tests assert it is disjoint from the video). One validation video cannot be cross-fitted:
`fit_temporal` then raises `TooFewVideos` (the stage refuses `post.probs: temporal`; `auto`
falls back to the frame model).
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
from vce.infer.route import RouteChoice, RouteRule, choose_routes, fixed_routes, mix
from vce.infer.temporal import (
    Sequences,
    TemporalConvNet,
    TemporalParams,
    align,
    build_sequences,
    probs_frame,
    read_embeddings,
    refine,
    sequences_of_videos,
    train_temporal,
)
from vce.train.losses import LossParams

SPLITS = ("val", "test")  # what the temporal model reads: never the frame model's training videos


class TooFewVideos(DataError):
    """Fewer than two validation videos: no cross-fitted (out-of-sample) temporal evidence exists."""


@dataclass
class TemporalFit:
    """The model trained on every validation video, the cross-fitted validation and the test
    probabilities with their sequences, who trained on what, and metrics/temporal.json."""

    model: TemporalConvNet
    val: Sequences
    val_probs: np.ndarray  # (N, 17) float32, cross-fitted
    test: Sequences
    test_probs: np.ndarray
    provenance: dict[str, frozenset[str]]  # refined video -> training videos of the model that refined it
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


def cross_fit_groups(frames: pd.DataFrame, videos: list[str], cross_fit: int, seed: int) -> tuple[str, list[set[str]]]:
    """(scheme, groups of `videos`): by fold when the index's `fold` column spreads them over ≥ 2
    folds (k-fold data/ensemble), else `min(len(videos), cross_fit)` groups of a seeded shuffle.

    Raises TooFewVideos for a single video: it cannot be refined by a model that did not train on it."""
    first = frames.drop_duplicates("video_id")
    fold_of = dict(zip(first["video_id"].astype(str), first["fold"].astype(int))) if "fold" in frames else {}
    folds = {int(fold_of.get(video, -1)) for video in videos}
    if len(folds) >= 2 and -1 not in folds:
        return "folds", [{v for v in videos if fold_of[v] == fold} for fold in sorted(folds)]
    if len(videos) < 2:
        raise TooFewVideos(f"{len(videos)} validation video(s) {videos}: the temporal model learns only from "
                           "validation videos and needs ≥ 2 to cross-fit them")
    shuffled = np.random.default_rng(seed).permutation(sorted(videos))
    return "validation_groups", [set(part.tolist()) for part in np.array_split(shuffled, min(len(videos), cross_fit))]


def fit_temporal(predict_dir: Path, frames: pd.DataFrame, params: TemporalParams, loss_params: LossParams,
                 seed: int, device: torch.device) -> TemporalFit:
    """Train on the validation videos' embeddings (labels from `frames`, the split frame index),
    cross-fit validation over `cross_fit_groups`, refine test with the model trained on all of them."""
    label_matrix(frames)  # raises naming a missing label column
    val = load_split(predict_dir, "val", frames)
    test = load_split(predict_dir, "test", None)
    videos = video_ids(val)
    scheme, groups = cross_fit_groups(frames, videos, params.cross_fit, seed)
    model, losses = train_temporal(val, params, loss_params, seed, device)
    val_probs = np.full((len(val.frames), len(LABELS)), np.nan, np.float32)
    provenance: dict[str, frozenset[str]] = {}
    for g, held in enumerate(groups):  # each group's videos refined by a model that never saw them
        trained_on = frozenset(videos) - held
        group_model, _ = train_temporal(sequences_of_videos(val, set(trained_on)), params, loss_params, seed + 1 + g, device)
        rows = val.frames["video_id"].astype(str).isin(held).to_numpy()
        val_probs[rows] = refine(group_model, sequences_of_videos(val, held), device)
        provenance |= dict.fromkeys(sorted(held), trained_on)
    provenance |= dict.fromkeys(video_ids(test), frozenset(videos))
    metrics = {"enabled": True, "device": device.type, "train_frames": len(val.frames), "train_videos": len(videos),
               "final_loss": losses[-1] if losses else None,
               "cross_fit": {"scheme": scheme, "groups": [sorted(g) for g in groups]}}
    metrics |= _frame_maps(predict_dir, val, val_probs)
    return TemporalFit(model, val, val_probs, test, refine(model, test, device), provenance, metrics)


def _frame_maps(predict_dir: Path, val: Sequences, val_probs: np.ndarray) -> dict:
    """Validation frame mAP of the cross-fitted refined probabilities (`frame_map`) and of the frame
    model's (`input_frame_map`)."""
    out = {"frame_map": frame_metrics(val.labels, val_probs)["map"]}
    if (predict_dir / "val.parquet").is_file():
        out["input_frame_map"] = frame_metrics(val.labels, frame_probs(predict_dir / "val.parquet", val))["map"]
    return out


def frame_probs(path: Path, seq: Sequences) -> np.ndarray:
    """(N, 17) float32: the frame model's probabilities at `seq`'s rows (NaN where invalid)."""
    return align(seq.frames, read_probs(path), list(LABELS), str(path)).to_numpy("float32")


@dataclass
class Routed:
    """What the stage writes: data/temporal's probabilities and metrics/route.json's choice."""

    val: pd.DataFrame
    test: pd.DataFrame
    choice: RouteChoice
    reason: str | None


def route_rule(post, seed: int) -> RouteRule:
    """The route rule of the `post` section (`PostParams`), its bootstrap seeded by `base.seed`."""
    return RouteRule(post.route_min_gain, post.route_confidence, post.route_block_frames, post.route_replicates, seed,
                     post.route_regions_together, post.route_min_positive_blocks)


def route_fit(fitted: TemporalFit, predict_dir: Path, source: str, rule: RouteRule) -> Routed:
    """Per-label routes on the cross-fitted evidence (`vce.infer.route`). For `post.probs: auto`
    data/temporal holds each label's routed probabilities (what thresholds, events and report
    read); for `frame` and `temporal` it holds the temporal model's own."""
    frame_val = frame_probs(predict_dir / "val.parquet", fitted.val)
    evidence = choose_routes(fitted.val.labels, frame_val, fitted.val_probs,
                             fitted.val.frames["video_id"].astype(str).to_numpy(), rule)
    if source != "auto":
        choice = RouteChoice(fixed_routes(source), evidence.evidence)
        return Routed(probs_frame(fitted.val, fitted.val_probs), probs_frame(fitted.test, fitted.test_probs),
                      choice, f"post.probs: {source} (fixed)")
    frame_test = frame_probs(predict_dir / "test.parquet", fitted.test)
    return Routed(probs_frame(fitted.val, mix(frame_val, fitted.val_probs, evidence.routes)),
                  probs_frame(fitted.test, mix(frame_test, fitted.test_probs, evidence.routes)), evidence, None)


def frame_fallback(predict_dir: Path, reason: str) -> Routed:
    """`auto` without cross-fitted temporal evidence: every label on the frame model's probabilities."""
    val, test = (read_probs(predict_dir / f"{split}.parquet") for split in ("val", "test"))
    return Routed(val, test, RouteChoice(fixed_routes("frame"), {}), reason)
