"""The probe: a frozen backbone's heads trained on its cached frame features (`vce.data.features`).

The same recipe as the image trainer, on vectors instead of pixels: the imbalance-aware
sampler (`train.samples_per_epoch`, `batch_size`), mixup (`mixup_alpha`, on the features),
AdamW on the heads (`lr_head`, `weight_decay`) under OneCycle (`pct_start`,
`final_div_factor`), the EMA (`ema_decay`, `ema_warmup`), the best epoch by validation frame
mAP. What acts on pixels (augmentation, the decoder, workers) has nothing to act on: the features
are of each frame as predict sees it. An epoch over 10^5 frames of 512 values takes seconds on
a CPU, so no resume state is kept.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import torch
from timm.utils import ModelEmaV3

from vce.core.params import ParamsError
from vce.data.dataset import EpochSampler
from vce.eval.frame_metrics import frame_metrics
from vce.train.trainer import TrainParams, freeze_backbone, kept_epoch, mixup, step_seed


class FeatureSet:
    """Features (N, D) float16 and targets (N, 17) of the decodable frames of one split."""

    def __init__(self, features: np.ndarray, targets: np.ndarray, valid: np.ndarray):
        self.features = torch.from_numpy(np.ascontiguousarray(features[valid]))
        self.targets = torch.from_numpy(np.ascontiguousarray(targets[valid])).float()
        self.skipped = int((~valid).sum())

    def __len__(self) -> int:
        return len(self.features)

    def batch(self, rows, device) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.as_tensor(rows, dtype=torch.long)
        return self.features[rows].float().to(device), self.targets[rows].to(device)


@torch.no_grad()
def evaluate_features(model, loss_fn, data: FeatureSet, batch_size: int, device) -> dict:
    """Validation loss and frame mAP of `model`'s heads on `data`."""
    model.eval()
    losses, probs = [], []
    for start in range(0, len(data), batch_size):
        features, targets = data.batch(range(start, min(start + batch_size, len(data))), device)
        outputs = model.heads(features)
        losses.append(loss_fn(outputs, targets)[0].item() * len(features))
        probs.append(model.frame_probs(outputs).cpu())
    y_prob = torch.cat(probs).numpy()
    metrics = frame_metrics(data.targets.numpy().round().astype(np.uint8), y_prob)
    return {"loss": sum(losses) / max(len(data), 1), "map": metrics["map"]}


def head_groups(model, lr_head: float, weight_decay: float) -> list[dict]:
    """AdamW groups of the trainable heads, as `VCEModel.param_groups` makes them (no decay on
    biases, the excitation's and the contrastive scale/bias vectors); the frozen tower has none."""
    params = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    return [group for group in (
        {"name": "head", "params": [p for _, p in params if p.ndim > 1], "lr": lr_head, "weight_decay": weight_decay},
        {"name": "head_no_decay", "params": [p for _, p in params if p.ndim <= 1], "lr": lr_head, "weight_decay": 0.0},
    ) if group["params"]]


def fit_probe(model, loss_fn, params: TrainParams, seed: int, train: FeatureSet, train_weights: np.ndarray,
              val: FeatureSet, device, log: Callable[[dict], None] = lambda record: None) -> dict:
    """Train the heads of `model` (its image tower frozen) for `params.epochs`. Returns {"history",
    "best"} with the image trainer's records, and "model": `model` with the best epoch's EMA heads."""
    # 1. The tower frozen and set aside: the optimiser, the EMA and the best epoch's copy hold the
    #    heads only (an EMA over a frozen ViT-B would average 86 M constant weights every step).
    freeze_backbone(model)
    tower, model.visual = model.visual, None
    try:
        result = _fit_heads(model.to(device), loss_fn.to(device), params, seed, train, train_weights, val, device, log)
    finally:
        model.visual = tower
    result["model"].visual = tower
    return result


def _fit_heads(model, loss_fn, params: TrainParams, seed: int, train: FeatureSet, train_weights: np.ndarray,
               val: FeatureSet, device, log: Callable[[dict], None]) -> dict:
    ema = ModelEmaV3(model, decay=params.ema_decay, use_warmup=params.ema_warmup)
    optimizer = torch.optim.AdamW(head_groups(model, params.lr_head, params.weight_decay), fused=True)  # vce/core/exact.py
    # 2. The image trainer's draws: weighted by the rarest label, `samples_per_epoch` a epoch.
    sampler = EpochSampler(train_weights, params.samples_per_epoch or len(train), params.batch_size, seed)
    if sampler.steps < 1:
        raise ParamsError(f"train.batch_size = {params.batch_size}: larger than the samples of an epoch "
                          f"({params.samples_per_epoch or len(train)})")
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=[group["lr"] for group in optimizer.param_groups],
        total_steps=params.epochs * sampler.steps, pct_start=params.pct_start,
        final_div_factor=params.final_div_factor)
    history, best, best_heads = [], None, None
    for epoch in range(params.epochs):
        sampler.set_epoch(epoch)
        rows = np.fromiter((row for row, _ in sampler), np.int64).reshape(sampler.steps, params.batch_size)
        losses = []
        for step, batch_rows in enumerate(rows):
            # 3. One step: mixup on the features, the heads' loss, AdamW, OneCycle, EMA.
            features, targets = train.batch(batch_rows, device)
            seed_here = step_seed(seed, epoch, step)
            features, targets = mixup(features, targets, params.mixup_alpha, seed_here)
            torch.manual_seed(seed_here)  # dropout
            model.train()
            loss, _ = loss_fn(model.heads(features), targets)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            ema.update(model, step=epoch * sampler.steps + step)
            losses.append(loss.item())
        # 4. The epoch's record from the EMA heads on the validation features; the best kept.
        scores = evaluate_features(ema.module, loss_fn, val, params.val_batch_size, device)
        lr_head = next(g["lr"] for g in optimizer.param_groups if g["name"] == "head")
        record = {"epoch": epoch + 1, "train_loss": float(np.mean(losses)), "val_loss": float(scores["loss"]),
                  "val_map": float(scores["map"]) if scores["map"] is not None else 0.0,
                  "lr_backbone": 0.0, "lr_head": float(lr_head), "skipped_frames": train.skipped}
        history.append(record)
        log(record)
        if kept_epoch(record, best, params):
            best, best_heads = record, copy.deepcopy(ema.module).cpu()
    return {"history": history, "best": best, "model": best_heads}
