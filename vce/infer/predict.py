"""Streaming inference: frames in (video, frame) order → probabilities Parquet, row group by row group.

Memory stays bounded for a video of any length: batches are written as they come. A frame
that cannot be decoded gets a row with valid=False and NaN probabilities (the events stage
treats it as a gap); it is never dropped. Output files appear only when complete (atomic
rename). Under torchrun each rank takes a contiguous block of videos and rank 0 merges.

The data path (bench/predict.py measures each stage; `profile=` returns the breakdown):
1. Loader workers decode runs of `decode_chunk` consecutive frames into one uint8 array each
   (vce/data/eval_batches.py: no per-frame tensors, no collate); over the decoded-frame cache at
   the model's size one reader thread copies memmap slices instead (a memory copy per chunk).
2. Chunks arrive pinned (CUDA) and go to the device on a side stream, non-blocking; a batch is
   assembled there, permuted to (B, 3, S, S) and normalised (the same float ops as before).
3. The forward pass; results are copied back asynchronously into pinned memory.
4. A writer thread waits for each batch's copy, builds the Arrow tables and writes Parquet,
   behind a bounded queue: the main thread never blocks on the device, and an error in the
   writer is raised in the main thread (the outputs then stay temporary and are removed).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import torch
import torch.distributed as dist
from pydantic import Field
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from vce.core.io import atomic_path, outside_output_set
from vce.core.params import Section
from vce.data.dataset import normalize_batch
from vce.data.eval_batches import CacheChunks, PngChunks, chunk_bounds, threaded
from vce.data.frame_cache import FrameCache
from vce.infer.sink import ParquetSink, StageClock


class PredictParams(Section):
    """`predict`: frame probabilities (and embeddings) for every split."""

    batch_size: int = Field(ge=1)
    num_workers: int = Field(ge=0)
    tta_flip: bool
    embeddings: bool
    splits: list[Literal["train", "val"]]
    device: Literal["auto", "cpu", "cuda"]
    bf16: bool
    compile: bool
    row_group_frames: int = Field(ge=1)
    decoder: Literal["pyspng", "opencv", "pil", "torchvision"]
    decode_chunk: int = Field(ge=1)
    prefetch_chunks: int = Field(ge=1)


@torch.no_grad()
def _forward(model, images, params: PredictParams, device):
    """(probs (B, 17), embedding (B, D)), float32 on `device`: no host synchronisation here."""
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
    return probs, embedding


def shard_by_video(frames: pd.DataFrame, rank: int, world: int) -> pd.DataFrame:
    """Contiguous block of whole videos for `rank`, balanced by frame count, order kept."""
    if world == 1:
        return frames
    counts = frames.groupby("video_id", sort=False).size()
    bounds = np.searchsorted(np.cumsum(counts.to_numpy()), np.linspace(0, len(frames), world + 1)[1:-1])
    owner = np.searchsorted(bounds, np.arange(len(counts)), side="right")
    mine = set(counts.index[owner == rank])
    return frames[frames["video_id"].isin(mine)]


def _chunk_source(frames, root, cache, pre, params: PredictParams, device, max_pixels, bounds):
    """(chunks in order, how they are read): one reader thread over a cache at the model's size
    (a memory copy per chunk), else `num_workers` DataLoader workers (decoding, or resizing
    cached frames)."""
    size, cuda = pre["image_size"], device.type == "cuda"
    if cache is not None:
        chunks = CacheChunks(cache, cache.rows_for(frames), bounds, size, pinned=cuda)
        if cache.size == size:
            return threaded(chunks, params.prefetch_chunks), "cache reader thread"
    else:
        chunks = PngChunks(root, frames["path"].to_numpy(), bounds, size, pre.get("interpolation", "bicubic"),
                           params.decoder, max_pixels, pinned=cuda)
    loader = DataLoader(chunks, batch_size=None, shuffle=False, num_workers=params.num_workers, pin_memory=cuda,
                        prefetch_factor=params.prefetch_chunks if params.num_workers else None)
    return loader, f"{params.num_workers} DataLoader workers" if params.num_workers else "main process"


def _device_batches(chunks, batch_size: int, count: int, device, clock: StageClock):
    """(images (B, S, S, 3) uint8 on `device`, valid (B,), first row) per batch, from its chunks.

    On CUDA each chunk is copied on a side stream as it arrives, so the copy overlaps the
    forward pass of the batch before; the compute stream waits for it only when the batch is
    complete."""
    copy_stream = torch.cuda.Stream(device) if device.type == "cuda" else None
    parts, valid, first = [], [], 0
    iterator = iter(chunks)
    try:
        while True:
            with clock.host("main_wait_loader"):
                chunk = next(iterator, None)
            if chunk is None:
                return
            for stage, seconds in chunk.seconds.items():  # CPU-seconds in the loader, summed over workers
                clock.add(f"loader_{stage}", seconds)
            if copy_stream is None:
                parts.append(chunk.pixels)
            else:
                with torch.cuda.stream(copy_stream), clock.device("h2d"):
                    parts.append(chunk.pixels.to(device, non_blocking=True))
            valid.append(chunk.valid)
            if chunk.start + len(chunk) - first < min(batch_size, count - first):
                continue
            if copy_stream is not None:
                compute = torch.cuda.current_stream(device)
                compute.wait_stream(copy_stream)
                for part in parts:
                    part.record_stream(compute)  # the allocator must not reuse it before the batch is done
            images = parts[0] if len(parts) == 1 else torch.cat(parts)
            yield images, np.concatenate(valid), first
            first += len(images)
            parts, valid = [], []
    finally:
        if hasattr(iterator, "close"):  # the cache reader thread stops now, not at garbage collection
            iterator.close()


def _to_host(tensors, device):
    """Copy device tensors into pinned host memory without waiting: (host tensors, event to wait
    on, or None on CPU)."""
    if device.type != "cuda":
        return tensors, None
    host = [None if t is None else torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)
            for t in tensors]
    copied = torch.cuda.Event()
    copied.record()
    return host, copied


def predict_frames(model, frames: pd.DataFrame, root, probs_out, params: PredictParams, device,
                   embeddings_out=None, desc: str = "predict", cache: FrameCache | None = None,
                   max_pixels: int | None = None, profile: dict | None = None) -> dict:
    """Predict every row of `frames` (sorted by video, frame) into `probs_out` (Parquet).

    Reads pixels from `cache` when given, else decodes the PNGs under `root`. `profile`: a dict
    filled with the seconds each stage took (main thread, device, writer thread, loader
    CPU-seconds). Returns counts: frames, invalid frames and their paths (first 100).
    """
    frames = frames.sort_values(["video_id", "frame"], kind="stable").reset_index(drop=True)
    pre = model.preprocess
    bounds = chunk_bounds(len(frames), params.batch_size, params.decode_chunk)
    chunks, reader = _chunk_source(frames, root, cache, pre, params, device, max_pixels, bounds)
    net = torch.compile(model) if params.compile else model
    mean = torch.tensor(pre["mean"], device=device)  # once: a host-to-device copy per batch would sync
    std = torch.tensor(pre["std"], device=device)
    clock = StageClock(device, profile is not None)
    invalid_paths: list[str] = []
    progress = tqdm(total=len(frames), desc=desc, unit="frame", disable=bool(os.environ.get("CI")))
    began = time.perf_counter()
    first_batch_seconds = None  # pipeline fill: workers started, the first batch decoded
    with atomic_path(probs_out) as tmp_probs, _maybe_atomic(embeddings_out) as tmp_emb:
        sink = ParquetSink(frames, tmp_probs, tmp_emb, params.row_group_frames, model.arch_config["embed_dim"],
                            clock)
        batches = _device_batches(chunks, params.batch_size, len(frames), device, clock)
        try:
            for images, valid, first in batches:
                if first_batch_seconds is None:
                    first_batch_seconds = time.perf_counter() - began
                with clock.device("normalize"):
                    batch = normalize_batch(images.permute(0, 3, 1, 2).contiguous(), mean, std, device)  # (B, 3, S, S)
                    if params.compile and len(batch) < params.batch_size:  # pad: one compiled shape only
                        batch = torch.cat([batch, batch.new_zeros(params.batch_size - len(batch), *batch.shape[1:])])
                with clock.device("forward"):
                    probs, embedding = _forward(net, batch, params, device)
                with clock.device("d2h"):
                    host, copied = _to_host([probs[: len(images)],
                                             embedding[: len(images)] if tmp_emb is not None else None], device)
                if not valid.all():
                    invalid_paths += frames["path"].iloc[first + np.flatnonzero(~valid)].tolist()
                with clock.host("main_wait_writer"):
                    sink.put((*host, copied, valid))
                progress.update(len(images))
        except BaseException:
            sink.abort()
            raise
        finally:
            batches.close()  # now, not when the traceback is freed: its reader stops with it
            progress.close()
        sink.close()
    if profile is not None:
        seconds = time.perf_counter() - began
        profile.update(frames=len(frames), seconds=round(seconds, 3), fps=round(len(frames) / seconds, 1),
                       first_batch_seconds=round(first_batch_seconds or 0.0, 3), reader=reader,
                       chunk=params.decode_chunk, stages=clock.summary())
    return {"frames": len(frames), "invalid_frames": len(invalid_paths), "invalid_examples": invalid_paths[:100]}


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
    with outside_output_set():  # parts rank 0 reads back to merge
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
