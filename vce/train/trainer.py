"""The training loop: imbalance-aware sampling, mixup, AdamW + OneCycle, EMA, resume, DDP.

Every random draw is a pure function of (seed, epoch, step): the sampler's order, each
sample's augmentation, each step's mixup and dropout. A checkpoint therefore only needs the
model, EMA, optimiser and scheduler states plus the position, and a run resumed from any
checkpoint ends with exactly the weights of an uninterrupted one (on CPU).
"""

from __future__ import annotations

import copy
import os
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.distributed as dist
from pydantic import Field
from timm.utils import ModelEmaV3
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from vce.core.io import outside_output_set
from vce.core.labels import LABELS
from vce.core.params import ParamsError, Section, require
from vce.data.dataset import AugmentParams, EpochSampler, erasing_value, normalize_batch
from vce.eval.frame_metrics import frame_metrics
from vce.model import checkpoint
from vce.model.clip_source import HF_HUB_PREFIX, LOCAL_DIR_PREFIX, TIMM_PREFIX
from vce.model.device import Distributed, autocast, resolve_device, setup_distributed
from vce.train.augment import augment_batch


class TrainParams(Section):
    """`train`: the training recipe."""

    epochs: int = Field(ge=1)
    batch_size: int = Field(ge=1)
    lr_head: float = Field(gt=0)
    lr_backbone: float = Field(gt=0)
    freeze_backbone: bool
    weight_decay: float = Field(ge=0)
    pct_start: float = Field(gt=0, lt=1)
    final_div_factor: float = Field(gt=0)
    allow_high_lr: bool
    ema_decay: float = Field(ge=0, lt=1)
    ema_warmup: bool
    keep: Literal["best", "last"]
    mixup_alpha: float = Field(ge=0)
    samples_per_epoch: int = Field(ge=0)
    val_batch_size: int = Field(ge=1)
    num_workers: int = Field(ge=0)
    checkpoint_every: int = Field(ge=0)
    extend: bool
    device: Literal["auto", "cpu", "cuda"]
    bf16: bool
    compile: bool
    decoder: Literal["pyspng", "opencv", "pil", "torchvision"]
    augment_on: Literal["loader", "device"]
    augment: AugmentParams


MAX_PRETRAINED_LR = 1e-3  # 11× the seed's 9e-5; the demo's from-scratch 3e-3 is above it


def check_learning_rates(params: TrainParams, source: str) -> None:
    """Refuse a pretrained backbone trained at a from-scratch learning rate, unless asked for.

    The demo's `lr_backbone` (3e-3, a tiny model from scratch) is 33× the seed's 9e-5 for
    BiomedCLIP: switching only `model.source` would wash the pretrained weights out silently.
    """
    pretrained = source.startswith((HF_HUB_PREFIX, LOCAL_DIR_PREFIX, TIMM_PREFIX))  # timm: always loads weights
    if pretrained and not params.freeze_backbone and params.lr_backbone > MAX_PRETRAINED_LR and not params.allow_high_lr:
        raise ParamsError(
            f"train.lr_backbone = {params.lr_backbone:g} with the pretrained model.source {source!r}: above "
            f"{MAX_PRETRAINED_LR:g}, a from-scratch rate (the seed fine-tuned at 9e-5). Use the seed recipe "
            "(dvc exp run $(python -m vce.core.recipe seed)), lower train.lr_backbone, or set "
            "train.allow_high_lr: true")


def freeze_backbone(model) -> None:
    """Linear probe: the image tower (`visual.*`, what `param_groups` calls the backbone) is frozen,
    only the heads learn from its features; the standard first run with a pretrained model."""
    for param in model.visual.parameters():
        param.requires_grad_(False)


def step_seed(seed: int, epoch: int, step: int) -> int:
    return int(np.random.default_rng([seed, epoch, step, 3]).integers(0, 2**31 - 1))


