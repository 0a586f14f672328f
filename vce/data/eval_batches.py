"""Evaluation frames in chunks: one task decodes (or reads from the cache) a run of consecutive
frames into one uint8 array, so no per-frame tensors are collated and the prediction loop
assembles its batches from a few large pieces.

The pixels are exactly the per-frame datasets' (`FrameDataset`, `CachedFrameDataset` with the
eval transform): the same `decode_frame` + `resize_frame` calls, an undecodable frame a zero
image with valid=False. Only the layout differs: (n, S, S, 3) as decoded; the consumer permutes
to (n, 3, S, S) on its device. (No `__getitems__` on the training datasets: DataLoader would
then hand their batches to the training collate.)
"""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, get_worker_info

from vce.data.frame_cache import FrameCache
from vce.data.frames import FrameError, decode_frame, resize_frame


def chunk_bounds(count: int, batch_size: int, chunk: int) -> list[tuple[int, int]]:
    """(start, stop) of every chunk: at most `chunk` frames, never across a batch boundary."""
    bounds = []
    for first in range(0, count, batch_size):
        last = min(first + batch_size, count)
        bounds += [(start, min(start + chunk, last)) for start in range(first, last, chunk)]
    return bounds


class Chunk:
    """Consecutive frames [start, stop): pixels (n, S, S, 3) uint8, valid (n,) bool, and the
    seconds its reader spent (decode, resize, copy, pin) for the profile."""

    def __init__(self, start: int, pixels: torch.Tensor, valid: np.ndarray, seconds: dict):
        self.start, self.pixels, self.valid, self.seconds = start, pixels, valid, seconds

    def __len__(self) -> int:
        return len(self.valid)

    def pin_memory(self) -> Chunk:
        """DataLoader's pin-memory thread calls this (timed: the pinning copy is a stage too)."""
        began = time.perf_counter()
        if not self.pixels.is_pinned():
            self.pixels = self.pixels.pin_memory()
        self.seconds["pin"] = self.seconds.get("pin", 0.0) + time.perf_counter() - began
        return self


def _empty_pixels(count: int, size: int, pinned: bool) -> torch.Tensor:
    """(count, size, size, 3) uint8: in shared memory in a DataLoader worker (sent to the main
    process without another copy), pinned when the reader runs beside a CUDA consumer."""
    pixels = torch.empty(count, size, size, 3, dtype=torch.uint8, pin_memory=pinned and get_worker_info() is None)
    return pixels.share_memory_() if get_worker_info() is not None else pixels


class PngChunks(Dataset):
    """Item i: chunk i of `bounds` over `paths` (under `root`), decoded and resized to `size`."""

    def __init__(self, root, paths, bounds, size: int, interpolation: str, decoder: str,
                 max_pixels: int | None = None, pinned: bool = False):
        self.root, self.paths, self.bounds = Path(root), np.asarray(paths, dtype=object), bounds
        self.size, self.interpolation, self.decoder, self.max_pixels = size, interpolation, decoder, max_pixels
        self.pinned = pinned

    def __len__(self) -> int:
        return len(self.bounds)

    def __getitem__(self, i: int) -> Chunk:
        start, stop = self.bounds[i]
        pixels = _empty_pixels(stop - start, self.size, self.pinned)
        out = pixels.numpy()
        valid = np.ones(stop - start, bool)
        seconds = {"decode": 0.0, "resize": 0.0}
        for k in range(stop - start):
            began = time.perf_counter()
            try:  # decode_frame(path, size) is exactly these two steps; split to time them apart
                image = decode_frame(self.root / self.paths[start + k], None, self.interpolation, self.decoder,
                                     self.max_pixels)
            except FrameError:
                valid[k] = False
                out[k] = 0
                continue
            decoded = time.perf_counter()
            out[k] = resize_frame(image, self.size, self.interpolation)
            seconds["decode"] += decoded - began
            seconds["resize"] += time.perf_counter() - decoded
        return Chunk(start, pixels, valid, seconds)


class CacheChunks(Dataset):
    """Item i: chunk i of `bounds` over `cache_rows`, read from the cache's memmap in one slice
    when the rows are consecutive (the usual case: the cache is built in index order), resized
    to `size` only when the cache is at another size (the one resize, as `CachedFrameDataset`)."""

    def __init__(self, cache: FrameCache, cache_rows, bounds, size: int, pinned: bool = False):
        self.cache, self.cache_rows, self.bounds = cache, np.asarray(cache_rows, np.int64), bounds
        self.size, self.pinned = size, pinned

    def __len__(self) -> int:
        return len(self.bounds)

    def __getitem__(self, i: int) -> Chunk:
        start, stop = self.bounds[i]
        rows = self.cache_rows[start:stop]
        valid = self.cache.valid[rows].copy()
        pixels = _empty_pixels(stop - start, self.size, self.pinned)
        out = pixels.numpy()
        began = time.perf_counter()
        consecutive = bool(np.all(np.diff(rows) == 1))
        if self.cache.size == self.size:
            out[:] = self.cache.pixels[rows[0]:rows[-1] + 1] if consecutive else self.cache.pixels[rows]
        else:
            for k, row in enumerate(rows):
                out[k] = resize_frame(np.asarray(self.cache.pixels[row]), self.size, self.cache.meta["interpolation"])
        out[~valid] = 0
        return Chunk(start, pixels, valid, {"read": time.perf_counter() - began})


def threaded(chunks: Dataset, depth: int):
    """Iterate `chunks` read ahead by one thread, at most `depth` waiting (the cache path: a
    memory copy per chunk, no worker processes or inter-process queues). Errors re-raise here."""
    ready: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def read():
        try:
            for i in range(len(chunks)):
                item = chunks[i]
                while not stop.is_set():
                    try:
                        ready.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        pass
                if stop.is_set():
                    return
        except BaseException as err:  # handed to the consumer, raised there
            ready.put(err)
            return
        ready.put(done)

    reader = threading.Thread(target=read, name="cache-reader", daemon=True)
    reader.start()
    try:
        while (item := ready.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while reader.is_alive():  # unblock a put waiting on a full queue
            try:
                ready.get_nowait()
            except queue.Empty:
                reader.join(0.05)
