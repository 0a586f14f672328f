"""Events post-processing speed on full-Galar size: 3.5 M frames x 17 labels.

Frame probabilities: the real Galar timelines (`../shared/fixtures/galar_gt_events.json`) with
noisy probabilities (truth * 0.6 + uniform noise * 0.7, seeded), so events are realistic in
number. Prints one JSON object with the seconds of `probs_to_submission` (best of `--repeats`)
for the default parameters and for the seed's recipe, and the event counts.

Run: python -m bench.events   (about 30 s on 2 cores)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from bench.simulate import frame_labels_from_events
from vce.core.labels import LABELS
from vce.core.params import load_section
from vce.post.events import EventParams, probs_to_submission

ROOT = Path(__file__).resolve().parents[1]
PARAMS = ROOT / "params.yaml"  # every knob not changed here is the file's

FIXTURE = ROOT.parent / "shared" / "fixtures" / "galar_gt_events.json"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    gt = json.loads(FIXTURE.read_text())
    frame_probs = frame_labels_from_events(gt)
    rng = np.random.default_rng(0)
    for label in LABELS:
        noise = rng.random(len(frame_probs), dtype=np.float32) * 0.7
        frame_probs[label] = frame_probs[label].to_numpy(np.float32) * 0.6 + noise
    thresholds = {label: 0.5 for label in LABELS}
    results = {"frames": len(frame_probs), "labels": len(LABELS)}
    for name, params in {
        "params.yaml": load_section(PARAMS, "events", EventParams),
        "seed_recipe": load_section(PARAMS, "events", EventParams, median_window=7, fill_gap=5, min_length=3,
                                    presence="none"),
        "per_label": load_section(PARAMS, "events", EventParams, style="per_label"),
    }.items():
        seconds = []
        for _ in range(args.repeats):
            began = time.perf_counter()
            sub = probs_to_submission(frame_probs, thresholds, params)
            seconds.append(time.perf_counter() - began)
        results[name] = {
            "seconds": round(min(seconds), 2),
            "events": sum(len(v["events"]) for v in sub["videos"]),
        }
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