def mixup(images, targets, alpha: float, seed: int):
    """Mixup (Zhang et al. 2018) on images and soft targets, drawn from this step's seed."""
    if alpha <= 0 or len(images) < 2:
        return images, targets
    rng = np.random.default_rng(seed)
    lam = float(rng.beta(alpha, alpha))
    perm = torch.from_numpy(rng.permutation(len(images))).to(images.device)
    return lam * images + (1 - lam) * images[perm], lam * targets + (1 - lam) * targets[perm]


@torch.no_grad()
def evaluate(model, loss_fn, loader, device, bf16, ddp: Distributed) -> dict:
    """Validation loss and frame-level metrics; every rank sees its shard, rank 0 gets all."""
    model.eval()
    probs, targets, losses, sizes = [], [], [], []
    pre = model.preprocess
    for images, target, valid, _ in loader:
        if not valid.any():
            continue
        images = normalize_batch(images[valid], pre["mean"], pre["std"], device)
        target = target[valid].to(device)
        with autocast(device, bf16):
            outputs = model(images)
        loss, _ = loss_fn(_float(outputs), target)
        losses.append(loss.item() * len(images))
        sizes.append(len(images))
        probs.append(model.frame_probs(_float(outputs)).float().cpu())
        targets.append(target.cpu())
    shard = (torch.cat(probs) if probs else torch.zeros(0, len(LABELS)),
             torch.cat(targets) if targets else torch.zeros(0, len(LABELS)),
             sum(losses), sum(sizes))
    if ddp.world > 1:
        gathered = [None] * ddp.world
        dist.all_gather_object(gathered, shard)
    else:
        gathered = [shard]
    y_prob = torch.cat([g[0] for g in gathered]).numpy()
    y_true = torch.cat([g[1] for g in gathered]).numpy().round().astype(np.uint8)
    total = sum(g[3] for g in gathered)
    metrics = frame_metrics(y_true, y_prob)
    return {"loss": sum(g[2] for g in gathered) / max(total, 1), "map": metrics["map"], "frames": metrics}


def _float(outputs: dict) -> dict:
    return {k: (v.float() if torch.is_tensor(v) else v) for k, v in outputs.items()}


