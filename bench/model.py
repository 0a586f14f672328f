"""Forward (and optionally training-step) speed of the full ViT-B/16 frame model, plain vs differential.

    python -m bench.model                      # CUDA: batch 256 bf16; CPU: batch 4 fp32
    python -m bench.model --compile --train    # also torch.compile'd forward, eager training step

Builds `model.source = random` (BiomedCLIP's image tower: timm vit_base_patch16_224 + projection
to 512, random init, no network) through vce.model.create_model with the same heads as
training; needs torch + timm only (open_clip is imported lazily, for pretrained sources).
Prints one JSON object: frames/s per variant, parameter counts, forward FLOPs per frame.

Measured on one H200 (torch 2.11, timm 1.0.29, no open_clip installed), batch 256, bf16:
forward plain 8,648 / differential 6,149 frames/s eager; 10,570 / 9,943 compiled (compile ~16 s);
training step (eager) 2,692 / 2,000 frames/s. Parameters 86,332,323 / 86,336,931 (+4,608);
forward 35.13 / 35.84 GFLOPs per frame. Likely causes of the eager gap (not profiled): under
autocast timm's per-head RmsNorm warns it cannot use its fused kernel (fp32 weight, bf16 input),
and SDPA cannot use flash attention for value width 2d ≠ query width d; torch.compile closes most of it.
A single-SDPA variant (Q/K zero-padded to 2d, values repeated) was slower: 5,523 / 9,108.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from vce.core.labels import NUM_LABELS
from vce.core.params import load_section
from vce.model.clip_source import resolve_source
from vce.model.frame_model import ModelParams, create_model


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda")
    parser.add_argument("--batch", type=int, default=None, help="default: 256 on CUDA, 4 on CPU")
    parser.add_argument("--iters", type=int, default=None, help="timed iterations (default: 30 CUDA, 3 CPU)")
    parser.add_argument("--source", default="random", help="model.source (random = BiomedCLIP ViT-B/16)")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile'd models")
    parser.add_argument("--train", action="store_true", help="also time a training step (fwd+bwd+AdamW)")
    parser.add_argument("--variants", default="plain,diff",
                        help="comma list of plain, diff")
    return parser.parse_args(argv)


def build(variant: str, source: str, device: torch.device):
    embed_dim = resolve_source(source)[0]["model_cfg"]["embed_dim"]
    params = load_section(Path(__file__).resolve().parents[1] / "params.yaml", "model", ModelParams,
                          source=source, diff_attention=variant != "plain")  # other knobs: the file's
    model = create_model(params,
                         torch.randn(NUM_LABELS, embed_dim))
    return model.to(device)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def frames_per_s(step, batch: int, iters: int, device, warmup: int = 3) -> float:
    for _ in range(warmup):
        step()
    sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        step()
    sync(device)
    return batch * iters / (time.perf_counter() - start)


def forward_fps(model, images, iters, device, amp_dtype) -> float:
    model.eval()

    def step():
        with torch.inference_mode(), torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            model(images)["cls_logits"].sum()

    return frames_per_s(step, images.shape[0], iters, device)


def train_fps(model, images, iters, device, amp_dtype) -> float:
    model.train()
    optimizer = torch.optim.AdamW(model.param_groups(3e-4, 9e-5, 5e-4), fused=device.type == "cuda")
    targets = (torch.rand(images.shape[0], NUM_LABELS, device=device) < 0.1).float()

    def step():
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            out = model(images)
            loss = F.binary_cross_entropy_with_logits(out["cls_logits"].float(), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return frames_per_s(step, images.shape[0], iters, device)


def forward_gflops(model, image_size: int, device) -> float:
    """Forward FLOPs of one frame (matmuls/convs; SDPA counted through its math decomposition)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    model.eval()
    x = torch.randn(1, 3, image_size, image_size, device=device)
    with torch.no_grad(), sdpa_kernel([SDPBackend.MATH]), FlopCounterMode(display=False) as counter:
        model(x)
    return counter.get_total_flops() / 1e9


def main(argv=None) -> int:
    args = parse_args(argv)
    cuda = torch.cuda.is_available() and args.device in ("auto", "cuda")
    device = torch.device("cuda" if cuda else "cpu")
    batch = args.batch or (256 if cuda else 4)
    iters = args.iters or (30 if cuda else 3)
    amp_dtype = torch.bfloat16 if cuda else None
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
    try:
        import open_clip
        open_clip_version = open_clip.__version__
    except ImportError:
        open_clip_version = None
    import timm

    result = {
        "device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
        "torch": torch.__version__, "timm": timm.__version__, "open_clip": open_clip_version,
        "source": args.source, "batch": batch, "iters": iters,
        "dtype": "bf16 autocast" if amp_dtype else "fp32",
        "params": {}, "gflops_per_frame": {}, "forward_fps": {}, "train_fps": {},
    }
    for variant in args.variants.split(","):
        torch.manual_seed(0)
        model = build(variant, args.source, device)
        size = model.preprocess["image_size"]
        result["image_size"] = size
        result["params"][variant] = sum(p.numel() for p in model.parameters())
        result["gflops_per_frame"][variant] = round(forward_gflops(model, size, device), 3)
        images = torch.randn(batch, 3, size, size, device=device)
        result["forward_fps"][variant] = round(forward_fps(model, images, iters, device, amp_dtype), 1)
        if args.train:
            result["train_fps"][variant] = round(train_fps(model, images, iters, device, amp_dtype), 1)
        if args.compile:
            compiled = torch.compile(model)
            start = time.perf_counter()
            result["forward_fps"][f"{variant}_compiled"] = round(
                forward_fps(compiled, images, iters, device, amp_dtype), 1)
            result.setdefault("compile_s", {})[variant] = round(time.perf_counter() - start, 1)
        del model
        if cuda:
            torch.cuda.empty_cache()
        print(json.dumps({"progress": variant, **result["forward_fps"]}), file=sys.stderr, flush=True)
    if "plain" in result["params"] and "diff" in result["params"]:
        result["params"]["diff_extra"] = result["params"]["diff"] - result["params"]["plain"]
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
