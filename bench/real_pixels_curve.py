"""Real pixels across pictures: a learning curve over the number of distinct training stills.

    python -m bench.real_pixels_curve [--counts 20 45 90] [--seeds 3] [--work DIR] [--threads 1] [--tiny]
        [--recipe lite0_probe]

For every (N, seed), `bench.real_pixels --train-stills N --seed S --set base.seed=S` runs once in
its own process with the documented real-pixels recipe (`RECIPE`): the held-out and validation
videos are fixed by the seed, the training videos hold N distinct bleeding and N non-bleeding
stills (no still or source picture shared with the other videos), about the same training
frames for every N. `--recipe NAME` runs `recipes/NAME.yaml` instead (a pretrained probe beside
the from-scratch curve: the same videos per seed, so the baseline columns are the same). Each run's JSON is kept in --work (`n<N>_s<S>.json`, its log beside it) and
a rerun with the same --work skips the runs already there.

Prints one JSON object (also written to --out after every run, `complete` false until the last):
per N and per source — the frame model (`frame`), the default `post.probs: auto` route (`auto`),
the temporal route itself (`temporal`: `post.probs: temporal`, every label on the cross-fitted
temporal model), the colour baseline (`baseline`) — held-out blood frame AUC / AP, blood temporal AP@0.5 / @0.95
and test mAP@0.5 / @0.95, each as the values per seed, their mean and sd (ddof 1); auto − frame
and temporal − frame per seed; blood's route per seed; the training frames and distinct stills of every run.
`--tiny` (1 epoch, 256 frames, 20 temporal steps) only checks that the chain runs; `--table
JSON` prints a saved curve as the Markdown tables of docs/real_pixels.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ["loss.con_weight=0", "model.fusion=cls", "train.samples_per_epoch=2304"]
TINY = ["train.epochs=1", "train.samples_per_epoch=256", "temporal.steps=20", "temporal.chunk_frames=64"]
SOURCES = {"frame": "model", "auto": "model+temporal", "temporal": "temporal", "baseline": "baseline"}
METRICS = ("auc", "ap", "temporal_ap@0.5", "temporal_ap@0.95", "test_map@0.5", "test_map@0.95")


def run_point(work: Path, count: int, seed: int, threads: int, assignments: list[str], reuse: bool = False,
              recipe: str | None = None) -> dict:
    """One (N, seed) run of bench.real_pixels in a child process; its JSON (kept in `work`).
    `reuse`: rerun the stages after predict on the run's kept frame model (`--reuse-frame-model`)."""
    name = f"n{count}_s{seed}"
    result_path, log_path = work / f"{name}.json", work / f"{name}.log"
    if result_path.exists() and not reuse:
        return json.loads(result_path.read_text())
    command = [sys.executable, "-m", "bench.real_pixels", "--threads", str(threads), "--seed", str(seed),
               "--train-stills", str(count), "--work", str(work / name), "--set", f"base.seed={seed}",
               *(["--reuse-frame-model"] if reuse else []), *(["--recipe", recipe] if recipe else [])]
    for assignment in assignments:
        command += ["--set", assignment]
    with log_path.open("w") as log:
        done = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed (exit {done.returncode}); see {log_path}")
    result_path.write_text(done.stdout)
    return json.loads(done.stdout)


def numbers(run: dict, source: str) -> dict:
    """The six held-out numbers of one source in one run."""
    result = run["results"][SOURCES[source]]
    return {"auc": result["frame"]["auc"], "ap": result["frame"]["ap"],
            **{key: result[key] for key in METRICS[2:]}}


def spread(values: list[float]) -> dict:
    array = np.asarray(values, np.float64)
    return {"values": [round(float(v), 4) for v in array], "mean": round(float(array.mean()), 4),
            "sd": round(float(array.std(ddof=1)), 4) if len(array) > 1 else None}


def summary(runs: dict[tuple[int, int], dict], counts: list[int], seeds: list[int]) -> dict:
    """Per N: per source and metric the seeds' values, mean and sd; auto − frame and temporal − frame per seed."""
    curve = {}
    for count in counts:
        done = [seed for seed in seeds if (count, seed) in runs]
        if not done:
            continue
        point = {"seeds": done}
        for source in SOURCES:
            per_seed = [numbers(runs[count, seed], source) for seed in done]
            point[source] = {key: spread([n[key] for n in per_seed]) for key in METRICS}
        for route in ("auto", "temporal"):
            point[f"{route}_minus_frame"] = {key: [round(numbers(runs[count, s], route)[key]
                                                         - numbers(runs[count, s], "frame")[key], 4) for s in done]
                                             for key in METRICS}
        point["blood_route"] = [runs[count, s].get("routes", {}).get("blood") for s in done]
        point["moved_labels"] = [runs[count, s].get("routes", {}).get("moved") for s in done]
        point["train_stills"] = [runs[count, s]["data"]["train_stills"] for s in done]
        point["best_epoch"] = [runs[count, s]["train"]["best_epoch"] for s in done]
        curve[str(count)] = point
    return curve