class Trainer:
    """Owns the model, EMA, optimiser and schedule of one run; `fit` trains to `epochs`."""

    def __init__(self, model, loss_fn, params: TrainParams, seed: int, train_set, train_weights,
                 val_set, state_dir, fingerprint: str, log: Callable[[dict], None] | None = None):
        self.params, self.seed = params, seed
        self.device = resolve_device(params.device)
        self.ddp = setup_distributed(self.device)
        self.model = model.to(self.device)
        if params.freeze_backbone:  # before the optimiser and DDP: they then hold the heads only
            freeze_backbone(self.model)
        self.loss_fn = loss_fn.to(self.device)
        self.ema = ModelEmaV3(self.model, decay=params.ema_decay, use_warmup=params.ema_warmup)
        self.net = self.model
        if self.ddp.world > 1:
            self.net = torch.nn.parallel.DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        if params.compile:
            self.net = torch.compile(self.net)
        groups = self.model.param_groups(params.lr_head, params.lr_backbone, params.weight_decay)
        self.optimizer = torch.optim.AdamW(groups, fused=True)  # fused: its sqrt is exact, not MKL VML's (vce/core/exact.py)
        num_samples = params.samples_per_epoch or len(train_set)
        require(params.batch_size % self.ddp.world == 0, "train.batch_size",
                f"must be divisible by the number of processes ({self.ddp.world})")
        require(num_samples >= params.batch_size, "train.batch_size",
                f"larger than the samples of an epoch ({num_samples})")
        self.sampler = EpochSampler(train_weights, num_samples, params.batch_size, seed,
                                    self.ddp.rank, self.ddp.world)
        self.steps_per_epoch = self.sampler.steps
        loader_args = dict(num_workers=params.num_workers, pin_memory=self.device.type == "cuda",
                           persistent_workers=params.num_workers > 0)
        self.train_loader = DataLoader(train_set, batch_size=params.batch_size // self.ddp.world,
                                       sampler=self.sampler, **loader_args)
        val_rows = np.array_split(np.arange(len(val_set)), self.ddp.world)[self.ddp.rank]
        self.val_loader = DataLoader(torch.utils.data.Subset(val_set, val_rows),
                                     batch_size=params.val_batch_size, **loader_args)
        self.state_dir = Path(state_dir)
        self.fingerprint = fingerprint
        self.log = log or (lambda record: None)
        self.epoch, self.step, self.history, self.best = 0, 0, [], None
        self.pending = None  # (partial record, EMA state) of an epoch whose validation is not kept yet
        self.epoch_losses, self.epoch_skipped = [], 0  # running, so a mid-epoch resume logs the same
        self.cycle = (0, params.epochs)  # OneCycle spans epochs [start, end)
        # augment_on device: workers only decode; batches are augmented here (vce/train/augment.py).
        self.device_augment = params.augment_on == "device"
        self.erase_fill = erasing_value(params.augment, model.preprocess["mean"])
        self.scheduler = self._new_schedule(*self.cycle)

    def _new_schedule(self, start: int, end: int):
        max_lrs = [group.setdefault("max_lr", group["lr"]) for group in self.optimizer.param_groups]
        return torch.optim.lr_scheduler.OneCycleLR(
            self.optimizer, max_lr=max_lrs, total_steps=(end - start) * self.steps_per_epoch,
            pct_start=self.params.pct_start, final_div_factor=self.params.final_div_factor)

    # -- checkpoints ---------------------------------------------------------------------
    @property
    def state_path(self) -> Path:
        return self.state_dir / "last.pt"

    def save_state(self) -> None:
        if not self.ddp.is_main:
            return
        with outside_output_set():  # scratch a killed run resumes from: published at once
            self._save_state()

    def _save_state(self) -> None:
        checkpoint.save(self.state_path, {
            "fingerprint": self.fingerprint, "epoch": self.epoch, "step": self.step,
            "cycle": list(self.cycle), "history": self.history, "best": self.best,
            "epoch_losses": self.epoch_losses, "epoch_skipped": self.epoch_skipped, "pending": self.pending,
            "model": self.model.state_dict(), "ema": self.ema.module.state_dict(),
            "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
        })

    def try_resume(self) -> bool:
        """Resume the checkpoint of this same run (same fingerprint and `train.epochs`), if any.

        A killed run resumes; a finished run of other `train.epochs` is ignored (the run trains
        from scratch), so the scratch folder never changes what given params produce. Only
        `train.extend: true` continues a finished shorter run, with a new OneCycle over the new
        epochs.
        """
        state = checkpoint.load_train_state(self.state_path, map_location=self.device)  # None: missing or unusable
        if state is None:
            return False
        if state["fingerprint"] != self.fingerprint:
            print(f"ignoring {self.state_path}: written by a run with other data or params")
            return False
        written_for, epochs = state["cycle"][1], self.params.epochs
        extend = self.params.extend and state["epoch"] >= written_for and written_for < epochs
        if written_for != epochs and not extend:
            hint = " (train.extend: true would continue it)" if written_for < epochs else ""
            print(f"ignoring {self.state_path}: written by a {written_for}-epoch run, train.epochs is {epochs}; "
                  f"training from scratch{hint}")
            return False
        self.model.load_state_dict(state["model"])
        self.ema.module.load_state_dict(state["ema"])
        self.cycle = tuple(state["cycle"])
        self.scheduler = self._new_schedule(*self.cycle)
        self.scheduler.load_state_dict(state["scheduler"])
        # After the schedule: building OneCycleLR resets the groups' lr, the saved state has the real ones.
        self.optimizer.load_state_dict(state["optimizer"])
        self.epoch, self.step = state["epoch"], state["step"]
        self.history, self.best = state["history"], state["best"]
        self.epoch_losses, self.epoch_skipped = state["epoch_losses"], state["epoch_skipped"]
        self.pending = state.get("pending")
        if extend:  # train.extend: a finished run continued ("from 5 to 10"), a new cycle over the new epochs
            print(f"extending the finished {written_for}-epoch run in {self.state_path} to {epochs} epochs")
            self.cycle = (written_for, epochs)
            self.scheduler = self._new_schedule(*self.cycle)
        return True

    # -- training ------------------------------------------------------------------------
    def train_step(self, images, targets, seed: int, sample_seeds=None) -> float | None:
        """One optimiser step; `sample_seeds` (one per frame): augment the uint8 batch on the device first."""
        pre = self.model.preprocess
        if sample_seeds is not None:
            images = augment_batch(images.to(self.device, non_blocking=True), sample_seeds, pre["image_size"],
                                   self.params.augment, self.erase_fill)
        images = normalize_batch(images, pre["mean"], pre["std"], self.device)  # uint8 in, float out
        targets = targets.to(self.device, non_blocking=True)
        images, targets = mixup(images, targets, self.params.mixup_alpha, seed)
        torch.manual_seed(seed)  # dropout and any other draw of this step
        self.net.train()
        if self.params.freeze_backbone:  # frozen features as at inference: no dropout or drop path in the tower
            self.model.visual.eval()
        with autocast(self.device, self.params.bf16):
            outputs = self.net(images)
        loss, _ = self.loss_fn(_float(outputs), targets)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        self.ema.update(self.model, step=self.epoch * self.steps_per_epoch + self.step)
        return loss.item()

    def background_validation(self) -> bool:
        """Whether an epoch's validation runs on a spare core while the next epoch trains.

        Only where a core is idle and nothing else is shared: one CPU process (no DDP collectives
        in a second thread) with fewer intra-op threads than cores (the exact demo trains on one
        thread of two: its validation, 40 of ~380 s, then costs no wall time), and decode workers
        (without them the thread would decode in Python, under the trainer's GIL). The numbers do
        not change: the same EMA weights, the same single-thread kernels, the same records in the
        same order (tests/test_training_rules.py)."""
        return (self.device.type == "cpu" and self.ddp.world == 1 and self.params.num_workers > 0
                and torch.get_num_threads() < (os.cpu_count() or 1))

    def fit(self, on_best: Callable[[object, dict], None]) -> dict:
        """Train until `params.epochs`; call on_best(ema_model, record) on each new best epoch.

        An epoch's validation may run in a background thread during the next epoch
        (`background_validation`); its record is then kept at the next epoch's end. A checkpoint
        written meanwhile holds the finished epoch's EMA and partial record (`pending`): a resumed
        run validates it first, so the history and the best epoch are those of an uninterrupted run."""
        # Progress bars only on a terminal; the per-epoch line below is what logs and CI keep.
        show = self.ddp.is_main and sys.stderr.isatty() and not os.environ.get("CI")
        if self.pending is not None:  # resumed between an epoch's end and its validation's
            record, ema_state = self.pending
            model = copy.deepcopy(self.ema.module)
            model.load_state_dict(ema_state)
            self.pending = None
            self.keep_record(record, self.validate(model), model, on_best)
        background = self.background_validation()
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="validation") if background else None
        if background and self.epoch < self.params.epochs:
            iter(self.val_loader)  # its decode workers forked here, never from the validation thread
        job = None  # (record, model, future) of the epoch being validated in the background
        try:
            for epoch in tqdm(range(self.epoch, self.params.epochs), desc="epochs", disable=not show):
                self.epoch = epoch
                self.sampler.set_epoch(epoch, self.step)
                bar = tqdm(self.train_loader, total=self.steps_per_epoch - self.step,
                           desc=f"epoch {epoch + 1}", leave=False, disable=not show)
                for images, targets, valid, _ in bar:
                    self.epoch_skipped += int((~valid).sum())
                    seed = step_seed(self.seed, epoch, self.step)
                    sample_seeds = self.sampler.step_seeds(self.step)[valid.numpy()] if self.device_augment else None
                    loss = self.train_step(images[valid], targets[valid], seed, sample_seeds) if valid.any() else None
                    if loss is None:  # every frame of the batch was undecodable: keep the schedule
                        self.scheduler.step()
                    else:
                        self.epoch_losses.append(loss)
                    self.step += 1
                    if self.params.checkpoint_every and self.step % self.params.checkpoint_every == 0:
                        self.save_state()
                record = self.epoch_record(epoch)
                if job is not None:  # the previous epoch's validation, long finished
                    self.keep_record(job[0], job[2].result(), job[1], on_best)
                    job, self.pending = None, None
                self.epoch, self.step = epoch + 1, 0
                self.epoch_losses, self.epoch_skipped = [], 0
                if background and epoch + 1 < self.params.epochs:
                    model = copy.deepcopy(self.ema.module)  # the EMA trains on; validate this epoch's
                    job = (record, model, executor.submit(self.validate, model))
                    self.pending = (record, model.state_dict())  # in every checkpoint until kept
                    self.save_state()
                else:
                    self.keep_record(record, self.validate(self.ema.module), self.ema.module, on_best)
                    self.save_state()
        finally:
            if executor is not None:
                executor.shutdown(wait=True, cancel_futures=True)
        return {"history": self.history, "best": self.best}

    def validate(self, model) -> dict:
        return evaluate(model, self.loss_fn, self.val_loader, self.device, self.params.bf16, self.ddp)

    def epoch_record(self, epoch: int) -> dict:
        """What an epoch's end knows before validation: its training loss, learning rates, skips."""
        if self.ddp.world > 1:  # mean training loss over ranks
            gathered = [None] * self.ddp.world
            dist.all_gather_object(gathered, self.epoch_losses)
            losses = [x for part in gathered for x in part]
        else:
            losses = self.epoch_losses
        return {
            "epoch": epoch + 1,
            "train_loss": float(np.mean(losses)) if losses else float("nan"),
            "lr_backbone": self.current_lr("backbone"),
            "lr_head": self.current_lr("head"),
            "skipped_frames": int(self.epoch_skipped),
        }

    def keep_record(self, partial: dict, val: dict, model, on_best: Callable[[object, dict], None]) -> None:
        """An epoch's record completed by its validation: history, log line, and the best model."""
        record = {"epoch": partial["epoch"], "train_loss": partial["train_loss"],
                  "val_loss": float(val["loss"]), "val_map": float(val["map"]) if val["map"] is not None else 0.0,
                  "lr_backbone": partial["lr_backbone"], "lr_head": partial["lr_head"],
                  "skipped_frames": partial["skipped_frames"]}
        self.history.append(record)
        self.log(record)
        improved = kept_epoch(record, self.best, self.params)
        if self.ddp.is_main:
            print(epoch_line(record, self.params.epochs, improved), flush=True)
        if improved:
            self.best = record
            if self.ddp.is_main:
                with outside_output_set():  # the best epoch's file, read back by the stage at the end
                    on_best(model, record)

    def current_lr(self, part: str) -> float:
        """Learning rate of the model's `part` ("backbone" or "head") param group now (0: frozen, no group)."""
        return float(next((g["lr"] for g in self.optimizer.param_groups if g.get("name") == part), 0.0))


