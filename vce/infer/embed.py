"""Frozen-backbone features: every frame through the image tower once (stage `embed`), and the
probe heads applied to them (predict of a frozen model).

The frames stream through `predict_sharded`, the same data path, batching, devices and
undecodable-frame handling as predict; its probabilities (of untrained heads) go to a scratch
file and only the embeddings, with each frame's valid flag, are kept (`vce.data.features`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import torch

from vce.core.contracts import embeddings_schema
from vce.core.io import atomic_path, outside_output_set
from vce.data.features import features_table
from vce.infer.predict import PredictParams, predict_sharded
from vce.infer.sink import embedding_table, probs_table


def embed_frames(model, frames: pd.DataFrame, root, out: Path, params: PredictParams, device,
                 cache=None, max_pixels: int | None = None, desc: str = "embed", is_main: bool = True) -> dict:
    """Features of every row of `frames` (sorted by video, frame) into `out` (Parquet, atomic).

    `predict.tta_flip` is not applied: a frozen backbone's feature is the frame's own.
    Returns predict's counts (frames, invalid frames and their first paths).
    """
    params = params.model_copy(update={"tta_flip": False, "embeddings": True})
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".embed_", dir=out.parent) as scratch:
        probs_path, emb_path = Path(scratch) / "probs.parquet", Path(scratch) / "embeddings.parquet"
        with outside_output_set():  # scratch read back at once, not outputs of the stage
            report = predict_sharded(model, frames, root, probs_path, params, device, emb_path, desc=desc,
                                     cache=cache, max_pixels=max_pixels)
        if is_main:
            _join_valid(probs_path, emb_path, out)
    return report


def _join_valid(probs_path: Path, emb_path: Path, out: Path) -> None:
    """The embeddings file with predict's valid flag added, row group by row group (both files
    are written in the same blocks, so memory stays one block)."""
    probs, embeddings = pq.ParquetFile(probs_path), pq.ParquetFile(emb_path)
    dim = embeddings.schema_arrow.field("embedding").type.list_size
    with atomic_path(out) as tmp:
        writer = None
        try:
            for group in range(embeddings.num_row_groups):
                block = embeddings.read_row_group(group)
                valid = probs.read_row_group(group, columns=["valid"]).column("valid").to_numpy()
                if len(valid) != block.num_rows:
                    raise RuntimeError(f"{probs_path}: row group {group} does not match the embeddings'")
                table = features_table(block.column("video_id").to_numpy(zero_copy_only=False),
                                       block.column("frame").to_numpy(), valid,
                                       block.column("embedding").combine_chunks())
                writer = writer or pq.ParquetWriter(tmp, table.schema)
                writer.write_table(table)
            if writer is None:  # no frames: an empty table of the tower's width
                empty = embeddings_schema(dim).empty_table()
                table = features_table(np.array([], str), np.array([], np.int64), np.array([], bool),
                                       empty.column("embedding").combine_chunks())
                writer = pq.ParquetWriter(tmp, table.schema)
                writer.write_table(table)
        finally:
            if writer is not None:
                writer.close()


@torch.no_grad()
def probe_predict(model, frames: pd.DataFrame, features: np.ndarray, valid: np.ndarray, probs_out: Path,
                  embeddings_out: Path | None, batch_size: int, device) -> dict:
    """A frozen model's predictions from its cached features: the heads on each row's feature.

    Writes the probabilities contract (NaN where the frame was undecodable) and, when asked, the
    features themselves as the embeddings (byte for byte what the temporal stage would get from a
    forward pass, up to the float16 storage both share).
    """
    frames = frames.reset_index(drop=True).assign(video_id=lambda f: f["video_id"].astype(str))
    order = frames.sort_values(["video_id", "frame"], kind="stable").index.to_numpy()  # predict's order
    frames = frames.iloc[order].reset_index(drop=True)
    features, valid = features[order], valid[order]
    model = model.to(device).eval()
    probs = np.full((len(frames), model.classifier.out_features), np.nan, np.float32)
    for start in range(0, len(frames), batch_size):
        block = torch.from_numpy(features[start:start + batch_size].astype(np.float32)).to(device)
        probs[start:start + len(block)] = model.frame_probs(model.heads(block)).float().cpu().numpy()
    probs[~valid] = np.nan
    if not np.isfinite(probs[valid]).all():
        raise RuntimeError("the probe heads output NaN/inf on a decoded frame's features: their weights are not usable")
    with atomic_path(probs_out) as tmp:
        pq.write_table(probs_table(frames, probs, valid), tmp)
    if embeddings_out is not None:
        with atomic_path(embeddings_out) as tmp:
            pq.write_table(embedding_table(frames, features), tmp)
    invalid = frames.loc[~valid, "path"].astype(str).tolist() if "path" in frames else []
    return {"frames": len(frames), "invalid_frames": int((~valid).sum()), "invalid_examples": invalid[:100]}
