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


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
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
