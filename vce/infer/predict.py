"""Streaming inference: frames in (video, frame) order → probabilities Parquet, row group by row group.

Memory stays bounded for a video of any length: batches are written as they come. A frame
that cannot be decoded gets a row with valid=False and NaN probabilities (the events stage
treats it as a gap); it is never dropped. Output files appear only when complete (atomic
rename). Under torchrun each rank takes a contiguous block of videos and rank 0 merges.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.distributed as dist
from pydantic import Field
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from vce.core.contracts import embeddings_schema, probs_schema
from vce.core.io import atomic_path
from vce.core.labels import LABELS
from vce.core.params import Section
from vce.data.dataset import FrameDataset, eval_transform, normalize_batch
from vce.data.frame_cache import CachedFrameDataset, FrameCache


class PredictParams(Section):
    """`predict`: frame probabilities (and embeddings) for every split."""

    batch_size: int = Field(ge=1)
    num_workers: int = Field(ge=0)
    tta_flip: bool
    embeddings: bool  # the temporal stage reads them
    splits: list[Literal["train", "val"]]  # labelled splits besides the test set
    device: Literal["auto", "cpu", "cuda"]
    bf16: bool
    compile: bool
    row_group_frames: int = Field(ge=1)
    decoder: Literal["pyspng", "opencv", "pil", "torchvision"]


def _table(frames: pd.DataFrame, probs: np.ndarray, valid: np.ndarray) -> pa.Table:
    columns = {"video_id": frames["video_id"].astype(str).to_numpy(), "frame": frames["frame"].to_numpy(np.int64)}
    columns.update({label: probs[:, i] for i, label in enumerate(LABELS)})
    columns["valid"] = valid
    return pa.Table.from_pydict(columns, schema=probs_schema())


def _embedding_table(frames: pd.DataFrame, embeddings: np.ndarray) -> pa.Table:
    flat = pa.array(embeddings.astype(np.float16).reshape(-1), type=pa.float16())
    values = pa.FixedSizeListArray.from_arrays(flat, embeddings.shape[1])
    return pa.Table.from_arrays([pa.array(frames["video_id"].astype(str).to_numpy()),
                                 pa.array(frames["frame"].to_numpy(np.int64)), values],
                                schema=embeddings_schema(embeddings.shape[1]))


@torch.no_grad()
def _forward(model, images, params: PredictParams, device):
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=params.bf16 and device.type == "cuda"):
        outputs = model(images)
        if params.tta_flip:
            flipped = model(torch.flip(images, dims=[3]))
    floats = lambda out: {k: (v.float() if torch.is_tensor(v) else v) for k, v in out.items()}
    probs = model.frame_probs(floats(outputs))
    embedding = outputs["embedding"].float()
    if params.tta_flip:
        probs = (probs + model.frame_probs(floats(flipped))) / 2
        embedding = (embedding + flipped["embedding"].float()) / 2
    return probs.cpu().numpy(), embedding.cpu().numpy()


def shard_by_video(frames: pd.DataFrame, rank: int, world: int) -> pd.DataFrame:
    """Contiguous block of whole videos for `rank`, balanced by frame count, order kept."""
    if world == 1:
        return frames
    counts = frames.groupby("video_id", sort=False).size()
    bounds = np.searchsorted(np.cumsum(counts.to_numpy()), np.linspace(0, len(frames), world + 1)[1:-1])
    owner = np.searchsorted(bounds, np.arange(len(counts)), side="right")
    mine = set(counts.index[owner == rank])
    return frames[frames["video_id"].isin(mine)]


def predict_frames(model, frames: pd.DataFrame, root, probs_out, params: PredictParams, device,
                   embeddings_out=None, desc: str = "predict", cache: FrameCache | None = None,
                   max_pixels: int | None = None) -> dict:
    """Predict every row of `frames` (sorted by video, frame) into `probs_out` (Parquet).

    Reads pixels from `cache` when given, else decodes the PNGs under `root`.
    Returns counts: frames, invalid frames and their paths (first 100).
    """
    frames = frames.sort_values(["video_id", "frame"], kind="stable").reset_index(drop=True)
    pre = model.preprocess
    transform = eval_transform()
    if cache is not None:
        dataset = CachedFrameDataset(cache, cache.rows_for(frames), None, pre["image_size"], transform, resize=True)
    else:
        dataset = FrameDataset(root, frames["path"].to_numpy(), None, pre["image_size"], pre["image_size"],
                               pre.get("interpolation", "bicubic"), transform, params.decoder, max_pixels)
    loader = DataLoader(dataset, batch_size=params.batch_size, shuffle=False, num_workers=params.num_workers,
                        pin_memory=device.type == "cuda")
    net = torch.compile(model) if params.compile else model
    invalid_paths: list[str] = []
    pending, pending_emb, start = [], [], 0
    with atomic_path(probs_out) as tmp_probs, _maybe_atomic(embeddings_out) as tmp_emb:
        writer = pq.ParquetWriter(tmp_probs, probs_schema())
        emb_writer = None
        show = not os.environ.get("CI")
        for images, _, valid, rows in tqdm(loader, desc=desc, disable=not show):
            batch = normalize_batch(images, pre["mean"], pre["std"], device)
            if params.compile and len(batch) < params.batch_size:  # pad: one compiled shape only
                padding = batch.new_zeros(params.batch_size - len(batch), *batch.shape[1:])
                probs, embedding = _forward(net, torch.cat([batch, padding]), params, device)
                probs, embedding = probs[: len(images)], embedding[: len(images)]
            else:
                probs, embedding = _forward(net, batch, params, device)
            valid = valid.numpy()
            probs[~valid] = np.nan
            invalid_paths += [frames["path"].iat[int(r)] for r in rows[~valid]]
            pending.append((probs, valid))
            pending_emb.append(embedding)
            if sum(len(p[0]) for p in pending) >= params.row_group_frames:
                emb_writer = _flush(frames, pending, pending_emb, start, writer, emb_writer, tmp_emb)
                start += sum(len(p[0]) for p in pending)
                pending, pending_emb = [], []
        if pending or start == 0:
            emb_writer = _flush(frames, pending, pending_emb, start, writer, emb_writer, tmp_emb)
        writer.close()
        if emb_writer is not None:
            emb_writer.close()
        elif tmp_emb is not None:  # no frames: an empty embeddings table of the model's width
            pq.write_table(embeddings_schema(model.arch_config["embed_dim"]).empty_table(), tmp_emb)
    return {"frames": len(frames), "invalid_frames": len(invalid_paths), "invalid_examples": invalid_paths[:100]}


def _flush(frames, pending, pending_emb, start, writer, emb_writer, tmp_emb):
    if not pending:
        writer.write_table(probs_schema().empty_table())
        return emb_writer
    probs = np.concatenate([p[0] for p in pending])
    valid = np.concatenate([p[1] for p in pending])
    block = frames.iloc[start:start + len(probs)]
    writer.write_table(_table(block, probs, valid))
    if tmp_emb is not None:
        embeddings = np.concatenate(pending_emb)
        if emb_writer is None:
            emb_writer = pq.ParquetWriter(tmp_emb, embeddings_schema(embeddings.shape[1]))
        emb_writer.write_table(_embedding_table(block, embeddings))
    return emb_writer


class _maybe_atomic:
    """atomic_path when a path is given, else a context yielding None."""

    def __init__(self, path):
        self.path = path
        self.inner = atomic_path(path) if path is not None else None

    def __enter__(self):
        return self.inner.__enter__() if self.inner else None

    def __exit__(self, *exc):
        return self.inner.__exit__(*exc) if self.inner else False


def merge_parts(parts: list[Path], out: Path) -> None:
    """Concatenate per-rank Parquet parts (contiguous video blocks, in rank order) into `out`."""
    schema = pq.read_schema(parts[0])
    with atomic_path(out) as tmp:
        with pq.ParquetWriter(tmp, schema) as writer:
            for part in parts:
                source = pq.ParquetFile(part)
                for group in range(source.num_row_groups):
                    writer.write_table(source.read_row_group(group))
    for part in parts:
        part.unlink()


def predict_sharded(model, frames, root, probs_out, params, device, embeddings_out=None, desc="predict",
                    cache=None, max_pixels=None):
    """predict_frames on this rank's videos; under torchrun rank 0 merges the parts."""
    world = dist.get_world_size() if dist.is_initialized() else 1
    if world == 1:
        return predict_frames(model, frames, root, probs_out, params, device, embeddings_out, desc, cache, max_pixels)
    rank = dist.get_rank()
    part = lambda path, r: Path(f"{path}.part{r}") if path else None
    mine = shard_by_video(frames.sort_values(["video_id", "frame"], kind="stable"), rank, world)
    stats = predict_frames(model, mine, root, part(probs_out, rank), params, device,
                           part(embeddings_out, rank), desc, cache, max_pixels)
    gathered = [None] * world
    dist.all_gather_object(gathered, stats)
    if rank == 0:
        merge_parts([part(probs_out, r) for r in range(world)], Path(probs_out))
        if embeddings_out:
            merge_parts([part(embeddings_out, r) for r in range(world)], Path(embeddings_out))
    dist.barrier()
    return {"frames": sum(g["frames"] for g in gathered),
            "invalid_frames": sum(g["invalid_frames"] for g in gathered),
            "invalid_examples": [p for g in gathered for p in g["invalid_examples"]][:100]}
