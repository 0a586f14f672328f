"""Route × training seed on the demo: is `post.probs: auto` at least the frame route on held-out videos?

    python -m bench.route_seeds [--seeds 3] [--work DIR] [--set train.epochs=1 ...] [--tiny]

For each training seed (`base.seed` = 0, 1, …; the demo data, `demo.seed`, stays fixed) the demo
chain runs once through the project's stages (`main([...])`, scratch folders under --work):
demo_data → index → split → cache_frames → prompts → train → predict → temporal (post.probs
auto: routes chosen on cross-fitted validation evidence). Then thresholds → events → score run
twice, on the frame model's probabilities (`post.probs: frame`) and on the routed ones (`auto`),
and the held-out test videos (`score.test_gt`, never trained or tuned on) are scored.

Prints one JSON object: per route the test mAP@0.5 / @0.95 of every seed, their mean and
standard deviation (ddof 1), the per-seed difference auto − frame, each seed's route counts, and
for each label auto moved off the frame route its test AP change (auto − frame) per seed.
Two demo test videos are noise: read the spread, not one run. `--tiny` (4 short videos, 1 epoch,
20 temporal steps) only checks that the script runs. The full default run trains 3 × 8 epochs.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import yaml

# One stage runner and one `section.key=value` parser for the benches (stage logs go to stderr).
from bench.real_pixels import set_value, stage
from vce.eval.score import score

ROOT = Path(__file__).resolve().parents[1]
ROUTES = ("frame", "auto")
TINY = ["demo.n_videos=4", "demo.frames_per_video=240", "demo.n_test_videos=1", "demo.test_frames_per_video=120",
        "split.val_fraction=0.5", "train.epochs=1", "train.batch_size=32", "train.samples_per_epoch=256",
        "temporal.steps=20", "temporal.chunk_frames=64"]


def write_params(work: Path, seed: int, source: str, assignments: list[str]) -> Path:
    """The repository's params.yaml with the data under `work`, the training seed and the route."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["data"].update(root=str(work / "demo/galar"), test_root=str(work / "demo/test"))
    params["score"]["test_gt"] = str(work / "demo/test_ground_truth.json")
    params["train"].update(num_workers=0)
    params["predict"].update(num_workers=0)
    for assignment in assignments:
        set_value(params, assignment)
    params["base"]["seed"] = seed
    params["post"]["probs"] = source
    path = work / f"params_{source}.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def run_seed(work: Path, seed: int, assignments: list[str], reuse: bool = False) -> dict:
    """One training seed: the chain once, then thresholds/events/score per route; test mAPs and routes."""
    work.mkdir(parents=True, exist_ok=True)
    paths = {source: write_params(work, seed, source, assignments) for source in ROUTES}
    p = ["--params", str(paths["auto"])]
    d = {key: str(work / rel) for key, rel in {
        "frames": "split/frames.parquet", "test": "index/test.parquet", "predict": "predict", "temporal": "temporal",
        "model": "models/model.pt", "prompts": "models/prompt_embeddings.pt", "cache": "cache",
        "held_out": "split/test.parquet"}.items()}
    stage("demo_data", p + ["--out", str(work / "demo")])
    stage("index", p + ["--frames-out", str(work / "index/frames.parquet"), "--test-out", d["test"],
                        "--report", str(work / "metrics/index_report.json")])
    stage("split", p + ["--index", str(work / "index/frames.parquet"), "--out", d["frames"], "--test-out", d["held_out"],
                        "--metrics", str(work / "metrics/split.json")])
    stage("cache_frames", p + ["--frames", d["frames"], "--test", d["test"], "--held-out", d["held_out"], "--out", d["cache"]])
    stage("prompts", p + ["--out", d["prompts"]])
    reused = reuse and all((work / "predict" / f"{name}.parquet").is_file() for name in
                           ("val", "test", "val_embeddings", "test_embeddings"))
    if not reused:  # the frame model and its probabilities do not depend on the stages after predict
        stage("train", p + ["--frames", d["frames"], "--cache", d["cache"], "--prompts", d["prompts"],
                            "--model-out", d["model"], "--state-dir", str(work / "models/train_state"),
                            "--metrics", str(work / "metrics/train.json"), "--live-dir", str(work / "metrics/train")])
        stage("predict", p + ["--model", d["model"], "--frames", d["frames"], "--test", d["test"], "--cache", d["cache"],
                              "--held-out", d["held_out"], "--out-dir", d["predict"],
                              "--report", str(work / "metrics/predict.json")])
    stage("temporal", p + ["--predict-dir", d["predict"], "--frames", d["frames"], "--out-dir", d["temporal"],
                           "--metrics", str(work / "metrics/temporal.json"), "--route", str(work / "metrics/route.json"),
                           "--model-out", str(work / "models/temporal.pt")])
    route = json.loads((work / "metrics/route.json").read_text())
    out = {"routes": route["counts"], "moved": {label: r for label, r in route["routes"].items() if r != "frame"}}
    for source, params in paths.items():
        q, r = ["--params", str(params)], work / source
        stage("thresholds", q + ["--predict-dir", d["predict"], "--temporal-dir", d["temporal"], "--frames", d["frames"],
                                 "--out", str(r / "thresholds.json"), "--metrics", str(r / "thresholds_metrics.json")])
        stage("events", q + ["--thresholds", str(r / "thresholds.json"), "--predict-dir", d["predict"],
                             "--temporal-dir", d["temporal"], "--frames", d["frames"], "--test-frames", d["test"],
                             "--held-out", d["held_out"], "--out-dir", str(r / "events")])
        stage("score", q + ["--events", str(r / "events/val.json"), "--test-events", str(r / "events/submission.json"),
                            "--frames", d["frames"], "--held-out", d["held_out"], "--gt-out", str(r / "val_gt.json"),
                            "--metrics", str(r / "score.json"), "--frame-metrics", str(r / "thresholds_metrics.json"),
                            "--val-headline", str(r / "headline_val.json"),
                            "--test-headline", str(r / "headline_test.json")])
        test = json.loads((r / "score.json").read_text())["test"]
        out[source] = {key: round(float(test[key]), 4) for key in ("map@0.5", "map@0.95")}
        per_label = score(json.loads((r / "test_gt.json").read_text()), json.loads((r / "events/submission.json").read_text()))
        out[source]["per_label"] = {key: {label: round(float(ap), 4) for label, ap in per_label[f"per_label@{key[4:]}"].items()}
                                    for key in ("map@0.5", "map@0.95")}
    return out


