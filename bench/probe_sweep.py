"""What a probe sweep costs once the features exist: train + predict per setting, the backbone never run.

    python -m bench.real_pixels --recipe lite0_probe --work W ...      # the first run: embed once
    python -m bench.probe_sweep --work W --set train.lr_head=3e-4 --set train.lr_head=3e-3 \\
        --set train.weight_decay=0.05

For each `--set` (one setting each, applied to W's params.yaml), the train and predict stages run
through their `main([...])` on W's cached features (`W/embed`, stage embed), outputs under
`W/sweep/<i>/`: exactly what `dvc exp run -S KEY=VALUE` of a head or training key recomputes up
to the probabilities (dvc.yaml: `embed` depends on none of them). Prints one JSON object: per
setting the seconds of train and of predict and the best epoch's validation frame mAP (the
held-out videos are not scored here: a sweep picks on validation), and the total wall time.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys
import time
from pathlib import Path

import yaml

from bench.real_pixels import set_value


def stage(name: str, argv: list[str]) -> float:
    """Run stage `name`; its wall seconds (its output goes to stderr: stdout is the JSON)."""
    began = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):
        code = importlib.import_module(f"stages.{name}").main(argv)
    if code != 0:
        raise SystemExit(f"stage {name} failed (exit {code})")
    return time.perf_counter() - began


def sweep(work: Path, settings: list[str]) -> dict:
    base = yaml.safe_load((work / "params.yaml").read_text())
    if not base["train"]["freeze_backbone"]:
        raise SystemExit(f"{work}/params.yaml: train.freeze_backbone is false: no features to sweep a probe on")
    began, runs = time.perf_counter(), []
    for i, setting in enumerate(settings):
        out = work / "sweep" / str(i)
        out.mkdir(parents=True, exist_ok=True)
        params = yaml.safe_load(yaml.safe_dump(base))
        set_value(params, setting)
        (out / "params.yaml").write_text(yaml.safe_dump(params))
        p = ["--params", str(out / "params.yaml")]
        common = ["--frames", str(work / "split/frames.parquet"), "--cache", str(work / "cache"),
                  "--features", str(work / "embed")]
        train_s = stage("train", p + common + ["--prompts", str(work / "models/prompt_embeddings.pt"),
                                               "--model-out", str(out / "model.pt"), "--state-dir", str(out / "state"),
                                               "--metrics", str(out / "train.json"), "--live-dir", str(out / "live")])
        predict_s = stage("predict", p + common + ["--model", str(out / "model.pt"), "--test",
                                                   str(work / "index/test.parquet"), "--held-out",
                                                   str(work / "split/test.parquet"), "--out-dir", str(out / "predict"),
                                                   "--report", str(out / "predict.json")])
        best = json.loads((out / "train.json").read_text())["best"]
        runs.append({"set": setting, "train_seconds": round(train_s, 1), "predict_seconds": round(predict_s, 1),
                     "best_epoch": best["epoch"], "best_val_map": round(best["val_map"], 4)})
    return {"bench": "probe_sweep", "work": str(work), "source": base["model"]["source"], "runs": runs,
            "total_seconds": round(time.perf_counter() - began, 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", required=True, help="a bench.real_pixels --work folder whose run froze the backbone")
    parser.add_argument("--set", action="append", required=True, metavar="SECTION.KEY=VALUE",
                        help="one probe setting per --set (repeatable)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    print(json.dumps(sweep(Path(args.work), args.set), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
