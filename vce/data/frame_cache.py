"""Decoded-frame cache: every frame decoded once into a memory-mapped uint8 array.

PNG decoding caps the data rate at a fraction of what a GPU trains or predicts at
(REFERENCE.md: 574-917 frames/s on 16 cores vs ~2,850 training / ~10,700 inference). The
cache pays decoding once; later passes read raw pixels from the page cache or disk.

Layout of a cache folder:
    meta.json       size, count, decoder, interpolation, the index it was built from
    rows.parquet    video_id, frame, valid — row i of pixels.npy holds this frame
    pixels.npy      (count, size, size, 3) uint8 (numpy .npy, opened as a memmap)
The folder is built beside its destination and swapped in when complete (`vce.core.io.atomic_dir`:
with the stage's other outputs, a failure leaves the previous cache whole).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
import torch
from pydantic import Field
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from vce.core.errors import DataError
from vce.core.io import atomic_dir
from vce.core.labels import LABELS
from vce.core.params import Section
from vce.data.frames import FrameError, decode_frame, resize_frame


class CacheParams(Section):
    """`cache`: the decoded-frame cache."""

    enabled: bool
    size: int = Field(ge=8)
    splits: list[Literal["train", "val", "test"]]
    num_workers: int = Field(ge=0)
    decoder: Literal["pyspng", "opencv", "pil", "torchvision"]
    interpolation: Literal["bicubic", "bilinear"]


class _Decode(Dataset):
    def __init__(self, roots, paths, size, decoder, interpolation, max_pixels=None):
        self.roots, self.paths = roots, paths
        self.size, self.decoder, self.interpolation = size, decoder, interpolation
        self.max_pixels = max_pixels

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        try:
            pixels = decode_frame(Path(self.roots[i]) / self.paths[i], self.size, self.interpolation, self.decoder,
                                  self.max_pixels)
            return torch.from_numpy(pixels), True
        except FrameError:
            return torch.zeros(self.size, self.size, 3, dtype=torch.uint8), False


def build_cache(frames: pd.DataFrame, out_dir, params: CacheParams, max_pixels: int | None = None) -> dict:
    """Decode `frames` (video_id, frame, path, root) into a cache folder at `out_dir`.

    `max_pixels` (data.max_frame_pixels): a frame whose header declares more is cached invalid."""
    with atomic_dir(out_dir) as tmp:
        frames = frames.reset_index(drop=True)
        pixels = np.lib.format.open_memmap(tmp / "pixels.npy", mode="w+", dtype=np.uint8,
                                           shape=(len(frames), params.size, params.size, 3))
        loader = DataLoader(_Decode(frames["root"].to_numpy(), frames["path"].to_numpy(), params.size,
                                    params.decoder, params.interpolation, max_pixels),
                            batch_size=256, num_workers=params.num_workers)
        valid, position = np.zeros(len(frames), bool), 0
        for images, ok in tqdm(loader, desc="cache frames", disable=bool(os.environ.get("CI"))):
            pixels[position:position + len(images)] = images.numpy()
            valid[position:position + len(images)] = ok.numpy()
            position += len(images)
        pixels.flush()
        del pixels
        rows = pd.DataFrame({"video_id": frames["video_id"].astype(str), "frame": frames["frame"].astype(np.int64),
                             "valid": valid})
        rows.to_parquet(tmp / "rows.parquet", index=False)
        meta = {"enabled": True, "size": params.size, "count": int(len(frames)), "invalid": int((~valid).sum()),
                "decoder": params.decoder, "interpolation": params.interpolation}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def write_disabled(out_dir) -> None:
    """A cache folder that says 'no cache' (the stage's output when cache.enabled is false)."""
    with atomic_dir(out_dir) as tmp:
        (tmp / "meta.json").write_text(json.dumps({"enabled": False}) + "\n")


class FrameCache:
    """Read side: maps (video_id, frame) to cache rows; None from `open` when disabled."""

    def __init__(self, folder: Path, meta: dict):
        self.folder, self.meta = folder, meta
        self.size = meta["size"]
        self._pixels = None  # opened lazily in each process (a pickled memmap would copy its data)
        rows = pd.read_parquet(folder / "rows.parquet")
        self.valid = rows["valid"].to_numpy()
        self._row_of = pd.Series(np.arange(len(rows)), index=pd.MultiIndex.from_frame(rows[["video_id", "frame"]]))

    @property
    def pixels(self) -> np.ndarray:
        if self._pixels is None:
            self._pixels = np.load(self.folder / "pixels.npy", mmap_mode="r")  # (N, S, S, 3)
        return self._pixels

    def __getstate__(self):
        return {**self.__dict__, "_pixels": None}

    @classmethod
    def open(cls, folder) -> FrameCache | None:
        folder = Path(folder)
        meta_path = folder / "meta.json"
        if not meta_path.is_file():
            return None
        meta = json.loads(meta_path.read_text())
        return cls(folder, meta) if meta.get("enabled") else None

    def rows_for(self, frames: pd.DataFrame) -> np.ndarray:
        """Cache row of every index row; an error naming a frame the cache lacks."""
        keys = pd.MultiIndex.from_frame(frames[["video_id", "frame"]].astype({"video_id": str}))
        rows = self._row_of.reindex(keys)
        if rows.isna().any():
            video_id, frame = keys[int(np.flatnonzero(rows.isna().to_numpy())[0])]
            raise DataError(f"frame cache {self.folder} lacks video {video_id} frame {frame}: rebuild it "
                             "(stage cache_frames) or disable it")
        return rows.to_numpy(np.int64)


class CachedFrameDataset(Dataset):
    """FrameDataset's twin over a FrameCache: same items, no decoding."""

    def __init__(self, cache: FrameCache, cache_rows, targets, out_size, transform, resize: bool):
        """`resize`: bring cached frames to out_size first (eval); training crops do it themselves.

        Eval pixels equal the PNG path's exactly when the cache is at out_size (cache.size = the
        model's image size); a larger cache resizes a second time (within a few pixel levels)."""
        self.cache, self.cache_rows, self.targets = cache, np.asarray(cache_rows), targets
        self.out_size, self.transform, self.resize = out_size, transform, resize

    def __len__(self):
        return len(self.cache_rows)

    def __getitem__(self, key):
        row, seed = key if isinstance(key, tuple) else (key, None)
        if seed is not None:
            torch.manual_seed(seed)
        cache_row = int(self.cache_rows[row])
        valid = bool(self.cache.valid[cache_row])
        if valid:
            pixels = np.array(self.cache.pixels[cache_row])  # (S, S, 3)
            if self.resize:  # the one resize (open_clip's); a no-op when the cache is at out_size
                pixels = resize_frame(pixels, self.out_size, self.cache.meta["interpolation"])
            image = self.transform(torch.from_numpy(pixels).permute(2, 0, 1))  # (3, S, S)
        else:
            image = torch.zeros(3, self.out_size, self.out_size, dtype=torch.uint8)
        target = (torch.zeros(len(LABELS)) if self.targets is None
                  else torch.from_numpy(self.targets[row].astype(np.float32)))
        return image, target, valid, row

