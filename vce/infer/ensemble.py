"""Fold ensembles: out-of-fold probabilities for every labelled video, fused test probabilities.

Fold k's model (`stages.train --fold k`) never trains on the videos fold k holds out, and
predicts exactly those (`stages.predict --part labelled`). `gather_oof` checks that coverage
(every held-out video predicted exactly once, by a model whose recorded training videos do not
include it) and concatenates the folds' files into one out-of-fold (OOF) file per split, in the
probabilities contract. `member_scores` says what each fold model scores on its own held-out
videos and what the pooled OOF scores; `class_weights` turns those per-class APs into fusion
weights; `fuse` averages the folds' test probabilities (and embeddings) with them.

Memory stays bounded: Parquet is copied and fused row group by row group; only the scoring
holds the OOF probabilities (N × 17 float32) and labels (N × 17 uint8) in memory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from vce.core.contracts import probs_schema, read_probs
from vce.core.errors import DataError
from vce.core.io import atomic_path
from vce.core.labels import LABELS, NUM_LABELS
from vce.core.params import Section
from vce.post.timeline import match_frames


class EnsembleParams(Section):
    """`ensemble`: how the folds' test probabilities are fused."""

    method: Literal["mean", "ap"]


# ----------------------------------------------------------------------------- scores


def frame_average_precision(y_true: np.ndarray, scores: np.ndarray) -> float | None:
    """sklearn's `average_precision_score` (ties as one threshold) by one sort; None without positives."""
    y_true = np.asarray(y_true).astype(bool)
    positives = int(y_true.sum())
    if positives == 0:
        return None
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")
    ranked = np.asarray(scores)[order]
    last_of_value = np.r_[np.flatnonzero(np.diff(ranked) != 0), len(ranked) - 1]
    tps = np.cumsum(y_true[order])[last_of_value]
    precision = tps / (last_of_value + 1)
    recall = tps / positives
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def per_class_ap(y_true: np.ndarray, y_prob: np.ndarray) -> dict[str, float | None]:
    """AP of each label over the rows with finite probabilities (invalid frames left out)."""
    keep = np.isfinite(y_prob).all(axis=1)
    return {label: frame_average_precision(y_true[keep, k], y_prob[keep, k]) for k, label in enumerate(LABELS)}


def mean_ap(aps: dict[str, float | None]) -> float | None:
    defined = [v for v in aps.values() if v is not None]
    return float(np.mean(defined)) if defined else None


