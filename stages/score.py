"""Stage `score`: official temporal mAP@0.5 / @0.95 of the validation events.

The ground truth is built from the validation labels exactly as the challenge builds its
JSON (a new event whenever the set of active labels changes, in the index's event unit),
written beside the score so `python -m vce.score` can rescore any file against it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# Import this checkout's vce/ (queued DVC experiments run in copies of the repository).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vce import cli  # noqa: E402
from vce.data import read_index  # noqa: E402
from vce.events import labels_to_submission  # noqa: E402
from vce.io import write_json  # noqa: E402
from vce.score import score  # noqa: E402
from vce.timeline import labels_on_time  # noqa: E402


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", default="data/events/val.json", help="predicted validation events")
    parser.add_argument("--frames", default="data/split/frames.parquet", help="frame index with labels and split")
    parser.add_argument("--gt-out", default="data/score/val_gt.json")
    parser.add_argument("--metrics", default="metrics/score.json")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    frames = read_index(args.frames)
    prediction = json.loads(Path(args.events).read_text())
    gt = labels_to_submission(labels_on_time(frames[frames["split"] == "val"]))
    write_json(args.gt_out, gt, indent=None)
    result = score(gt, prediction)
    write_json(args.metrics, result)
    print(f"mAP@0.5 = {result['map@0.5']:.4f}   mAP@0.95 = {result['map@0.95']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(lambda: main()))
