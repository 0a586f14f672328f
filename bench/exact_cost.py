"""What exact CPU numerics (`base.exact_cpu`) cost: the train and temporal stages on the demo, on and off.

Prepares the demo (params.yaml's `demo` section, stages demo_data → prompts) in a temporary
folder, then runs `python -m stages.train` (fold 0, `--epochs` epochs) and `python -m stages.predict`
as DVC does, each `--repeats` times with `base.exact_cpu` true and false, and prints one JSON
object: CPU seconds (user + system of the child) and wall seconds per run, and the median ratio.
CPU seconds are the figure to quote on a shared machine; wall is what a user waits on an idle one.

    python -m bench.exact_cost [--epochs 1] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(command: list[str], env: dict) -> dict:
    cpu, wall = child_cpu(), time.perf_counter()
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if run.returncode:
        sys.exit(f"{' '.join(command)} failed:\n{run.stderr[-2000:]}")
    return {"cpu_s": round(child_cpu() - cpu, 1), "wall_s": round(time.perf_counter() - wall, 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=1, help="training epochs per run")
    parser.add_argument("--repeats", type=int, default=2, help="runs per setting")
    args = parser.parse_args(argv)
    env = {**os.environ, "CI": "1"}
    with tempfile.TemporaryDirectory(prefix="exact_cost.") as tmp:
        d = Path(tmp)
        params = yaml.safe_load((ROOT / "params.yaml").read_text())
        params["data"].update(root=str(d / "demo/galar"), test_root=str(d / "demo/test"))
        params["train"]["epochs"] = args.epochs
        p = ["--params", str(d / "params.yaml")]
        prepare = {
            "demo_data": ["--out", str(d / "demo")],
            "index": ["--frames-out", str(d / "index/frames.parquet"), "--test-out", str(d / "index/test.parquet"),
                      "--report", str(d / "index_report.json")],
            "split": ["--index", str(d / "index/frames.parquet"), "--out", str(d / "split/frames.parquet"),
                      "--metrics", str(d / "split.json")],
            "cache_frames": ["--frames", str(d / "split/frames.parquet"), "--test", str(d / "index/test.parquet"),
                             "--held-out", str(d / "split/test.parquet"), "--out", str(d / "cache")],
            "prompts": ["--out", str(d / "prompts.pt")],
        }
        (d / "params.yaml").write_text(yaml.safe_dump(params))
        for stage, extra in prepare.items():
            timed([sys.executable, "-m", f"stages.{stage}", *p, *extra], env)
        results: dict[str, dict] = {}
        for exact in (True, False):
            params["base"]["exact_cpu"] = exact
            (d / "params.yaml").write_text(yaml.safe_dump(params))
            name = "exact" if exact else "native"
            for r in range(args.repeats):
                out = d / f"{name}_{r}"
                train = [sys.executable, "-m", "stages.train", *p, "--frames", str(d / "split/frames.parquet"),
                         "--cache", str(d / "cache"), "--prompts", str(d / "prompts.pt"),
                         "--model-out", str(out / "model.pt"), "--state-dir", str(out / "state"),
                         "--metrics", str(out / "train.json"), "--live-dir", str(out / "live")]
                predict = [sys.executable, "-m", "stages.predict", *p, "--part", "labelled", "--model",
                           str(out / "model.pt"), "--frames", str(d / "split/frames.parquet"), "--cache",
                           str(d / "cache"), "--out-dir", str(out / "predict"), "--report", str(out / "p.json")]
                results.setdefault(f"train_{name}", []).append(timed(train, env))
                results.setdefault(f"predict_{name}", []).append(timed(predict, env))
    summary = {"epochs": args.epochs, "repeats": args.repeats, "cpus": os.cpu_count(), "runs": results}
    for stage in ("train", "predict"):
        for key in ("cpu_s", "wall_s"):
            exact = statistics.median(run[key] for run in results[f"{stage}_exact"])
            native = statistics.median(run[key] for run in results[f"{stage}_native"])
            summary[f"{stage}_{key}_ratio"] = round(exact / native, 2)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