def _probs_and_labels(path: Path, frames: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    probs = read_probs(path)[["video_id", "frame", *LABELS]]
    truth = frames[["video_id", "frame", *LABELS]].rename(columns={label: f"true:{label}" for label in LABELS})
    joined = match_frames(probs, truth, f"probability row(s) of {path} are not in the labelled frame index")
    return (joined[list(LABELS)].to_numpy(np.float32),
            joined[[f"true:{label}" for label in LABELS]].to_numpy(np.uint8))


def member_scores(val_paths: dict[int, Path], frames: pd.DataFrame) -> dict:
    """Per-class AP of each fold model on its held-out videos, and of the pooled OOF."""
    members, pooled_probs, pooled_true = {}, [], []
    for fold, path in val_paths.items():
        probs, truth = _probs_and_labels(path, frames)
        aps = per_class_ap(truth, probs)
        members[f"fold_{fold}"] = {"frames": len(probs), "map": mean_ap(aps), "per_class_ap": aps}
        pooled_probs.append(probs)
        pooled_true.append(truth)
    pooled = per_class_ap(np.concatenate(pooled_true), np.concatenate(pooled_probs))
    return {"members": members, "oof": {"frames": int(sum(len(p) for p in pooled_probs)),
                                        "map": mean_ap(pooled), "per_class_ap": pooled}}


def class_weights(members: dict, method: str) -> np.ndarray:
    """(F, 17) fusion weights (columns sum to 1): equal, or proportional to each fold's OOF AP.

    A label a fold cannot score (no positive among its held-out videos) gets no say from that
    fold; a label no fold can score gets equal weights.
    """
    folds = list(members)
    weights = np.full((len(folds), NUM_LABELS), 1.0 / len(folds))
    if method == "mean":
        return weights
    ap = np.array([[members[f]["per_class_ap"][label] or 0.0 for label in LABELS] for f in folds])
    total = ap.sum(axis=0)
    scored = total > 0
    weights[:, scored] = ap[:, scored] / total[scored]
    return weights


# ----------------------------------------------------------------------------- files


def concat_parquet(paths: list[Path], out: Path) -> None:
    """Concatenate Parquet files of one schema into `out`, one row group at a time."""
    schema = pq.read_schema(paths[0])
    with atomic_path(out) as tmp, pq.ParquetWriter(tmp, schema) as writer:
        for path in paths:
            source = pq.ParquetFile(path)
            if not source.schema_arrow.equals(schema):
                raise DataError(f"{path}: schema differs from {paths[0]}'s: {source.schema_arrow} vs {schema}")
            for group in range(source.num_row_groups):
                writer.write_table(source.read_row_group(group))


def _read_coverage(folder: Path) -> dict:
    path = folder / "coverage.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise DataError(f"{path} not found: run `python -m stages.predict --part labelled` for that fold") from None


def check_coverage(frames: pd.DataFrame, fold_dirs: dict[int, Path], n_folds: int) -> dict[int, list[str]]:
    """Held-out videos of each fold, after checking that the OOF predictions are complete and clean.

    Every fold's `val.parquet` holds exactly the videos the split index says it holds out, its
    model never trained on any of them, no video is predicted by two folds, and with k > 1
    folds every labelled video is predicted (with one split: the validation videos).
    """
    owner: dict[str, int] = {}
    held: dict[int, list[str]] = {}
    for fold, folder in fold_dirs.items():
        coverage = _read_coverage(folder)
        expected = sorted(frames.loc[frames["fold"].to_numpy() == fold, "video_id"].astype(str).unique())
        predicted = sorted(pd.read_parquet(folder / "val.parquet", columns=["video_id"])["video_id"].astype(str).unique())
        if coverage.get("fold") != fold or predicted != expected:
            raise DataError(f"{folder}: predicts videos {predicted[:5]}… for fold {coverage.get('fold')}, but the split "
                            f"index has fold {fold} hold out {expected[:5]}… ({len(expected)}): rerun predict@{fold}")
        seen = sorted(set(predicted) & set(coverage["model_train_videos"]))
        if seen:
            raise DataError(f"{folder}: fold {fold}'s model ({coverage['model']}) trained on held-out video(s) "
                            f"{seen[:5]}: its predictions are not out of fold")
        for video in predicted:
            if video in owner:
                raise DataError(f"video {video} is predicted by folds {owner[video]} and {fold}: "
                                "every labelled video must be held out by one fold only")
            owner[video] = fold
        held[fold] = predicted
    labelled = set(frames["video_id"].astype(str))
    missing = sorted(labelled - set(owner)) if n_folds > 1 else []
    if missing:
        raise DataError(f"{len(missing)} labelled video(s) have no out-of-fold prediction, e.g. {missing[0]} "
                        f"(folds predicted: {sorted(fold_dirs)}; split.folds lists {n_folds})")
    return held


def gather_oof(frames: pd.DataFrame, fold_dirs: dict[int, Path], out_dir: Path, n_folds: int,
               embeddings: bool) -> dict:
    """Write the OOF files into `out_dir`; returns the scores (members, pooled OOF).

    - `val.parquet` (+ `val_embeddings.parquet`): every held-out video, from the fold that held it out;
    - `train.parquet` (+ embeddings), what the temporal model learns from: with one split the
      model's own training videos (as before folds), with k folds the OOF files again (every
      labelled video, each predicted by a model that never saw it);
    - `frames.parquet`: the labelled index with `split` "val" for every OOF video (what
      thresholds, events, score and report treat as validation).
    """
    held = check_coverage(frames, fold_dirs, n_folds)
    suffixes = ["", "_embeddings"] if embeddings else [""]
    for suffix in suffixes:
        sources = [fold_dirs[f] / f"val{suffix}.parquet" for f in fold_dirs]
        absent = [str(p) for p in sources if not p.is_file()]
        if absent:
            raise DataError(f"out-of-fold file(s) missing: {absent} (predict.embeddings: {embeddings})")
        concat_parquet(sources, out_dir / f"val{suffix}.parquet")
        if n_folds > 1:
            # From the sources, not the val file above: that is renamed only with the stage's whole
            # output set (vce.core.io.output_set). The same row groups: the same bytes.
            concat_parquet(sources, out_dir / f"train{suffix}.parquet")
        elif (fold_dirs[0] / f"train{suffix}.parquet").is_file():
            concat_parquet([fold_dirs[0] / f"train{suffix}.parquet"], out_dir / f"train{suffix}.parquet")
    oof_videos = {v for videos in held.values() for v in videos}
    labelled = frames.copy()
    labelled["split"] = np.where(labelled["video_id"].astype(str).isin(oof_videos), "val", "train")
    with atomic_path(out_dir / "frames.parquet") as tmp:
        labelled.to_parquet(tmp, index=False)
    scores = member_scores({f: fold_dirs[f] / "val.parquet" for f in fold_dirs}, frames)
    for fold, videos in held.items():
        scores["members"][f"fold_{fold}"]["videos"] = len(videos)
    scores["oof"]["videos"] = len(oof_videos)
    return scores


def fuse(paths: list[Path], weights: np.ndarray, out: Path) -> int:
    """Weighted per-class average of the folds' probabilities (same rows, in the same row groups).

    A frame is valid only where every fold decoded it; returns the number of frames written.
    """
    sources = [pq.ParquetFile(p) for p in paths]
    groups = {s.num_row_groups for s in sources}
    if len(groups) != 1:
        raise DataError(f"fold files have different row groups ({[str(p) for p in paths]}): rerun predict_test")
    frames = 0
    with atomic_path(out) as tmp, pq.ParquetWriter(tmp, probs_schema()) as writer:
        if groups == {0}:
            writer.write_table(probs_schema().empty_table())
        for group in range(groups.pop()):
            tables = [s.read_row_group(group) for s in sources]
            _same_rows(tables, paths, group)
            fused = sum(w[None, :] * _matrix(t) for w, t in zip(weights, tables))
            valid = np.logical_and.reduce([t.column("valid").to_numpy(zero_copy_only=False) for t in tables])
            columns = {"video_id": tables[0].column("video_id"), "frame": tables[0].column("frame")}
            columns.update({label: pa.array(fused[:, k].astype(np.float32)) for k, label in enumerate(LABELS)})
            columns["valid"] = pa.array(valid)
            writer.write_table(pa.Table.from_pydict(columns, schema=probs_schema()))
            frames += len(valid)
    return frames


def fuse_embeddings(paths: list[Path], out: Path) -> None:
    """Mean of the folds' embeddings (float32 sum, written float16), row group by row group."""
    sources = [pq.ParquetFile(p) for p in paths]
    schema = sources[0].schema_arrow
    with atomic_path(out) as tmp, pq.ParquetWriter(tmp, schema) as writer:
        if sources[0].num_row_groups == 0:
            writer.write_table(schema.empty_table())
        for group in range(sources[0].num_row_groups):
            tables = [s.read_row_group(group) for s in sources]
            _same_rows(tables, paths, group)
            dim = schema.field("embedding").type.list_size
            mean = sum(t.column("embedding").combine_chunks().flatten().to_numpy(zero_copy_only=False)
                       .astype(np.float32) for t in tables) / len(tables)
            values = pa.FixedSizeListArray.from_arrays(pa.array(mean.astype(np.float16)), dim)
            writer.write_table(pa.Table.from_arrays([tables[0].column("video_id"), tables[0].column("frame"),
                                                     values], schema=schema))


def _matrix(table: pa.Table) -> np.ndarray:
    return np.column_stack([table.column(label).to_numpy(zero_copy_only=False) for label in LABELS]).astype(np.float64)


def _same_rows(tables: list[pa.Table], paths: list[Path], group: int) -> None:
    first = tables[0]
    for table, path in zip(tables[1:], paths[1:]):
        if not (table.column("video_id").equals(first.column("video_id"))
                and table.column("frame").equals(first.column("frame"))):
            raise DataError(f"{path} and {paths[0]} differ in their frames (row group {group}): "
                            "the folds predicted different test indexes; rerun predict_test")
