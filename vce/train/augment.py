"""The seed's training augmentation applied to whole uint8 batches on the model's device.

The DataLoader path (`vce.data.dataset.train_transform`, torchvision v2 in each worker) costs
the CPU most of a training step at GPU speed. Here the workers only decode; the batch arrives as
uint8 (B, 3, L, L) and this module applies, per sample and with per-sample random parameters,
the same chain with the same parameter distributions as torchvision v2:

1. RandomResizedCrop(size, scale=(crop_scale_min, 1), ratio=(3/4, 4/3)) — torchvision's
   10-tries-then-centre-crop rule;
2. RandomHorizontalFlip(hflip), RandomVerticalFlip(vflip);
3. RandomRotation(±rotation), fill 0;
4. ColorJitter(brightness, contrast, saturation, hue), the four in a random order per sample;
5. RandomErasing(erasing, scale=(0.02, 0.33), ratio=(0.3, 3.3)), the uint8 fill per channel of
   `vce.data.dataset.erasing_value` (black or the model's mean colour).

Steps 1-3 are one affine `grid_sample` per batch (bilinear; torchvision resizes the crop with
antialiased bilinear and rotates with nearest, so pixels differ slightly while the parameter
distributions are the same — tested against torchvision's own `get_params`). Parameters come
from `numpy.random.default_rng(sample_seed)`, the per-sample seed `EpochSampler` already draws
from (seed, epoch, position): a resumed epoch replays the same augmentations on any device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

CROP_RATIO = (3 / 4, 4 / 3)
ERASE_SCALE = (0.02, 0.33)
ERASE_RATIO = (0.3, 3.3)


@dataclass
class AugmentDraw:
    """Per-sample parameters of one batch (numpy arrays of length B, pixel units of the input)."""

    crop: np.ndarray       # (B, 4) top, left, height, width in the input frame
    hflip: np.ndarray      # (B,) bool
    vflip: np.ndarray      # (B,) bool
    angle: np.ndarray      # (B,) degrees, counter-clockwise
    jitter: np.ndarray     # (B, 4) brightness, contrast, saturation factors and hue shift
    order: np.ndarray      # (B, 4) permutation of the jitter operations
    erase: np.ndarray      # (B, 4) top, left, height, width in the output frame (height 0: no erase)


def _crop_box(rng: np.random.Generator, height: int, width: int, scale: tuple[float, float]):
    """torchvision's RandomResizedCrop.get_params, drawn from `rng`."""
    area = height * width
    log_ratio = (math.log(CROP_RATIO[0]), math.log(CROP_RATIO[1]))
    for _ in range(10):
        target_area = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return rng.integers(0, height - h + 1), rng.integers(0, width - w + 1), h, w
    ratio = width / height
    if ratio < CROP_RATIO[0]:
        w, h = width, int(round(width / CROP_RATIO[0]))
    elif ratio > CROP_RATIO[1]:
        h, w = height, int(round(height * CROP_RATIO[1]))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def _erase_box(rng: np.random.Generator, size: int):
    """torchvision's RandomErasing.get_params (after its probability draw); (0, 0, 0, 0) if none fits."""
    area = size * size
    log_ratio = (math.log(ERASE_RATIO[0]), math.log(ERASE_RATIO[1]))
    for _ in range(10):
        erase_area = area * rng.uniform(*ERASE_SCALE)
        aspect = math.exp(rng.uniform(*log_ratio))
        h = int(round(math.sqrt(erase_area * aspect)))
        w = int(round(math.sqrt(erase_area / aspect)))
        if h < size and w < size:
            return rng.integers(0, size - h + 1), rng.integers(0, size - w + 1), h, w
    return 0, 0, 0, 0


def draw(seeds, in_size: int, out_size: int, aug) -> AugmentDraw:
    """Every random parameter of the batch, one generator per sample seed."""
    rows = {name: [] for name in ("crop", "hflip", "vflip", "angle", "jitter", "order", "erase")}
    for seed in np.asarray(seeds, dtype=np.int64):
        rng = np.random.default_rng(int(seed))
        rows["crop"].append(_crop_box(rng, in_size, in_size, (aug.crop_scale_min, 1.0)))
        rows["hflip"].append(rng.random() < aug.hflip)
        rows["vflip"].append(rng.random() < aug.vflip)
        rows["angle"].append(rng.uniform(-aug.rotation, aug.rotation))
        rows["order"].append(rng.permutation(4))
        rows["jitter"].append((rng.uniform(max(0.0, 1 - aug.brightness), 1 + aug.brightness),
                               rng.uniform(max(0.0, 1 - aug.contrast), 1 + aug.contrast),
                               rng.uniform(max(0.0, 1 - aug.saturation), 1 + aug.saturation),
                               rng.uniform(-aug.hue, aug.hue)))
        rows["erase"].append(_erase_box(rng, out_size) if rng.random() < aug.erasing else (0, 0, 0, 0))
    return AugmentDraw(**{name: np.asarray(values) for name, values in rows.items()})


