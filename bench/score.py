"""Fast official scorer vs the direct transcription of the definition, on full-Galar-size input.

Prediction: the official ground truth of all 80 Galar videos (`../shared/fixtures/galar_gt_events.json`)
with every event shifted by 1 or 2 frames either way (seeded). Prints one JSON object: seconds
of each scorer (fast: best of `--repeats`, checks included), the speed-up, and whether every
number (overall, per video, per label, both thresholds) agrees to 1e-12.

Run: python -m bench.score   (about 10 s on 2 cores, most of it the reference)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from vce.eval.score import score
from vce.eval.score_reference import score_reference, shifted_submission

ROOT = Path(__file__).resolve().parents[1]

FIXTURE = ROOT.parent / "shared" / "fixtures" / "galar_gt_events.json"


def max_difference(a: dict, b: dict) -> float:
    worst = 0.0
    for key, value in b.items():
        if isinstance(value, dict):
            assert a[key].keys() == value.keys(), key
            worst = max([worst] + [abs(a[key][k] - value[k]) for k in value])
        else:
            worst = max(worst, abs(a[key] - value))
    return worst


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    gt = json.loads(FIXTURE.read_text())
    pred = shifted_submission(gt, args.seed)
    fast_seconds = []
    for _ in range(args.repeats):
        began = time.perf_counter()
        fast = score(gt, pred)
        fast_seconds.append(time.perf_counter() - began)
    began = time.perf_counter()
    reference = score_reference(gt, pred)
    reference_seconds = time.perf_counter() - began
    difference = max_difference(fast, reference)
    print(json.dumps({
        "events": sum(len(v["events"]) for v in gt["videos"]),
        "fast_seconds": round(min(fast_seconds), 4),
        "reference_seconds": round(reference_seconds, 3),
        "speedup": round(reference_seconds / min(fast_seconds), 1),
        "max_abs_difference": difference,
        "identical_to_1e-12": difference <= 1e-12,
        "map@0.5": fast["map@0.5"],
        "map@0.95": fast["map@0.95"],
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
