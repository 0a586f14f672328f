"""Benchmark: streaming inference, end to end (decode + model + Parquet), against its ceilings.

Generates a synthetic capsule video of 480×480 PNG frames (~330 KB each, like the
RARE-VISION test set) from the real WCEBleedGen stills in ../shared/fixtures (upscaled,
flipped, rotated, with sensor-like noise), then prints one JSON object with:
- decode ceilings: frames/s of decode + resize to the model size for every PNG decoder
  importable here, over all cores (DataLoader workers), no model;
- model only: forward frames/s on random tensors (bf16 autocast on CUDA);
  (`decode_fps`: per-frame DataLoader items, clock from the first batch, as in earlier runs;
  `decode_chunked_fps`: the chunked loader predict itself uses, for the end-to-end decoder);
- model only: forward frames/s on random tensors (bf16 autocast on CUDA; compiled too with --compile);
- end to end: `vce.infer.predict.predict_frames`, the code the predict stage runs, frames/s, with
  its per-stage profile (`profile`: seconds per stage; `stage_fps`: frames / seconds of each
  stage, loader stages per worker-second × workers, i.e. the rate that stage alone would allow);
- on CUDA, `cuda_check`: 300 frames (a full batch and a partial one) predicted on the GPU and on
  the CPU, float32, eager: the largest probability difference;
- with the decoded-frame cache: the one-off cache build (a decode pass) and a later
  predict pass reading the cache instead of PNGs, profiled the same way.
With --out the JSON is rewritten there after each part (a run cut off by a timeout keeps what
it measured).

    python -m bench.predict                       # GPU box: full ViT-B/16 (model.source=random)
    python -m bench.predict --frames 2000 --source tiny --batch 64   # 2-core CPU
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import sys
import tempfile
import time
from multiprocessing import Pool
from pathlib import Path

import cv2
import numpy as np
import pandas as pd
import torch

from vce.core.params import load_section
from vce.data.eval_batches import PngChunks, chunk_bounds
from vce.data.frame_cache import CacheParams, FrameCache, build_cache
from vce.data.frames import available_decoders, decode_frame
from vce.infer.predict import PredictParams, predict_frames
from vce.model.frame_model import ModelParams, create_model

ROOT = Path(__file__).resolve().parents[1]
PARAMS = ROOT / "params.yaml"  # every knob not changed here is the file's

STILLS = ROOT.parent / "shared" / "fixtures" / "wcebleedgen" / "frames"


def _render(args):
    """One 480×480 frame from a still: upscale, flip/rotate, sensor noise (sets the PNG size)."""
    still, seed, noise = args
    rng = np.random.default_rng(seed)
    image = cv2.resize(cv2.imread(str(still)), (480, 480), interpolation=cv2.INTER_CUBIC)
    image = np.rot90(image, rng.integers(4)).copy()
    if rng.random() < 0.5:
        image = image[:, ::-1].copy()
    image = np.clip(image + rng.normal(0, noise, image.shape), 0, 255).astype(np.uint8)
    return cv2.imencode(".png", image)[1].tobytes()


def make_video(folder: Path, n_frames: int, unique: int, noise: float, workers: int, stills: Path) -> pd.DataFrame:
    """Write n_frames PNG files (`unique` distinct renderings, repeated as separate files)."""
    sources = sorted(stills.glob("*.png"))
    if not sources:
        raise SystemExit(f"no stills found in {stills} (pass --stills)")
    with Pool(workers) as pool:
        encoded = pool.map(_render, [(sources[i % len(sources)], i, noise) for i in range(unique)])
    video = folder / "ukdd_navi_00001"
    video.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n_frames):
        name = f"ukdd_navi_00001/frame_{i + 49:07d}.png"
        (folder / name).write_bytes(encoded[i % unique])
        paths.append(name)
    return pd.DataFrame({"video_id": "ukdd_navi_00001", "frame": np.arange(49, 49 + n_frames, dtype=np.int64),
                         "index": np.arange(n_frames, dtype=np.int64), "path": paths, "event_unit": "frame"})


class _DecodeOnly(torch.utils.data.Dataset):
    def __init__(self, root, paths, size, decoder):
        self.root, self.paths, self.size, self.decoder = root, paths, size, decoder

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        return torch.from_numpy(decode_frame(self.root / self.paths[i], self.size, decoder=self.decoder))


def decode_ceiling(root, paths, size, decoder, workers, batch) -> float:
    loader = torch.utils.data.DataLoader(_DecodeOnly(root, paths, size, decoder), batch_size=batch,
                                         num_workers=workers, prefetch_factor=4 if workers else None)
    iterator = iter(loader)
    next(iterator)  # workers started
    start, count = time.perf_counter(), 0
    for images in iterator:
        count += len(images)
    return count / (time.perf_counter() - start)


def chunked_ceiling(root, paths, size, decoder, workers, chunk, prefetch) -> float:
    """The loader predict uses (chunks of `chunk` frames), no model: clock from the first chunk."""
    chunks = PngChunks(root, paths, chunk_bounds(len(paths), len(paths), chunk), size, "bicubic", decoder)
    loader = torch.utils.data.DataLoader(chunks, batch_size=None, num_workers=workers,
                                         prefetch_factor=prefetch if workers else None)
    iterator = iter(loader)
    next(iterator)
    start, count = time.perf_counter(), 0
    for chunk_pixels in iterator:
        count += len(chunk_pixels)
    return count / (time.perf_counter() - start)


def cuda_check(model, frames, folder, params) -> dict:
    """The CUDA data path (side-stream copies, device-side batches, asynchronous D2H) against
    the CPU on the same frames, float32, eager: a wrong row order or a buffer reused too early
    would differ by far more than float32 (TF32 convolutions) rounding."""
    plain = params.replace(compile=False, bf16=False)
    probs = {}
    for name, net, device in (("cuda", model, torch.device("cuda")), ("cpu", copy.deepcopy(model).cpu(), torch.device("cpu"))):
        predict_frames(net, frames, folder, folder / f"check_{name}.parquet", plain, device)
        probs[name] = pd.read_parquet(folder / f"check_{name}.parquet")
    labels = [c for c in probs["cpu"].columns if c not in ("video_id", "frame", "valid")]
    same_rows = probs["cuda"][["video_id", "frame", "valid"]].equals(probs["cpu"][["video_id", "frame", "valid"]])
    difference = np.abs(probs["cuda"][labels].to_numpy() - probs["cpu"][labels].to_numpy())
    return {"frames": len(frames), "same_rows": bool(same_rows), "max_abs_diff": float(np.nanmax(difference)),
            "mean_abs_diff": float(np.nanmean(difference))}


def stage_fps(profile: dict, workers: int) -> dict:
    """frames / seconds per stage; loader stages are CPU-seconds summed over `workers` processes."""
    rates = {}
    for stage, seconds in profile["stages"].items():
        share = seconds / max(workers, 1) if stage.startswith("loader_") and workers else seconds
        rates[stage] = round(profile["frames"] / share, 1) if share > 0 else None
    return rates


@torch.no_grad()
def model_only(model, device, batch, size, bf16, seconds=5.0) -> float:
    images = torch.randn(batch, 3, size, size, device=device)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16 and device.type == "cuda"):
        for _ in range(3):
            model(images)
        _sync(device)
        start, count = time.perf_counter(), 0
        while time.perf_counter() - start < seconds:
            model(images)
            count += batch
        _sync(device)
    return count / (time.perf_counter() - start)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=20000, help="frames in the synthetic video")
    parser.add_argument("--unique", type=int, default=1000, help="distinct renderings among them")
    parser.add_argument("--noise", type=float, default=3.0, help="sensor noise σ (sets PNG size, ~330 KB at 3)")
    parser.add_argument("--decode-frames", type=int, default=8000, help="frames per decoder ceiling run")
    parser.add_argument("--source", default="random", help="model.source (random = full ViT-B/16)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--decoder", default=None, help="decoder for end to end (default: fastest ceiling)")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--decoders", nargs="*", default=None, help="decoders to measure (default: all importable)")
    parser.add_argument("--stills", type=Path, default=STILLS)
    parser.add_argument("--dir", type=Path, default=None, help="where to write the video (default: a temp dir)")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here, after each part")
    args = parser.parse_args(argv)

    def emit(result):
        if args.out is not None:
            args.out.write_text(json.dumps(result, indent=2) + "\n")

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    folder = args.dir or Path(tempfile.mkdtemp(prefix="vce_bench_predict_"))
    result = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              "cpu_cores": os.cpu_count(), "workers": args.workers, "frames": args.frames}
    start = time.perf_counter()
    frames = make_video(folder, args.frames, args.unique, args.noise, args.workers, args.stills)
    result["generate_seconds"] = round(time.perf_counter() - start, 1)
    result["mean_png_kb"] = round(float(np.mean([(folder / p).stat().st_size for p in frames["path"][:200]])) / 1e3, 1)
    emit(result)

    model = create_model(load_section(PARAMS, "model", ModelParams, source=args.source)).to(device).eval()
    size = model.preprocess["image_size"]
    decode_paths = frames["path"].to_numpy()[: args.decode_frames]
    result["decode_fps"] = {name: round(decode_ceiling(folder, decode_paths, size, name, args.workers, args.batch), 1)
                            for name in (args.decoders or available_decoders())}
    best = max(result["decode_fps"], key=result["decode_fps"].get)
    decoder = args.decoder or best
    params = load_section(PARAMS, "predict", PredictParams, batch_size=args.batch, num_workers=args.workers,
                          compile=args.compile, decoder=decoder, embeddings=False, tta_flip=False)
    result["decode_chunked_fps"] = {decoder: round(chunked_ceiling(folder, decode_paths, size, decoder, args.workers,
                                                                   params.decode_chunk, params.prefetch_chunks), 1)}
    result["predict_params"] = {"batch_size": params.batch_size, "decode_chunk": params.decode_chunk,
                                "prefetch_chunks": params.prefetch_chunks, "compile": params.compile}
    emit(result)
    result["model_only_fps"] = round(model_only(model, device, args.batch, size, True), 1)
    emit(result)

    out = folder / "probs.parquet"
    warm = frames.iloc[: args.batch * 4]
    predict_frames(model, warm, folder, out, params, device)  # workers, compile, cudnn warm-up
    profile = {}
    start = time.perf_counter()
    stats = predict_frames(model, frames, folder, out, params, device, profile=profile)
    seconds = time.perf_counter() - start
    ceiling = max(result["decode_fps"][decoder], result["decode_chunked_fps"][decoder])
    result["end_to_end"] = {"decoder": decoder, "seconds": round(seconds, 2),
                            "fps": round(stats["frames"] / seconds, 1), "invalid_frames": stats["invalid_frames"],
                            "share_of_decode_ceiling": round(stats["frames"] / seconds / ceiling, 3),
                            "profile": profile, "stage_fps": stage_fps(profile, args.workers)}
    emit(result)
    if device.type == "cuda":
        result["cuda_check"] = cuda_check(model, frames.iloc[:300], folder, params)
        emit(result)

    start = time.perf_counter()
    build_cache(frames.assign(root=str(folder)), folder / "cache",
                load_section(PARAMS, "cache", CacheParams, size=size, num_workers=args.workers, decoder=decoder,
                             interpolation="bicubic"))
    cache_seconds = time.perf_counter() - start
    cache = FrameCache.open(folder / "cache")
    predict_frames(model, warm, folder, out, params, device, cache=cache)
    profile = {}
    start = time.perf_counter()
    stats = predict_frames(model, frames, folder, out, params, device, cache=cache, profile=profile)
    seconds = time.perf_counter() - start
    result["cached"] = {"build_fps": round(len(frames) / cache_seconds, 1), "seconds": round(seconds, 2),
                        "fps": round(stats["frames"] / seconds, 1), "profile": profile,
                        "stage_fps": stage_fps(profile, 1)}
    emit(result)
    if args.compile:  # last (a recompile would cost the most): the graph predict_frames built, same guards
        result["model_only_compiled_fps"] = round(model_only(torch.compile(model), device, args.batch, size, True), 1)
        emit(result)
    print(json.dumps(result, indent=2))
    if args.dir is None:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
