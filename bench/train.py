"""Benchmark: training frames/s of the full differential ViT-B/16, step alone and fed by the real loader.

Uses the training code itself (`vce.train.Trainer.train_step`: mixup, bf16 autocast,
AdamW over the model's param groups, OneCycle, EMA update) on:
- step alone: one batch already on the device, repeated;
- with the loader: `CachedFrameDataset` over a decoded-frame cache (vce/data/frame_cache.py) at
  256 px built from the real WCEBleedGen stills, the seed's augmentations, the imbalance-aware
  EpochSampler, DataLoader workers on every core;
- with the loader and `train.augment_on: device`: the workers only read the cache, the same
  augmentations run on whole batches on the device (vce/train/augment.py).
Prints one JSON object.

    python -m bench.train                          # GPU box: model.source=random (ViT-B/16)
    python -m bench.train --source tiny --batch 64 --frames 2000 --steps 20   # 2-core CPU
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np
import pandas as pd
import torch

from vce.core.labels import NUM_LABELS
from vce.core.params import load_section
from vce.data.dataset import (
    eval_transform,
    rarest_label_weights,
    train_transform,
)
from vce.data.frame_cache import CachedFrameDataset, FrameCache
from vce.data.frames import resize_frame
from vce.model.frame_model import ModelParams, create_model
from vce.train.losses import LossParams, VCELoss
from vce.train.trainer import Trainer, TrainParams

ROOT = Path(__file__).resolve().parents[1]
PARAMS = ROOT / "params.yaml"  # every knob not changed here is the file's

STILLS = ROOT.parent / "shared" / "fixtures" / "wcebleedgen" / "frames"


def write_cache(folder: Path, n_frames: int, size: int, stills: Path) -> FrameCache:
    """A frame cache of n_frames real stills (resized, flipped) in the cache's on-disk layout."""
    sources = sorted(stills.glob("*.png"))
    if not sources:
        raise SystemExit(f"no stills found in {stills} (pass --stills)")
    base = np.stack([resize_frame(cv2.cvtColor(cv2.imread(str(p)), cv2.COLOR_BGR2RGB), size) for p in sources])
    folder.mkdir(parents=True, exist_ok=True)
    pixels = np.lib.format.open_memmap(folder / "pixels.npy", mode="w+", dtype=np.uint8,
                                       shape=(n_frames, size, size, 3))
    for start in range(0, n_frames, len(base)):
        count = min(len(base), n_frames - start)
        pixels[start:start + count] = base[:count] if (start // len(base)) % 2 == 0 else base[:count, :, ::-1]
    pixels.flush()
    del pixels
    pd.DataFrame({"video_id": "bench", "frame": np.arange(n_frames, dtype=np.int64),
                  "valid": True}).to_parquet(folder / "rows.parquet")
    (folder / "meta.json").write_text(json.dumps({"enabled": True, "size": size, "count": n_frames}))
    return FrameCache.open(folder)


def synthetic_labels(n_frames: int, seed: int) -> np.ndarray:
    """Galar-like imbalance: one region per frame, rare findings."""
    rng = np.random.default_rng(seed)
    labels = np.zeros((n_frames, NUM_LABELS), np.uint8)
    labels[np.arange(n_frames), rng.choice(5, n_frames, p=[0.01, 0.01, 0.08, 0.4, 0.5])] = 1
    for k, rate in zip(range(8, 17), [0.002, 0.005, 0.1, 0.01, 0.002, 0.009, 0.005, 0.005, 0.003]):
        labels[:, k] = rng.random(n_frames) < rate
    return labels


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", default="random", help="model.source (random = full ViT-B/16)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--frames", type=int, default=20000, help="frames in the cache")
    parser.add_argument("--cache-size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=40, help="timed steps per measurement")
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--stills", type=Path, default=STILLS)
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    device_name = "auto"
    model_params = load_section(PARAMS, "model", ModelParams, source=args.source)
    prompts = torch.randn(NUM_LABELS, 1, 64 if args.source == "tiny" else 512)
    model = create_model(model_params, prompts)
    size = model.preprocess["image_size"]
    labels = synthetic_labels(args.frames, 0)
    loss_fn = VCELoss(load_section(PARAMS, "loss", LossParams), torch.from_numpy(labels.mean(0)).float())
    params = load_section(PARAMS, "train", TrainParams, batch_size=args.batch, num_workers=args.workers,
                          device=device_name, compile=args.compile,
                          samples_per_epoch=args.batch * (args.steps * 2 + 10))
    with tempfile.TemporaryDirectory(prefix="vce_bench_train_") as tmp:
        start = time.perf_counter()
        cache = write_cache(Path(tmp) / "cache", args.frames, args.cache_size, args.stills)
        cache_seconds = time.perf_counter() - start
        rows = np.arange(args.frames)
        train_set = CachedFrameDataset(cache, rows, labels, size, train_transform(size, params.augment, model.preprocess["mean"]), resize=False)
        val_set = CachedFrameDataset(cache, rows[:256], labels[:256], size, eval_transform(), resize=True)
        trainer = Trainer(model, loss_fn, params, 42, train_set, rarest_label_weights(labels), val_set,
                          Path(tmp) / "state", "bench")
        device = trainer.device

        # 1. the step alone: a batch already on the device
        images = torch.randint(0, 256, (args.batch, 3, size, size), dtype=torch.uint8, device=device)
        targets = torch.from_numpy(labels[: args.batch].astype(np.float32)).to(device)
        for i in range(5):  # warm-up (and compile)
            trainer.train_step(images, targets, i)
        _sync(device)
        start = time.perf_counter()
        for i in range(args.steps):
            trainer.train_step(images, targets, i)
        _sync(device)
        step_fps = args.steps * args.batch / (time.perf_counter() - start)

        # 2. the same step fed by the real loader over the cache
        trainer.sampler.set_epoch(0)
        batches = iter(trainer.train_loader)
        for i in range(5):
            image_batch, target_batch, valid, _ = next(batches)
            trainer.train_step(image_batch, target_batch, i)
        _sync(device)
        start = time.perf_counter()
        for i in range(args.steps):
            image_batch, target_batch, valid, _ = next(batches)
            trainer.train_step(image_batch[valid], target_batch[valid], i)
        _sync(device)
        loader_fps = args.steps * args.batch / (time.perf_counter() - start)

        # 3. the loader alone (its ceiling)
        start = time.perf_counter()
        for _ in range(args.steps):
            next(batches)
        loader_only_fps = args.steps * args.batch / (time.perf_counter() - start)
        del batches

        # 4. augment_on device: workers only read the cache; the batch is augmented on the device
        plain_set = CachedFrameDataset(cache, rows, labels, size, eval_transform(), resize=False)
        device_params = params.replace(augment_on="device")
        device_trainer = Trainer(model, loss_fn, device_params, 42, plain_set, rarest_label_weights(labels), val_set,
                                 Path(tmp) / "state_device", "bench_device")
        device_trainer.sampler.set_epoch(0)
        batches = iter(device_trainer.train_loader)
        for i in range(5):
            image_batch, target_batch, valid, _ = next(batches)
            device_trainer.train_step(image_batch, target_batch, i, device_trainer.sampler.step_seeds(i))
        _sync(device)
        start = time.perf_counter()
        for i in range(5, 5 + args.steps):
            image_batch, target_batch, valid, _ = next(batches)
            device_trainer.train_step(image_batch, target_batch, i, device_trainer.sampler.step_seeds(i))
        _sync(device)
        device_aug_fps = args.steps * args.batch / (time.perf_counter() - start)

    print(json.dumps({
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "source": args.source, "batch": args.batch, "compile": args.compile, "workers": args.workers,
        "cache_frames": args.frames, "cache_size": args.cache_size, "cache_build_seconds": round(cache_seconds, 1),
        "step_only_fps": round(step_fps, 1),
        "step_with_cache_loader_fps": round(loader_fps, 1),
        "loader_only_fps": round(loader_only_fps, 1),
        "loader_slowdown": round(1 - loader_fps / step_fps, 3),
        "step_with_device_augment_fps": round(device_aug_fps, 1),
        "device_augment_slowdown": round(1 - device_aug_fps / step_fps, 3),
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
