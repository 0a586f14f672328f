"""Stage `train`: fit the frame model on the training videos, keep the best EMA weights.

Resumes from `--state-dir` only the checkpoint of a killed run of the same data and params
(`train.epochs` included); a finished run of other epochs is ignored, so the scratch folder never
changes what given params produce. `train.extend: true` continues a finished shorter run instead.
Prints one line per epoch and logs the curves with DVCLive, in a staging folder swapped in for
`--live-dir` with the model and metrics when the stage ends (`vce.core.io.atomic_dir`): a failed
run leaves the previous run's curves beside its model, never half of each.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from vce.core import runner
from vce.core.errors import DataError
from vce.core.params import BaseParams, from_dict, load_params

if TYPE_CHECKING:  # the heavy imports (torch, pandas) happen in main: `--help` stays fast
    import pandas as pd

    from vce.data.frame_cache import FrameCache
    from vce.train.trainer import TrainParams


def parse_args(argv):
    parser = argparse.ArgumentParser(prog=runner.module_prog(__spec__), description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--params", default="params.yaml", help="the params file")
    parser.add_argument("--frames", default="data/split/frames.parquet", help="frame index with split column")
    parser.add_argument("--cache", default="data/cache", help="decoded-frame cache (used when enabled)")
    parser.add_argument("--prompts", default="models/prompt_embeddings.pt", help="prompt embeddings file")
    parser.add_argument("--features", default="data/embed",
                        help="the frozen backbone's frame features (stage embed; read with train.freeze_backbone)")
    parser.add_argument("--fold", type=int, default=0,
                        help="train fold k's model: validate on the videos fold k holds out, train on the rest")
    parser.add_argument("--model-out", default=None, help="best EMA weights written (None: models/folds/<fold>/model.pt)")
    parser.add_argument("--state-dir", default=None,
                        help="resumable checkpoints (None: models/train_state/fold_<fold>)")
    parser.add_argument("--metrics", default=None, help="best and final epoch metrics (None: metrics/folds/train_<fold>.json)")
    parser.add_argument("--live-dir", default=None, help="DVCLive directory (None: metrics/train/fold_<fold>)")
    return fold_paths(parser.parse_args(argv))


def fold_paths(args):
    """Fill the paths left None with fold k's, the ones dvc.yaml's `train@k` declares."""
    k = args.fold
    args.model_out = args.model_out or f"models/folds/{k}/model.pt"
    args.state_dir = args.state_dir or f"models/train_state/fold_{k}"
    args.metrics = args.metrics or f"metrics/folds/train_{k}.json"
    args.live_dir = args.live_dir or f"metrics/train/fold_{k}"
    return args


def datasets(frames: pd.DataFrame, root, model, params: TrainParams, cache: FrameCache | None,
             max_pixels: int | None = None):
    """Training and validation datasets: from the frame cache when there is one, else PNGs."""
    from vce.core.contracts import label_matrix
    from vce.data.dataset import FrameDataset, eval_transform, train_transform
    from vce.data.frame_cache import CachedFrameDataset

    pre = model.preprocess
    size = pre["image_size"]
    interpolation = pre.get("interpolation", "bicubic")
    train = frames[frames["split"] == "train"].reset_index(drop=True)
    val = frames[frames["split"] == "val"].reset_index(drop=True)
    if len(train) == 0 or len(val) == 0:
        raise DataError(f"need frames in both splits, got train={len(train)} val={len(val)}")
    # augment_on device: the workers decode only; the trainer augments whole batches on the device.
    train_tf = eval_transform() if params.augment_on == "device" else train_transform(size, params.augment, pre["mean"])
    val_tf = eval_transform()
    if cache is not None:
        return train, (CachedFrameDataset(cache, cache.rows_for(train), label_matrix(train), size, train_tf, resize=False),
                       CachedFrameDataset(cache, cache.rows_for(val), label_matrix(val), size, val_tf, resize=True))
    load = round(size * params.augment.load_scale)
    return train, (FrameDataset(root, train["path"], label_matrix(train), load, size, interpolation, train_tf,
                                params.decoder, max_pixels),
                   FrameDataset(root, val["path"], label_matrix(val), size, size, interpolation, val_tf,
                                params.decoder, max_pixels))


def live_logger(live_dir: str, history: list):
    """DVCLive logger; re-logs the history of a resumed run so the curves are whole."""
    live = open_live(live_dir)

    def log(record: dict) -> None:
        live.log_metric("train/loss", record["train_loss"])
        live.log_metric("val/loss", record["val_loss"])
        live.log_metric("val/map", record["val_map"])
        live.log_metric("lr/backbone", record["lr_backbone"])
        live.log_metric("lr/head", record["lr_head"])
        live.next_step()

    for record in history:
        log(record)
    return live, log


def open_live(live_dir: str):
    """DVCLive, outside any experiment bookkeeping (DVC runs the stage; dvc.yaml declares the plots).

    DVCLive inspects the git repository when it starts and fails in one without commits
    (`git init` then `dvc repro`, which DVC itself allows): there it runs without that look.
    """
    from dvclive import Live
    from scmrepo.exceptions import SCMError

    class LiveWithoutGit(Live):
        def _init_dvc(self):  # no commits yet: nothing to look at, the defaults stand
            pass

    try:
        return Live(dir=live_dir, dvcyaml=None, save_dvc_exp=False, report=None)
    except SCMError:
        return LiveWithoutGit(dir=live_dir, dvcyaml=None, save_dvc_exp=False, report=None)


def train_probe(args, frames, model, loss_fn, params: TrainParams, seed: int, started: float) -> int:
    """`train.freeze_backbone: true`: fit the heads on the cached features of the fold's frames
    (`vce.train.probe`); the model file records the features' backbone, and predict reads them too."""
    from vce.core.contracts import label_matrix
    from vce.core.io import atomic_dir, write_json
    from vce.data.dataset import rarest_label_weights
    from vce.data.features import backbone_fingerprint, read_features
    from vce.model import checkpoint
    from vce.model.device import resolve_device
    from vce.train.probe import FeatureSet, fit_probe
    from vce.train.trainer import epoch_line

    backbone = backbone_fingerprint(model.visual)
    sets = {}
    for split in ("train", "val"):
        rows = frames[frames["split"] == split].reset_index(drop=True)
        features, valid = read_features(args.features, "labelled", rows, backbone)
        sets[split] = FeatureSet(features, label_matrix(rows), valid)
    train_rows = frames[frames["split"] == "train"]
    train_videos = sorted(train_rows["video_id"].astype(str).unique())
    with atomic_dir(args.live_dir) as live_dir:
        live, log = live_logger(str(live_dir), [])
        result = fit_probe(model, loss_fn, params, seed, sets["train"], rarest_label_weights(sets["train"].targets.numpy()),
                           sets["val"], resolve_device(params.device), log)
        live.end()
        # The model file names its training videos (predict's out-of-fold check) and the features' backbone.
        checkpoint.save_model(args.model_out, result["model"], **result["best"], train_videos=train_videos,
                              features=backbone)
    history = result["history"]
    for record in history:
        print(epoch_line(record, params.epochs, record is result["best"]))
    write_json(args.metrics, {"best": result["best"], "final": history[-1], "epochs": len(history)})
    best = result["best"]
    print(f"train (probe on {args.features}, backbone {backbone}): {len(sets['train'])} train / "
          f"{len(sets['val'])} val frames, {len(history)} epochs, best epoch {best['epoch']} val mAP "
          f"{best['val_map']:.4f}, {time.perf_counter() - started:.0f} s -> {args.model_out}, {args.metrics}")
    return 0


