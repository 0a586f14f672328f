"""Stage `thresholds`: per-class thresholds from validation probabilities.

`thresholds.method: f1` maximises per-class frame F1 (the seed's way); `map` then tunes the
thresholds and the event post-processing directly on validation temporal mAP, the score
that counts; `engine` fits the score engine (`vce.post.engine`: decoded regions, learned
candidates and presence gates) on the validation videos instead (`vce.post.decoder` fits the one
it names). `post.probs` picks the validation probabilities: the frame model's
(`data/predict`) or the temporal model's (`data/temporal`). Writes `models/thresholds.json` (read by `events`) and a per-class metrics file.
"""

from __future__ import annotations

import argparse
import sys
import time

from vce.core import runner
from vce.core.errors import DataError
from vce.core.io import write_json
from vce.core.labels import LABELS
from vce.core.params import BaseParams, PostParams, from_dict, load_params


def parse_args(argv):
    parser = argparse.ArgumentParser(prog=runner.module_prog(__spec__), description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--params", default="params.yaml", help="the params file")
    parser.add_argument("--probs", default=None,
                        help="validation probabilities (None: val.parquet of --predict-dir or --temporal-dir, as post.probs says)")
    parser.add_argument("--predict-dir", default="data/ensemble", help="the frame model's probabilities")
    parser.add_argument("--temporal-dir", default="data/temporal", help="the temporal model's probabilities")
    parser.add_argument("--frames", default="data/ensemble/frames.parquet", help="frame index with labels")
    parser.add_argument("--out", default="models/thresholds.json", help="thresholds and tuned post-processing written")
    parser.add_argument("--metrics", default="metrics/thresholds.json", help="frame AP per class, tuning report")
    return parser.parse_args(argv)


@runner.stage
def main(argv=None) -> int:
    args = parse_args(argv)
    began = time.perf_counter()
    # Heavy imports here, not at the top: `--help` stays fast and numpy-free.
    from vce.core.contracts import probs_file, read_index, read_probs
    from vce.eval.frame_metrics import frame_metrics
    from vce.post.decoder import fit_decoder
    from vce.post.thresholds import ThresholdParams
    from vce.post.thresholds_file import write_thresholds
    from vce.post.timeline import join_probs
    params = load_params(args.params)
    source = from_dict(PostParams, params["post"], "post").probs
    threshold_params = from_dict(ThresholdParams, params["thresholds"], "thresholds")
    seed = from_dict(BaseParams, params["base"], "base").seed
    frames = read_index(args.frames)
    probs_path = args.probs or str(probs_file(source, "val", args.predict_dir, args.temporal_dir))
    probs, labels = join_probs(read_probs(probs_path), frames)
    if len(probs) == 0:
        raise DataError(f"{probs_path} has no frames (post.probs: {source})")
    if labels is None:
        raise DataError(f"{args.frames} has no label columns: thresholds need labelled validation frames")
    valid = probs["valid"].to_numpy()
    y_true = labels[valid]
    y_prob = probs[list(LABELS)].to_numpy()[valid]
    fitted = fit_decoder(probs, labels, frames, threshold_params, params["events"], seed)
    thresholds, report = fitted.thresholds, fitted.report
    per_class = frame_metrics(y_true, y_prob)
    write_thresholds(args.out, fitted.method, source, thresholds, fitted.events, fitted.engine)
    write_json(args.metrics, {
        "method": threshold_params.method,
        "probs": source,
        "frame_map": per_class["map"],
        "per_class": {label: {**per_class["per_label"][label], "threshold": thresholds[label]} for label in LABELS},
        # Wall-clock seconds are printed, not written: git-tracked metrics must repeat exactly.
        "tuning": {key: value for key, value in report.items() if key != "seconds"},
    })
    off = sorted(label for label in LABELS if thresholds[label] >= threshold_params.off_threshold)
    best = report.get("best") if isinstance(report, dict) else None
    tuned_score = f", tuned validation score {best:.4f}" if isinstance(best, float) else ""
    print(f"thresholds ({threshold_params.method}, {source} probabilities): {int(valid.sum())} validation frames, "
          f"frame mAP {per_class['map']:.4f}{tuned_score}, {len(off)} label(s) off {off}, "
          f"{time.perf_counter() - began:.0f} s -> {args.out}, {args.metrics}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
