"""Why the score engine picked a run threshold: its tuning objective around the pick, and the plateau's middle.

    python -m bench.threshold_plateau --work W [--source model] [--label blood] [--apply]

W is a `bench.real_pixels --work` folder. The engine fitted there for one probability source
(W/events_<source>/thresholds.json; source `model`: the frame model's, `baseline`: the colour
baseline's) is read back, the validation probabilities are read as `fit_engine` read them
(re-centred per video, through the label's temperature if the engine has one), and one JSON
object is printed:

1. `grid`: the tuning objective (summed over the validation videos, the engine's `objective`)
   of the label's chosen decoding at every threshold of `thresholds.engine.thresholds`, its
   median window, minimum length and gate unchanged: whether the pick was a tie;
2. `plateau`: the thresholds over which that objective stays what it is at the pick, found at
   the validation frames' own probability levels (the objective can change only there), and
   `middle`, the plateau's middle in logit: the max-margin threshold, the one farthest from
   both edges where validation would score otherwise (`fit_gate` places a gate the same way);
3. with `--apply`: the events stage rerun with the label's threshold moved to `middle`
   (W/plateau_<source>/) and the label's held-out temporal AP there, beside the pick's.

Validation decides; the held-out numbers are reported, never used to choose. Only thresholded
runs without hysteresis are read (the probe's and the baseline's blood on these benches).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import yaml

from bench.real_pixels import read_json, stage

SOURCES = {"model": "predict", "baseline": "baseline"}


def plateau(levels: np.ndarray, value, threshold: float) -> tuple[float, float]:
    """(lower, upper): the thresholds t in (lower, upper] around `threshold` whose `value(t)`
    equals `value(threshold)`, scanned over the sorted distinct probability `levels` (runs at t
    are those of the frames >= t, so the value is constant between two levels). An edge no
    level bounds (every frame kept, or none) is the outermost level."""
    target = value(threshold)
    i = int(np.searchsorted(levels, threshold))  # threshold in (levels[i - 1], levels[i]]
    lo = i
    while lo > 0 and abs(value(levels[lo - 1]) - target) <= 1e-12:
        lo -= 1
    hi = min(i, len(levels) - 1)
    while hi + 1 < len(levels) and abs(value(levels[hi + 1]) - target) <= 1e-12:
        hi += 1
    return float(levels[max(lo - 1, 0)]), float(levels[hi])


def logit_middle(lower: float, upper: float) -> float:
    """The probability halfway between `lower` and `upper` in logit."""
    z = (np.log(lower / (1 - lower)) + np.log(upper / (1 - upper))) / 2
    return float(1 / (1 + np.exp(-z)))


def tuning_objective(work: Path, source: str, label: str):
    """(value(t), the validation frames' distinct levels of `label`, the engine params, the policy's JSON)."""
    from vce.core.contracts import read_index, read_probs
    from vce.core.labels import LABEL_INDEX
    from vce.core.params import from_dict
    from vce.post.engine import Engine, tuning_timeline
    from vce.post.engine.calibration import calibrated, recentred
    from vce.post.engine.candidates import run_candidates
    from vce.post.engine.gate import LabelObjective, gate_evidence
    from vce.post.events import labels_to_submission
    from vce.post.thresholds import ThresholdParams
    from vce.post.timeline import join_probs, labels_on_time

    params = from_dict(ThresholdParams, yaml.safe_load((work / "params.yaml").read_text())["thresholds"],
                       "thresholds").engine
    fitted = read_json(work / f"events_{source}/thresholds.json", "thresholds")["engine"]
    engine = Engine.from_dict(fitted)
    policy = engine.policies[label]
    if getattr(policy, "detector", None) != "threshold" or policy.ratio != 1.0 or policy.evidence == "region":
        raise SystemExit(f"{label}: {fitted['policies'][label]} is not thresholded runs without hysteresis")
    frames = read_index(work / "split/frames.parquet")
    probs, _ = join_probs(read_probs(work / SOURCES[source] / "val.parquet"), frames)
    gt = labels_to_submission(labels_on_time(frames[frames["video_id"].isin(set(probs["video_id"]))]))
    timeline = tuning_timeline(probs, params)
    if engine.centres is not None:
        timeline = recentred(timeline, engine.centres)
    if engine.temperatures is not None:
        timeline = calibrated(timeline, engine.temperatures)
    objective, k = LabelObjective(timeline, gt, params.objective), LABEL_INDEX[label]
    silent = objective.silent(label)

    def value(threshold: float) -> float:
        c = run_candidates(timeline, k, float(threshold), policy.median_window, policy.min_length, engine.top_k,
                           ratio=1.0, regions=policy.regions, shares=policy.shares)
        evidence = gate_evidence(c.features, policy)
        admitted = np.isfinite(evidence) & (True if policy.gate is None else evidence >= policy.gate)
        return float(np.where(admitted, objective.per_video(label, c.events, c.spans), silent).sum())

    levels = np.unique(timeline.probs[k][timeline.observed])
    return value, levels, params, fitted["policies"][label]


def apply_threshold(work: Path, source: str, label: str, threshold: float) -> dict:
    """Rerun the events stage with `label`'s threshold moved; its held-out temporal AP then."""
    from vce.eval.score import score

    out = work / f"plateau_{source}"
    out.mkdir(exist_ok=True)
    thresholds = read_json(work / f"events_{source}/thresholds.json", "thresholds")
    thresholds["engine"]["policies"][label]["threshold"] = threshold
    (out / "thresholds.json").write_text(json.dumps(thresholds))
    probs = work / SOURCES[source]
    stage("events", ["--params", str(work / "params.yaml"), "--held-out", str(work / "split/test.parquet"),
                     "--thresholds", str(out / "thresholds.json"), "--val-probs", str(probs / "val.parquet"),
                     "--test-probs", str(probs / "test.parquet"), "--frames", str(work / "split/frames.parquet"),
                     "--test-frames", str(work / "index/test.parquet"), "--out-dir", str(out / "events")])
    truth = read_json(work / "videos/test_ground_truth.json", "test ground truth")
    picked, moved = (score(truth, read_json(d / "submission.json", "events"))
                     for d in (work / f"events_{source}/events", out / "events"))
    return {name: {f"temporal_ap@{t}": round(result[f"per_label@{t}"][label], 4) for t in ("0.5", "0.95")}
            for name, result in (("picked", picked), ("middle", moved))}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", required=True, help="a bench.real_pixels --work folder")
    parser.add_argument("--source", choices=sorted(SOURCES), default="model", help="whose fitted engine")
    parser.add_argument("--label", default="blood")
    parser.add_argument("--apply", action="store_true", help="rerun events at the plateau's middle, score held-out")
    args = parser.parse_args(argv)
    work = Path(args.work)
    value, levels, params, policy = tuning_objective(work, args.source, args.label)
    lower, upper = plateau(levels, value, policy["threshold"])
    result = {"work": str(work), "source": args.source, "label": args.label,
              "picked": {key: policy[key] for key in ("threshold", "median_window", "min_length", "gate")},
              "objective": params.objective, "grid": {str(t): round(value(t), 4) for t in params.thresholds},
              "plateau": [round(lower, 4), round(upper, 4)], "middle": round(logit_middle(lower, upper), 4)}
    if args.apply:
        result["held_out"] = apply_threshold(work, args.source, args.label, result["middle"])
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
