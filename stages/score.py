"""Stage `score`: official temporal mAP@0.5 / @0.95 of the validation events (and test events
when the test ground truth is known, as for the demo).

The ground truth is built from the validation labels exactly as the challenge builds its
JSON (a new event whenever the set of active labels changes, in the index's event unit),
written beside the score so `python -m vce.eval.score` can rescore any file against it.
The test ground truth is `score.test_gt` for the data.test_root videos and, built the same way
from their labels, that of the labelled videos `split.test_videos` holds out (`--held-out`);
the union is written beside the validation one (`test_gt.json`, no video when not scored).

Two layers of metrics. The headline (`dvc metrics show`, `dvc exp show`): one small file per
set, `--val-headline` and `--test-headline`, with map@0.5, map@0.95, the empty submission's
empty@0.5 / empty@0.95 (the floor: every label absent scores AP 1) and, for validation, the
frame mAP of the probabilities that fed the events. The detail (per video, per label) goes to
`--metrics`, read by the report, not declared as DVC metrics.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from vce.core import runner
from vce.core.io import read_json, write_json
from vce.core.params import ScoreParams, load_section


def parse_args(argv):
    parser = argparse.ArgumentParser(prog=runner.module_prog(__spec__), description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--events", default="data/events/val.json", help="predicted validation events")
    parser.add_argument("--frames", default="data/ensemble/frames.parquet", help="frame index with labels and split")
    parser.add_argument("--params", default="params.yaml", help="params file (section score)")
    parser.add_argument("--test-events", default="data/events/submission.json", help="predicted test-set events")
    parser.add_argument("--frame-metrics", default="metrics/thresholds.json",
                        help="the thresholds stage's metrics: frame_map of the probabilities behind the events")
    parser.add_argument("--held-out", default="data/split/test.parquet",
                        help="labelled test videos held out by split.test_videos ('': none)")
    parser.add_argument("--gt-out", default="data/score/val_gt.json", help="validation ground truth written here")
    parser.add_argument("--test-gt-out", default=None,
                        help="the test ground truth scored against, written here (None: test_gt.json beside --gt-out)")
    parser.add_argument("--metrics", default="metrics/score.json", help="detailed scores: per video and per label")
    parser.add_argument("--val-headline", default="metrics/headline/val.json", help="headline validation metrics")
    parser.add_argument("--test-headline", default="metrics/headline/test.json",
                        help="headline test metrics ({} without a known test ground truth)")
    return parser.parse_args(argv)


def empty_submission(gt: dict) -> dict:
    """The submission with no event at all, for the ground truth's videos."""
    return {"videos": [{"video_id": video["video_id"], "events": []} for video in gt["videos"]]}


def headline(result: dict, empty: dict, frame_map: float | None = None) -> dict:
    """The declared metrics of one set: short keys, so `dvc metrics show` fits in 100 columns."""
    values = {"map@0.5": result["map@0.5"], "map@0.95": result["map@0.95"],
              "empty@0.5": empty["map@0.5"], "empty@0.95": empty["map@0.95"]}
    if frame_map is not None:
        values["frame_map"] = frame_map
    return values


def score_line(name: str, result: dict, empty: dict, n_videos: int, n_events: int) -> str:
    return (f"score: {name:<10} mAP@0.5 = {result['map@0.5']:.4f}  mAP@0.95 = {result['map@0.95']:.4f}  "
            f"(empty submission {empty['map@0.5']:.4f} / {empty['map@0.95']:.4f}; "
            f"{n_events} predicted events, {n_videos} videos)")


def _n_events(submission: dict) -> int:
    return sum(len(video["events"]) for video in submission["videos"])


def known_test_truth(events_path: str, test_gt: str | None, held_out) -> tuple[dict | None, dict | None]:
    """(ground truth, submission) of the test videos whose truth is known, or (None, None).

    Known: the data.test_root videos through `score.test_gt`, the held-out labelled videos
    (split.test_videos) through their labels. Test-root videos without `score.test_gt` are left
    out of the score, with a warning. The submission must hold exactly the known videos.
    """
    from vce.eval.score import check_submission
    from vce.post.events import labels_to_submission
    from vce.post.timeline import labels_on_time
    held_gt = labels_to_submission(labels_on_time(held_out)) if held_out is not None and len(held_out) else None
    if held_gt is None and test_gt is None and not Path(events_path).is_file():
        return None, None
    prediction = read_json(events_path, "test events")
    if held_gt is None and not prediction["videos"]:
        # No test set: the empty submission is the expected output, said once rather than left to be found.
        unused = f"; score.test_gt ({test_gt}) is not used: the test set is not scored" if test_gt else ""
        print(f"note: the test submission {events_path} holds no video: no data.test_root video (null?) and "
              f"no split.test_videos held out{unused}", file=sys.stderr)
        return None, None
    if test_gt is None and held_gt is None:
        return None, None
    if held_gt is None:
        truth = read_json(test_gt, "score.test_gt")
    else:
        held = {video["video_id"] for video in held_gt["videos"]}
        others = [video for video in prediction["videos"] if video["video_id"] not in held]
        if others and test_gt is None:
            print(f"warning: {len(others)} data.test_root video(s) have no ground truth (score.test_gt: null): "
                  f"the test score covers the {len(held)} held-out labelled video(s) only", file=sys.stderr)
            prediction = {"videos": [video for video in prediction["videos"] if video["video_id"] in held]}
            others = []
        known = read_json(test_gt, "score.test_gt")["videos"] if others else []
        truth = {"videos": [*known, *held_gt["videos"]]}
    check_submission(prediction, truth, where=f"test events {events_path}")
    return truth, prediction


@runner.stage
def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    # Heavy imports here, not at the top: `--help` stays fast and numpy-free.
    from vce.core.contracts import read_index
    from vce.eval.score import score
    from vce.post.events import labels_to_submission
    from vce.post.timeline import labels_on_time
    test_gt = load_section(args.params, "score", ScoreParams).test_gt
    frames = read_index(args.frames)
    prediction = read_json(args.events, "validation events")
    frame_map = read_json(args.frame_metrics, "frame metrics").get("frame_map")
    gt = labels_to_submission(labels_on_time(frames[frames["split"] == "val"]))
    write_json(args.gt_out, gt, indent=None)
    result = score(gt, prediction)
    empty = score(gt, empty_submission(gt))
    print(score_line("validation", result, empty, len(gt["videos"]), _n_events(prediction)))
    write_json(args.val_headline, headline(result, empty, frame_map))
    test_headline: dict = {}
    held_out = read_index(args.held_out) if args.held_out else None
    truth, test_prediction = known_test_truth(args.test_events, test_gt, held_out)
    write_json(args.test_gt_out or Path(args.gt_out).with_name("test_gt.json"), truth or {"videos": []}, indent=None)
    if truth is not None:
        # A held-out number: nothing upstream (training, thresholds, tuning) saw these videos.
        test, test_empty = score(truth, test_prediction), score(truth, empty_submission(truth))
        result["test"] = {key: test[key] for key in ("map@0.5", "map@0.95", "per_video@0.5", "per_video@0.95")}
        print(score_line("test", test, test_empty, len(truth["videos"]), _n_events(test_prediction)))
        test_headline = headline(test, test_empty)
    write_json(args.test_headline, test_headline)
    write_json(args.metrics, result)
    print(f"score: {time.perf_counter() - started:.1f} s -> {args.val_headline}, {args.test_headline}, {args.metrics}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
