"""Ensemble and tuning at Galar scale: 3.5 M labelled frames out of fold over 5 folds, a test set × 5 folds.

Generates (seeded, in a temporary folder) what `predict@k` / `predict_test@k` would write for
`--folds` fold models: the split index (80 videos, `fold` column), each fold's out-of-fold
`val.parquet` + `coverage.json` for the videos it holds out, and each fold's `test.parquet`.
Probabilities are noisy labels (truth · 0.3 + uniform · 0.7) over random label runs. Then runs,
each in its own process so its peak memory is its own:

- the real `ensemble` stage (`python -m stages.ensemble`, `ensemble.method: ap`): coverage check,
  OOF files, per-fold and pooled per-class AP, fused test probabilities;
- the threshold tuning on the 3.5 M OOF frames: the real `thresholds` stage with
  `thresholds.method: f1` (with `--with-map` also `map`, the temporal-mAP search: minutes).

Embeddings are left out (`predict.embeddings: false`): at 512 float16 values per frame they
are 3.6 GB per 3.5 M frames, a disk copy, not a memory cost (streamed by row group).
Prints one JSON object: wall and CPU seconds and peak resident memory (MB) of each step
(wall time on a shared machine: compare CPU seconds).

Run: nice -n 10 python -m bench.ensemble   (add --frames 350000 for a quick look)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from vce.core.contracts import probs_schema
from vce.core.labels import LABELS

ROOT = Path(__file__).resolve().parents[1]


def labels_for(n: int, rng: np.random.Generator) -> np.ndarray:
    """(n, 17) uint8: a few random runs per label (rare findings, long anatomy regions)."""
    labels = np.zeros((n, len(LABELS)), np.uint8)
    for k in range(len(LABELS)):
        for _ in range(rng.integers(0, 4)):
            start = rng.integers(0, n)
            labels[start:start + rng.integers(5, max(6, n // 20)), k] = 1
    return labels


def write_probs(path: Path, videos: np.ndarray, frames: np.ndarray, probs: np.ndarray, group: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with pq.ParquetWriter(path, probs_schema()) as writer:
        for start in range(0, len(frames), group):
            end = start + group
            columns = {"video_id": videos[start:end], "frame": frames[start:end]}
            columns.update({label: probs[start:end, k] for k, label in enumerate(LABELS)})
            columns["valid"] = np.ones(len(columns["frame"]), bool)
            writer.write_table(pa.Table.from_pydict(columns, schema=probs_schema()))


def generate(root: Path, n_frames: int, n_test: int, n_videos: int, n_folds: int, group: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    per_video = n_frames // n_videos
    video_ids = np.array([f"{v + 1}" for v in range(n_videos)])
    fold_of_video = np.arange(n_videos) % n_folds
    videos = np.repeat(video_ids, per_video)
    frame = np.tile(np.arange(per_video, dtype=np.int64) * 5, n_videos)
    labels = np.concatenate([labels_for(per_video, rng) for _ in range(n_videos)])
    index = pd.DataFrame({"video_id": videos, "frame": frame, "index": np.tile(np.arange(per_video), n_videos),
                          "path": "x.png", "event_unit": "index", "capsule": ""})
    index[list(LABELS)] = labels
    index["split"] = "val"
    index["fold"] = np.repeat(fold_of_video, per_video)
    (root / "split").mkdir(parents=True)
    index.to_parquet(root / "split/frames.parquet", index=False)
    probs = (labels * 0.3 + rng.random(labels.shape, dtype=np.float32) * 0.7).astype(np.float32)
    for fold in range(n_folds):
        mine = index["fold"].to_numpy() == fold
        held = sorted(video_ids[fold_of_video == fold])
        write_probs(root / f"predict/fold_{fold}/val.parquet", videos[mine], frame[mine], probs[mine], group)
        (root / f"predict/fold_{fold}/coverage.json").write_text(json.dumps(
            {"fold": fold, "model": f"models/folds/{fold}/model.pt", "held_out_videos": held,
             "model_train_videos": sorted(set(video_ids) - set(held))}))
    del index, probs, labels
    test_per_video = n_test // 4
    test_videos = np.repeat(np.array([f"ukdd_navi_{v:05d}" for v in range(4)]), test_per_video)
    test_frames = np.tile(np.arange(test_per_video, dtype=np.int64), 4)
    pd.DataFrame({"video_id": test_videos, "frame": test_frames, "index": test_frames, "path": "x.png",
                  "event_unit": "frame", "capsule": ""}).to_parquet(root / "test_index.parquet", index=False)
    for fold in range(n_folds):
        test_probs = rng.random((len(test_frames), len(LABELS)), dtype=np.float32)
        write_probs(root / f"predict_test/fold_{fold}/test.parquet", test_videos, test_frames, test_probs, group)


def timed(argv: list[str]) -> dict:
    """Seconds and peak RSS (MB) of one child process (its own rusage, from wait4)."""
    began = time.perf_counter()
    with tempfile.TemporaryFile("w+") as log:
        child = subprocess.Popen([sys.executable, *argv], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True)
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.perf_counter() - began
        log.seek(0)
        output = log.read()
    if child.returncode != 0:
        raise SystemExit(f"{argv[1]} failed:\n{output}")
    return {"seconds": round(seconds, 1), "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 1),
            "peak_rss_mb": round(usage.ru_maxrss / 1024), "output": output.strip()[-300:]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=3_500_000, help="labelled frames (all out of fold)")
    parser.add_argument("--test-frames", type=int, default=3_500_000, help="test frames predicted by every fold")
    parser.add_argument("--videos", type=int, default=80)
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--row-group", type=int, default=65536, help="frames per Parquet row group (predict's)")
    parser.add_argument("--with-map", action="store_true", help="also thresholds.method map (minutes)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench_ensemble_") as tmp:
        root = Path(tmp)
        began = time.perf_counter()
        generate(root, args.frames, args.test_frames, args.videos, args.folds, args.row_group, args.seed)
        generated = time.perf_counter() - began
        params = yaml.safe_load((ROOT / "params.yaml").read_text())
        params["split"].update(n_folds=args.folds, folds=list(range(args.folds)))
        params["predict"]["embeddings"] = False
        params["ensemble"]["method"] = "ap"
        params["post"]["probs"] = "frame"
        results = {"frames": args.frames, "test_frames": args.test_frames, "folds": args.folds,
                   "generate_seconds": round(generated, 1)}
        methods = ["f1", "map"] if args.with_map else ["f1"]
        for step in ["ensemble", *methods]:
            if step != "ensemble":
                params["thresholds"]["method"] = step
            (root / "params.yaml").write_text(yaml.safe_dump(params))
            p = ["--params", str(root / "params.yaml")]
            if step == "ensemble":
                argv = ["-m", "stages.ensemble", *p, "--predict-dir", str(root / "predict"),
                        "--test-dir", str(root / "predict_test"), "--frames", str(root / "split/frames.parquet"),
                        "--out-dir", str(root / "ensemble"), "--metrics", str(root / "ensemble.json")]
            else:
                argv = ["-m", "stages.thresholds", *p, "--predict-dir", str(root / "ensemble"),
                        "--temporal-dir", str(root / "temporal"), "--frames", str(root / "ensemble/frames.parquet"),
                        "--out", str(root / f"thresholds_{step}.json"), "--metrics", str(root / f"tm_{step}.json")]
            results[step if step == "ensemble" else f"thresholds_{step}"] = timed(argv)
        metrics = json.loads((root / "ensemble.json").read_text())
        results["oof_map"] = metrics["oof"]["map"]
        results["fused_test_frames"] = metrics["test_frames"]
    results["cpus"] = len(os.sched_getaffinity(0))
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
