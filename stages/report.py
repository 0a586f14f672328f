"""Stage `report`: curves and tables for `dvc plots`, event timelines and `metrics/report.md`.

Reads the validation probabilities (the ones `post.probs` selects), labels, thresholds, predicted
events and ground truth; with `score.test_gt` also the test probabilities, events and ground
truth, so the report puts the held-out score and its timelines beside validation. Writes plot
data under `plots/` (declared in dvc.yaml's top-level `plots:`) and the markdown report.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from vce.core import runner
from vce.core.contracts import read_index
from vce.core.errors import DataError
from vce.core.io import read_json
from vce.core.labels import LABELS
from vce.core.params import PostParams, ScoreParams, from_dict, load_params
from vce.eval.report import ReportParams, ScoredSet, write_report
from vce.post.events import EventParams
from vce.post.timeline import join_probs


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--params", default="params.yaml", help="the params file")
    parser.add_argument("--probs", default=None,
                        help="validation probabilities (None: the ones post.probs selects)")
    parser.add_argument("--predict-dir", default="data/predict", help="the frame model's probabilities")
    parser.add_argument("--temporal-dir", default="data/temporal", help="the temporal model's probabilities")
    parser.add_argument("--frames", default="data/split/frames.parquet", help="frame index with labels")
    parser.add_argument("--thresholds", default="models/thresholds.json", help="thresholds and tuned post-processing")
    parser.add_argument("--events", default="data/events/val.json", help="predicted validation events")
    parser.add_argument("--gt", default="data/score/val_gt.json", help="validation ground-truth events")
    parser.add_argument("--plots-dir", default="plots", help="plot data written here")
    parser.add_argument("--report", default="metrics/report.md", help="markdown report written")
    parser.add_argument("--test-probs", default=None,
                        help="test probabilities (None: the ones post.probs selects; used when score.test_gt is set)")
    parser.add_argument("--test-index", default="data/index/test.parquet", help="test frame index")
    parser.add_argument("--test-events", default="data/events/submission.json", help="predicted test events")
    return parser.parse_args(argv)


@runner.stage
def main(argv=None) -> int:
    args = parse_args(argv)
    all_params = load_params(args.params)
    params = from_dict(ReportParams, all_params["report"], "report")
    source = from_dict(PostParams, all_params["post"], "post").probs
    test_gt = from_dict(ScoreParams, all_params["score"], "score").test_gt
    configured_events = from_dict(EventParams, all_params["events"], "events").model_dump()
    folder = Path(args.temporal_dir if source == "temporal" else args.predict_dir)
    probs, labels = join_probs(read_index(args.probs or folder / "val.parquet"), read_index(args.frames))
    if labels is None:
        raise DataError(f"{args.frames} has no label columns: the report needs labelled validation frames")
    valid = probs["valid"].to_numpy()
    sets = [_scored_set("validation", probs, read_index(args.frames), read_json(args.gt, "ground truth"),
                        read_json(args.events, "validation events"))]
    test_events = read_json(args.test_events, "test events") if test_gt else None
    if test_events is not None and test_events["videos"]:  # the test ground truth is known: a held-out score
        index = read_index(args.test_index)
        test_probs, _ = join_probs(read_index(args.test_probs or folder / "test.parquet"), index)
        sets.append(_scored_set("test", test_probs, index, read_json(test_gt, "score.test_gt"), test_events))
    elif test_events is not None:  # data.test_root: null — no test set to hold against score.test_gt
        print(f"warning: score.test_gt is {test_gt} but the test submission holds no video: "
              "no test score in the report", file=sys.stderr)
    results = write_report(
        y_true=labels[valid],
        y_prob=probs[list(LABELS)].to_numpy()[valid],
        sets=sets,
        saved_thresholds=read_json(args.thresholds, "thresholds"),
        probs_source=source,
        configured_events=configured_events,
        params=params,
        plots_dir=args.plots_dir,
        report_path=args.report,
    )
    for r in results:
        print(f"report: {r.scored.name:<10}  mAP@0.5 = {r.score['map@0.5']:.4f}   mAP@0.95 = {r.score['map@0.95']:.4f}"
              f"   empty submission = {r.empty['map@0.5']:.4f}")
    print(f"report: wrote {args.report} and {args.plots_dir}/")
    return 0


def _scored_set(name: str, probs, frames, gt: dict, prediction: dict) -> ScoredSet:
    """A set's probabilities (NaN where invalid) with the event unit of each video."""
    trace = probs[["video_id", "t", *LABELS]].copy()
    trace.loc[~probs["valid"].to_numpy(), list(LABELS)] = np.nan
    units = frames.groupby("video_id", sort=False)["event_unit"].first()
    return ScoredSet(name, gt, prediction, trace, {str(v): str(u) for v, u in units.items()})


if __name__ == "__main__":
    sys.exit(main())
