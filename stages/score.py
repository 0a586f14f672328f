"""Stage `score`: official temporal mAP@0.5 / @0.95 of the validation events (and test events
when the test ground truth is known, as for the demo).

The ground truth is built from the validation labels exactly as the challenge builds its
JSON (a new event whenever the set of active labels changes, in the index's event unit),
written beside the score so `python -m vce.eval.score` can rescore any file against it.
"""

from __future__ import annotations

import argparse
import sys

from vce.core import runner
from vce.core.contracts import read_index
from vce.core.io import read_json, write_json
from vce.core.params import ScoreParams, load_section
from vce.eval.score import score
from vce.post.events import labels_to_submission
from vce.post.timeline import labels_on_time


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", default="data/events/val.json", help="predicted validation events")
    parser.add_argument("--frames", default="data/split/frames.parquet", help="frame index with labels and split")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--test-events", default="data/events/submission.json", help="predicted test-set events")
    parser.add_argument("--gt-out", default="data/score/val_gt.json")
    parser.add_argument("--metrics", default="metrics/score.json")
    return parser.parse_args(argv)


@runner.stage
def main(argv=None) -> int:
    args = parse_args(argv)
    test_gt = load_section(args.params, "score", ScoreParams).test_gt
    frames = read_index(args.frames)
    prediction = read_json(args.events, "validation events")
    gt = labels_to_submission(labels_on_time(frames[frames["split"] == "val"]))
    write_json(args.gt_out, gt, indent=None)
    result = score(gt, prediction)
    print(f"validation: mAP@0.5 = {result['map@0.5']:.4f}   mAP@0.95 = {result['map@0.95']:.4f}")
    if test_gt is not None:
        # A held-out number: nothing upstream (training, thresholds, tuning) saw these videos.
        test = score(read_json(test_gt, "score.test_gt"), read_json(args.test_events, "test events"))
        result["test"] = {key: test[key] for key in ("map@0.5", "map@0.95", "per_video@0.5", "per_video@0.95")}
        print(f"test:       mAP@0.5 = {test['map@0.5']:.4f}   mAP@0.95 = {test['map@0.95']:.4f}")
    write_json(args.metrics, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