def markdown_tables(result: dict) -> str:
    """The curve as two Markdown tables (mean ± sd over the seeds per N), for docs/real_pixels.md."""
    def cell(point: dict, source: str, keys: tuple[str, str]) -> str:
        return " / ".join(f"{point[source][k]['mean']:.3f} ± {point[source][k]['sd'] or 0:.3f}" for k in keys)

    frame_level = ["| distinct stills per class (N) | seeds | frame model AUC / AP | auto route AUC / AP "
                   "| temporal route AUC / AP | colour baseline AUC / AP |", "|---|---|---|---|---|---|"]
    events = ["| N | blood tAP@0.5 / @0.95, frame model | same, auto route | same, temporal route | same, baseline "
              "| test mAP@0.5 / @0.95, frame route | same, auto route | same, temporal route |",
              "|---|---|---|---|---|---|---|---|"]
    for count, point in result["curve"].items():
        seeds = len(point["seeds"])
        frame_level.append(f"| {count} | {seeds} | " + " | ".join(cell(point, source, ("auc", "ap"))
                                                               for source in SOURCES) + " |")
        tap = ("temporal_ap@0.5", "temporal_ap@0.95")
        test_map = ("test_map@0.5", "test_map@0.95")
        events.append(f"| {count} | " + " | ".join(cell(point, source, tap) for source in SOURCES) + " | "
                      + " | ".join(cell(point, source, test_map) for source in ("frame", "auto", "temporal")) + " |")
    return "\n".join(frame_level) + "\n\n" + "\n".join(events) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[20, 45, 90], help="distinct training stills per class")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..S-1: builder --seed and base.seed")
    parser.add_argument("--work", default="/tmp/real_pixels_curve", help="per-run JSON, logs and scratch folders")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads per run")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="params override after the recipe, repeatable")
    parser.add_argument("--recipe", default=None, metavar="NAME",
                        help="recipes/NAME.yaml instead of the from-scratch RECIPE (e.g. lite0_probe: a real "
                             "pretrained backbone, frozen, its heads probed); --set values still apply after it")
    parser.add_argument("--tiny", action="store_true", help="a smoke run: 1 short epoch, 20 temporal steps")
    parser.add_argument("--reuse-frame-model", action="store_true",
                        help="rerun every point's stages after predict on its kept frame model (after a change "
                             "to the temporal stage, the route or the post-processing)")
    parser.add_argument("--out", default=None,
                        help="JSON written here (default bench/results/real_pixels_curve[_RECIPE].json; none with --tiny)")
    parser.add_argument("--table", default=None, metavar="JSON",
                        help="only print the Markdown tables of a saved curve JSON (no runs)")
    args = parser.parse_args(argv)
    if args.table:
        print(markdown_tables(json.loads(Path(args.table).read_text())), end="")
        return 0
    assignments = ([] if args.recipe else RECIPE) + (TINY if args.tiny else []) + args.set
    default = f"bench/results/real_pixels_curve{'_' + args.recipe if args.recipe else ''}.json"
    out = Path(args.out) if args.out else None if args.tiny else ROOT / default
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    seeds, runs = list(range(args.seeds)), {}
    result = {}
    for seed in seeds:  # every N of a seed before the next seed: a stopped curve still spans N
        for count in args.counts:
            runs[count, seed] = run_point(work, count, seed, args.threads, assignments, args.reuse_frame_model,
                                          args.recipe)
            result = {"bench": "real_pixels_curve", "complete": len(runs) == len(seeds) * len(args.counts),
                      "recipe": assignments, "recipe_file": args.recipe, "counts": args.counts, "seeds": seeds,
                      "command": f"python -m bench.real_pixels --threads {args.threads} --seed S --train-stills N "
                                 "--set base.seed=S" + (f" --recipe {args.recipe}" if args.recipe else "")
                                 + "".join(f" --set {a}" for a in assignments),
                      "held_out": "2 RARE-VISION-layout videos per seed (30 bleeding + 30 other stills), "
                                  "never trained or tuned on; 2 validation videos pinned (split.val_videos)",
                      "curve": summary(runs, args.counts, seeds)}
            if out:
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
