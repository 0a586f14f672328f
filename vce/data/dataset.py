"""Datasets, imbalance-aware sampling and augmentation over the frame index.

The index is read column-wise (pyarrow); pixels are decoded lazily in DataLoader workers.
Every random choice is derived from (seed, epoch, position) so that an epoch replays
exactly after a resume, whatever the number of workers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import torch
from pydantic import Field
from torch.utils.data import Dataset
from torchvision.transforms import v2

from vce.core.labels import LABELS
from vce.core.params import Section
from vce.data.frames import FrameError, decode_frame


class AugmentParams(Section):
    """`train.augment`: training augmentation (torchvision v2), seed values (REFERENCE.md)."""

    crop_scale_min: float = Field(gt=0, le=1)
    hflip: float = Field(ge=0, le=1)
    vflip: float = Field(ge=0, le=1)
    rotation: float = Field(ge=0, le=180)
    brightness: float = Field(ge=0)
    contrast: float = Field(ge=0)
    saturation: float = Field(ge=0)
    hue: float = Field(ge=0, le=0.5)
    erasing: float = Field(ge=0, le=1)
    erasing_fill: Literal["black", "mean"]
    load_scale: float = Field(ge=1)


def rarest_label_weights(labels: np.ndarray) -> np.ndarray:
    """Sampling weight per frame ∝ 1/√(frequency of the frame's rarest active label).

    The seed's imbalance-aware sampler (REFERENCE.md). Frames with no active label get the
    weight of a label present in every frame (1.0), the lowest possible.
    """
    frequency = labels.mean(axis=0)  # (17,)
    frequency = np.where(frequency > 0, frequency, 1.0)
    per_label = np.where(labels > 0, frequency[None, :], 1.0)  # (N, 17)
    return 1.0 / np.sqrt(per_label.min(axis=1))


def epoch_order(weights: np.ndarray, num_samples: int, seed: int, epoch: int) -> np.ndarray:
    """Frame positions drawn with replacement ∝ weights; a pure function of (seed, epoch)."""
    generator = np.random.default_rng([seed, epoch])
    p = weights / weights.sum()
    return generator.choice(len(weights), size=num_samples, replace=True, p=p)


def sample_seeds(seed: int, epoch: int, count: int) -> np.ndarray:
    """One augmentation seed per sample position of an epoch."""
    return np.random.default_rng([seed, epoch, 1]).integers(0, 2**31 - 1, size=count)


def erasing_value(aug: AugmentParams, mean) -> list[int]:
    """RandomErasing's uint8 fill per channel: black (0) or the model's mean colour (`mean` in [0, 1]).

    `mean` is what torchvision's usual order (RandomErasing after Normalize, value 0) erases to;
    these transforms run on uint8 before normalisation, so the fill is given in pixels.
    """
    return [0, 0, 0] if aug.erasing_fill == "black" else [round(255 * m) for m in mean]


def train_transform(image_size: int, aug: AugmentParams, mean) -> v2.Compose:
    """Seed augmentations on uint8 frames (workers ship uint8: 4× less than float32); `mean`:
    the model's normalisation mean (RandomErasing's fill when `aug.erasing_fill` is mean)."""
    return v2.Compose([
        v2.RandomResizedCrop(image_size, scale=(aug.crop_scale_min, 1.0), antialias=True),
        v2.RandomHorizontalFlip(aug.hflip),
        v2.RandomVerticalFlip(aug.vflip),
        v2.RandomRotation(aug.rotation),
        v2.ColorJitter(aug.brightness, aug.contrast, aug.saturation, aug.hue),
        v2.RandomErasing(aug.erasing, value=erasing_value(aug, mean)),
    ])


def eval_transform() -> v2.Identity:
    """No change: evaluation frames go to the model as decoded (resized to its size)."""
    return v2.Identity()


def normalize_batch(images: torch.Tensor, mean, std, device) -> torch.Tensor:
    """uint8 (B, 3, H, W) → float, normalised with the checkpoint's mean/std, on `device`.

    Done on the device, after the transfer: DataLoader workers and the pin-memory thread move
    uint8, a quarter of the bytes of float32.
    """
    images = images.to(device, non_blocking=True).float().div_(255)
    # as_tensor: a caller may pass device tensors made once (a list is copied over each call, and
    # a blocking host-to-device copy waits for the device)
    mean = torch.as_tensor(mean, dtype=torch.float32, device=device).view(1, 3, 1, 1)
    std = torch.as_tensor(std, dtype=torch.float32, device=device).view(1, 3, 1, 1)
    return images.sub_(mean).div_(std)


class FrameDataset(Dataset):
    """Frames of the index, decoded on demand.

    An item key is a row number, or a (row, seed) pair from `EpochSampler` whose seed drives
    the augmentation. Items are (image (3, S, S) float, target (17,) float, valid bool, row).
    A frame that fails to decode yields a zero image with valid=False: the loss masks it,
    predict writes it as an invalid row, and both count it.
    """

    def __init__(self, root, paths, targets, decode_size, out_size, interpolation, transform,
                 decoder: str = "opencv", max_pixels: int | None = None):
        self.root = Path(root)
        self.paths = np.asarray(paths, dtype=object)
        self.targets = targets  # (N, 17) uint8, or None for unlabelled frames
        self.decode_size = decode_size
        self.out_size = out_size
        self.interpolation = interpolation
        self.transform = transform
        self.decoder = decoder
        self.max_pixels = max_pixels  # data.max_frame_pixels: a larger header is an invalid frame

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, key):
        row, seed = key if isinstance(key, tuple) else (key, None)
        if seed is not None:
            torch.manual_seed(seed)  # v2 transforms draw from torch's global generator
        try:
            pixels = decode_frame(self.root / self.paths[row], self.decode_size, self.interpolation,
                                  self.decoder, self.max_pixels)
            image = self.transform(torch.from_numpy(pixels).permute(2, 0, 1))  # (3, S, S)
            valid = True
        except FrameError:
            image = torch.zeros(3, self.out_size, self.out_size, dtype=torch.uint8)
            valid = False
        if self.targets is None:
            target = torch.zeros(len(LABELS))
        else:
            target = torch.from_numpy(self.targets[row].astype(np.float32))
        return image, target, valid, row


class EpochSampler(torch.utils.data.Sampler):
    """Yields (row, seed) keys of one epoch, from a given step on, for one rank.

    The epoch's draw is `epoch_order(weights, ...)`, identical on every rank; each global
    batch of `batch_size` positions is cut into `world` equal slices, one per rank, so the
    imbalance weighting holds under DDP and a resume at any step replays the same batches.
    """

    def __init__(self, weights, num_samples, batch_size, seed, rank=0, world=1):
        self.weights = weights
        self.batch_size = batch_size
        self.steps = num_samples // batch_size
        self.seed = seed
        self.rank, self.world = rank, world
        self.epoch, self.start_step = 0, 0

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        self.epoch, self.start_step = epoch, start_step

    def __len__(self) -> int:
        return (self.steps - self.start_step) * (self.batch_size // self.world)

    def step_seeds(self, step: int) -> np.ndarray:
        """The augmentation seeds of this rank's samples at `step` of the current epoch, in batch order.

        The same seeds `__iter__` hands the dataset: augmentation on the device draws from them.
        """
        if getattr(self, "_seeds_epoch", None) != self.epoch:
            self._seeds = sample_seeds(self.seed, self.epoch, self.steps * self.batch_size)
            self._seeds_epoch = self.epoch
        per_rank = self.batch_size // self.world
        first = step * self.batch_size + self.rank * per_rank
        return self._seeds[first:first + per_rank]

    def __iter__(self):
        total = self.steps * self.batch_size
        rows = epoch_order(self.weights, total, self.seed, self.epoch)
        seeds = sample_seeds(self.seed, self.epoch, total)
        per_rank = self.batch_size // self.world
        for step in range(self.start_step, self.steps):
            first = step * self.batch_size + self.rank * per_rank
            for position in range(first, first + per_rank):
                yield int(rows[position]), int(seeds[position])