@runner.stage
def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    import pandas as pd
    import torch

    from vce.core.contracts import label_matrix, read_index
    from vce.core.io import atomic_dir, atomic_path, write_json
    from vce.data.dataset import rarest_label_weights
    from vce.data.folds import fold_frames
    from vce.data.frame_cache import FrameCache
    from vce.data.index import DataParams
    from vce.model import checkpoint
    from vce.model.frame_model import ModelParams, create_model
    from vce.model.prompts import load_prompt_embeddings
    from vce.train.losses import LossParams, VCELoss
    from vce.train.trainer import Trainer, TrainParams, check_learning_rates, describe

    params = load_params(args.params)
    seed = from_dict(BaseParams, params["base"], "base").seed
    data = from_dict(DataParams, params["data"], "data")
    model_params = from_dict(ModelParams, params["model"], "model")
    loss_params = from_dict(LossParams, params["loss"], "loss")
    train_params = from_dict(TrainParams, params["train"], "train")
    check_learning_rates(train_params, model_params.source)  # before any download or decoding

    frames = fold_frames(read_index(args.frames), args.fold, args.frames)
    torch.manual_seed(seed)
    prompts = load_prompt_embeddings(args.prompts)
    model = create_model(model_params, prompts)
    train, (train_set, val_set) = datasets(frames, data.root, model, train_params, FrameCache.open(args.cache),
                                           data.max_frame_pixels)
    train_labels = label_matrix(train)
    loss_fn = VCELoss(loss_params, torch.from_numpy(train_labels.mean(axis=0)).float())
    if train_params.freeze_backbone:  # the heads on the embed stage's features: the backbone never runs
        return train_probe(args, frames, model, loss_fn, train_params, seed, started)
    run_id = checkpoint.fingerprint(
        seed, describe(train_params), model_params.model_dump(), loss_params.model_dump(),
        int(pd.util.hash_pandas_object(frames[["video_id", "frame", "split"]], index=False).sum()),
        float(prompts.sum()) if prompts is not None else None)
    trainer = Trainer(model, loss_fn, train_params, seed, train_set, rarest_label_weights(train_labels),
                      val_set, args.state_dir, run_id)
    resumed = trainer.try_resume()
    if resumed:
        print(f"resuming from {trainer.state_path}: epoch {trainer.epoch + 1}, step {trainer.step}")
    with atomic_dir(args.live_dir) if trainer.ddp.is_main else contextlib.nullcontext() as live_dir:
        live, log = live_logger(str(live_dir), trainer.history) if live_dir else (None, None)
        trainer.log = log or (lambda record: None)
        best_path = Path(args.state_dir) / "best.pt"
        # The model file names its training videos: predict refuses to call its output out of fold otherwise.
        train_videos = sorted(train["video_id"].astype(str).unique())
        result = trainer.fit(lambda ema_model, record: checkpoint.save_model(best_path, ema_model, **record,
                                                                             train_videos=train_videos))
        if live:
            live.end()
    if trainer.ddp.is_main:
        with atomic_path(args.model_out) as tmp:  # a full disk leaves no partial file
            shutil.copyfile(best_path, tmp)
        # Whether it resumed is printed, not written: a resumed run's metrics equal a clean run's.
        write_json(args.metrics, {"best": result["best"], "final": result["history"][-1],
                                  "epochs": len(result["history"])})
        best = result["best"]
        print(f"train: {len(train_set)} train / {len(val_set)} val frames, {len(result['history'])} epochs"
              f"{' (resumed)' if resumed else ''}, best epoch {best['epoch']} val mAP {best['val_map']:.4f}, "
              f"{time.perf_counter() - started:.0f} s -> {args.model_out}, {args.metrics}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
