"""Stage `report`: per-class curves and table, event timelines and `metrics/report.md`.

Reads the validation probabilities, labels, thresholds, predicted events and ground truth;
writes plot data under `plots/` (declared in dvc.yaml's top-level `plots:`) and the markdown
report with the overall and per-video mAP at tIoU 0.5 and 0.95 (the challenge's layout).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vce.core import runner
from vce.core.contracts import probs_source, read_index
from vce.core.errors import DataError
from vce.core.io import read_json
from vce.core.labels import LABELS
from vce.core.params import load_params, load_section
from vce.eval.report import ReportParams, write_report
from vce.post.timeline import join_probs


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--probs", default=None,
                        help="validation probabilities (default: the ones thresholds.probs selects)")
    parser.add_argument("--predict-dir", default="data/predict")
    parser.add_argument("--temporal-dir", default="data/temporal")
    parser.add_argument("--frames", default="data/split/frames.parquet", help="frame index with labels")
    parser.add_argument("--thresholds", default="models/thresholds.json")
    parser.add_argument("--events", default="data/events/val.json", help="predicted validation events")
    parser.add_argument("--gt", default="data/score/val_gt.json", help="validation ground-truth events")
    parser.add_argument("--plots-dir", default="plots")
    parser.add_argument("--report", default="metrics/report.md")
    return parser.parse_args(argv)


@runner.stage
def main(argv=None) -> int:
    args = parse_args(argv)
    params = load_section(args.params, "report", ReportParams)
    if args.probs is None:  # the probabilities the thresholds and events were made from
        source = probs_source(load_params(args.params).get("thresholds", {}))
        args.probs = str(Path(args.temporal_dir if source == "temporal" else args.predict_dir) / "val.parquet")
    probs, labels = join_probs(read_index(args.probs), read_index(args.frames))
    if labels is None:
        raise DataError(f"{args.frames} has no label columns: the report needs labelled validation frames")
    valid = probs["valid"].to_numpy()
    result = write_report(
        y_true=labels[valid],
        y_prob=probs[list(LABELS)].to_numpy()[valid],
        frame_times=probs[["video_id", "t"]],
        thresholds=read_json(args.thresholds, "thresholds")["thresholds"],
        gt=read_json(args.gt, "ground truth"),
        prediction=read_json(args.events, "validation events"),
        params=params,
        plots_dir=args.plots_dir,
        report_path=args.report,
    )
    print(f"report: {args.report}   mAP@0.5 = {result['map@0.5']:.4f}   mAP@0.95 = {result['map@0.95']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