def summary(runs: dict[int, dict]) -> dict:
    """Per route and metric: every seed's value, mean and standard deviation; auto − frame per seed."""
    result = {"seeds": sorted(runs), "routes_per_seed": {seed: run["routes"] for seed, run in runs.items()}}
    for source in ROUTES:
        result[source] = {}
        for key in ("map@0.5", "map@0.95"):
            values = np.array([runs[seed][source][key] for seed in sorted(runs)])
            result[source][key] = {"values": values.tolist(), "mean": round(float(values.mean()), 4),
                                   "std": round(float(values.std(ddof=1)), 4) if len(values) > 1 else None}
    result["auto_minus_frame"] = {key: [round(runs[s]["auto"][key] - runs[s]["frame"][key], 4) for s in sorted(runs)]
                                  for key in ("map@0.5", "map@0.95")}
    # Where auto and frame differ: each moved label's test AP change (auto − frame) on each seed.
    result["moved_labels"] = {seed: {label: {"route": route, **{key: round(run["auto"]["per_label"][key][label]
                                                                        - run["frame"]["per_label"][key][label], 4)
                                                              for key in ("map@0.5", "map@0.95")}}
                                     for label, route in run["moved"].items()} for seed, run in runs.items()}
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="training seeds 0..N-1 (base.seed)")
    parser.add_argument("--work", default=None, help="scratch folder (default: a temporary one, removed)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="params override, repeatable")
    parser.add_argument("--tiny", action="store_true", help="a seconds-long smoke run (4 short videos, 1 epoch)")
    parser.add_argument("--reuse-frame-model", action="store_true",
                        help="keep each seed's trained model and predictions in --work (train and predict skipped "
                             "where predict/ is complete): rerun only the temporal stage and what follows")
    args = parser.parse_args(argv)
    assignments = (TINY if args.tiny else []) + args.set
    with tempfile.TemporaryDirectory(prefix="vce_route_seeds_") as scratch:
        base = Path(args.work or scratch)
        runs = {seed: run_seed(base / f"seed_{seed}", seed, assignments, args.reuse_frame_model)
                for seed in range(args.seeds)}
    print(json.dumps({"bench": "route_seeds", "overrides": assignments, **summary(runs)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