def _geometry(images: torch.Tensor, params: AugmentDraw, out_size: int) -> torch.Tensor:
    """Crop + resize + flips + rotation as one bilinear grid_sample; float (B, 3, S, S) in [0, 1]."""
    batch, _, height, width = images.shape
    device = images.device
    top, left, h, w = (torch.as_tensor(params.crop[:, k], dtype=torch.float32, device=device) for k in range(4))
    # Output grid in normalised coordinates (align_corners=False), (S, S, 2) as (x, y).
    ys, xs = torch.meshgrid(torch.linspace(-1 + 1 / out_size, 1 - 1 / out_size, out_size, device=device),
                            torch.linspace(-1 + 1 / out_size, 1 - 1 / out_size, out_size, device=device),
                            indexing="ij")
    x = xs.expand(batch, -1, -1)
    y = ys.expand(batch, -1, -1)
    # 3. rotation (inverse map: the output point comes from the point rotated by -angle).
    theta = torch.as_tensor(np.deg2rad(params.angle), dtype=torch.float32, device=device).view(-1, 1, 1)
    cos, sin = torch.cos(theta), torch.sin(theta)
    x_r = cos * x - sin * y
    y_r = sin * x + cos * y
    inside = (x_r.abs() <= 1) & (y_r.abs() <= 1)  # rotated-in corners are filled with 0
    # 2. flips.
    x_r = torch.where(torch.as_tensor(params.hflip, device=device).view(-1, 1, 1), -x_r, x_r)
    y_r = torch.where(torch.as_tensor(params.vflip, device=device).view(-1, 1, 1), -y_r, y_r)
    # 1. crop: normalised crop coordinates → normalised input coordinates.
    x_in = ((left + w / 2) / width * 2 - 1).view(-1, 1, 1) + (w / width).view(-1, 1, 1) * x_r
    y_in = ((top + h / 2) / height * 2 - 1).view(-1, 1, 1) + (h / height).view(-1, 1, 1) * y_r
    grid = torch.stack([x_in, y_in], dim=-1)  # (B, S, S, 2)
    out = F.grid_sample(images.float().div_(255), grid, mode="bilinear", padding_mode="border",
                        align_corners=False)
    return out * inside.unsqueeze(1)


def _gray(images: torch.Tensor) -> torch.Tensor:
    """ITU-R 601 luma, as torchvision's rgb_to_grayscale: (B, 1, H, W)."""
    r, g, b = images.unbind(dim=1)
    return (0.2989 * r + 0.587 * g + 0.114 * b).unsqueeze(1)


def _adjust_hue(images: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Rotate hue by `shift` (B,) in turns, through HSV as torchvision does."""
    r, g, b = images.unbind(dim=1)
    maxc, _ = images.max(dim=1)
    minc, _ = images.min(dim=1)
    delta = maxc - minc
    safe = torch.where(delta > 0, delta, torch.ones_like(delta))
    hue = torch.where(maxc == r, (g - b) / safe,
                      torch.where(maxc == g, 2.0 + (b - r) / safe, 4.0 + (r - g) / safe))
    hue = torch.where(delta > 0, (hue / 6.0) % 1.0, torch.zeros_like(hue))
    saturation = torch.where(maxc > 0, delta / torch.where(maxc > 0, maxc, torch.ones_like(maxc)),
                             torch.zeros_like(maxc))
    hue = (hue + shift.view(-1, 1, 1)) % 1.0
    i = torch.floor(hue * 6.0)
    f = hue * 6.0 - i
    p = maxc * (1 - saturation)
    q = maxc * (1 - saturation * f)
    t = maxc * (1 - saturation * (1 - f))
    i = i.long() % 6
    v = maxc
    choices = [(v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)]
    out = torch.zeros_like(images)
    for k, (rr, gg, bb) in enumerate(choices):
        sel = (i == k).unsqueeze(1)
        out = torch.where(sel, torch.stack([rr, gg, bb], dim=1), out)
    return out


def _color(images: torch.Tensor, params: AugmentDraw) -> torch.Tensor:
    """ColorJitter with each sample's own factors and order of operations."""
    factors = torch.as_tensor(params.jitter, dtype=torch.float32, device=images.device)  # (B, 4)
    order = torch.as_tensor(params.order, device=images.device)  # (B, 4)
    view = lambda k: factors[:, k].view(-1, 1, 1, 1)
    operations = [
        lambda x: (x * view(0)).clamp(0, 1),
        lambda x: (view(1) * x + (1 - view(1)) * _gray(x).mean(dim=(2, 3), keepdim=True)).clamp(0, 1),
        lambda x: (view(2) * x + (1 - view(2)) * _gray(x)).clamp(0, 1),
        lambda x: _adjust_hue(x, factors[:, 3]),
    ]
    for position in range(4):
        for op_index, operation in enumerate(operations):
            selected = order[:, position] == op_index
            if selected.any():
                images = torch.where(selected.view(-1, 1, 1, 1), operation(images), images)
    return images


def _erase(images: torch.Tensor, params: AugmentDraw, fill) -> torch.Tensor:
    """Set each sample's erase box to `fill` (3 uint8 values, or one for every channel)."""
    size = images.shape[-1]
    device = images.device
    value = (torch.as_tensor(fill, dtype=torch.float32, device=device) / 255).reshape(1, -1, 1, 1)
    top, left, h, w = (torch.as_tensor(params.erase[:, k], device=device).view(-1, 1, 1) for k in range(4))
    rows = torch.arange(size, device=device).view(1, -1, 1)
    cols = torch.arange(size, device=device).view(1, 1, -1)
    box = (rows >= top) & (rows < top + h) & (cols >= left) & (cols < left + w)  # (B, S, S)
    return torch.where(box.unsqueeze(1), value.expand_as(images), images)


def augment_batch(images: torch.Tensor, seeds, out_size: int, aug, fill=(0, 0, 0)) -> torch.Tensor:
    """uint8 (B, 3, L, L) on any device → augmented uint8 (B, 3, S, S) on the same device.

    Returning uint8 keeps one normalisation path (`normalize_batch`) for both augmentation
    placements, and the rounding a uint8 image would have had in the workers.
    """
    params = draw(seeds, images.shape[-1], out_size, aug)
    out = _geometry(images, params, out_size)
    out = _color(out, params)
    out = _erase(out, params, fill)
    return out.mul_(255).round_().clamp_(0, 255).to(torch.uint8)