def kept_epoch(record: dict, best: dict | None, params: TrainParams) -> bool:
    """Whether the epoch of `record` replaces `best` as the model the stage keeps (`train.keep`):
    `best`, a higher validation mAP than every earlier epoch; `last`, the final epoch only (a run
    trained to the end of its schedule, where validation is too small or too noisy to pick by)."""
    if params.keep == "last":
        return record["epoch"] == params.epochs
    return best is None or record["val_map"] > best["val_map"]


def epoch_line(record: dict, epochs: int, best: bool) -> str:
    """One plain line per epoch (no carriage returns: readable in a log file or CI)."""
    line = (f"epoch {record['epoch']}/{epochs}  train_loss {record['train_loss']:.4f}  "
            f"val_loss {record['val_loss']:.4f}  val_mAP {record['val_map']:.4f}  "
            f"lr {record['lr_backbone']:.2e} (backbone) {record['lr_head']:.2e} (head)")
    if record.get("skipped_frames"):
        line += f"  skipped_frames {record['skipped_frames']}"
    return line + ("  best" if best else "")


def describe(params: TrainParams) -> dict:
    """The params that define a run's trajectory (epochs checked apart: `try_resume`)."""
    values = params.model_dump()
    for key in ("epochs", "extend", "num_workers", "val_batch_size"):
        values.pop(key)
    return values
