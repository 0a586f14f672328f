"""Stage `temporal`: a sequence model over frame embeddings → refined val/test probabilities, routed per label.

Trains `vce.infer.temporal`'s dilated temporal convolution network on the **validation**
videos' embeddings only (never the frame model's own training videos: in-sample), cross-fitted
over groups of them (`vce.infer.temporal_fit`), and writes `val.parquet` and `test.parquet` in
the probabilities contract, `metrics/temporal.json` (cross-fitted validation frame mAP of the
refined and of the frame model's probabilities, the cross-fit groups), `metrics/route.json`
(each label's route and its evidence, `vce.infer.route`) and `models/temporal.pt` (model and
routes, read by `vce.infer.detect`). With `post.probs: auto` the written probabilities are
each label's routed ones (frame, temporal or their mean); with `temporal` the model's own.

With `post.probs: frame` nothing downstream reads a temporal model, so none is fitted: the stage
writes empty files and says so in metrics/temporal.json (`dvc exp run -S post.probs=frame` costs
no temporal fit). Without embeddings (`predict.embeddings: false`) or with one validation video
(no cross-fit possible), `post.probs: temporal` is an error and `auto` writes the frame model's
probabilities (every label routed to frame, the reason in metrics/route.json).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from vce.core import runner
from vce.core.errors import DataError
from vce.core.io import write_json
from vce.core.params import BaseParams, PostParams, from_dict, load_params


def parse_args(argv):
    parser = argparse.ArgumentParser(prog=runner.module_prog(__spec__), description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--params", default="params.yaml", help="the params file")
    parser.add_argument("--predict-dir", default="data/ensemble", help="probabilities and <split>_embeddings.parquet")
    parser.add_argument("--frames", default="data/ensemble/frames.parquet", help="frame index with labels and split")
    parser.add_argument("--out-dir", default="data/temporal", help="refined probabilities written here")
    parser.add_argument("--metrics", default="metrics/temporal.json", help="training summary and frame mAP")
    parser.add_argument("--route", default="metrics/route.json", help="each label's route and its evidence")
    parser.add_argument("--model-out", default="models/temporal.pt", help="the trained model (read by vce.infer.detect)")
    return parser.parse_args(argv)


def _without_model(args, source: str, reason: str, temporal_params) -> int:
    """No cross-fitted temporal model: refuse `temporal`; `auto` routes every label to the frame
    model (its probabilities copied to --out-dir); `frame` gets empty files."""
    from vce.core.contracts import probs_schema, write_probs
    from vce.infer.route import RouteChoice, fixed_routes
    from vce.infer.temporal import save_temporal
    from vce.infer.temporal_fit import frame_fallback

    if source == "temporal":
        raise DataError(f"post.probs = 'temporal' is refused: {reason}; use post.probs: auto or frame")
    out = Path(args.out_dir)
    routed = frame_fallback(Path(args.predict_dir), reason) if source == "auto" else None
    empty = probs_schema().empty_table().to_pandas()
    for name in ("val", "test"):
        write_probs(out / f"{name}.parquet", getattr(routed, name) if routed else empty)
    write_json(args.metrics, {"enabled": False, "reason": reason})
    routes = routed.choice if routed else RouteChoice(fixed_routes("frame"), {})
    write_json(args.route, routes.to_dict(source, reason))
    save_temporal(args.model_out, None, temporal_params, routes.routes)
    print(f"temporal: disabled, {reason}; " + ("auto: every label on the frame model" if routed else
                                               "wrote empty outputs"))
    return 0


@runner.stage
def main(argv=None) -> int:
    args = parse_args(argv)
    # Heavy imports here, not at the top: `--help` stays fast and torch-free.
    from vce.core.contracts import read_index, write_probs
    from vce.infer.temporal import TemporalParams, save_temporal
    from vce.infer.temporal_fit import TooFewVideos, fit_temporal, missing_embeddings, route_fit, route_rule
    from vce.model.device import resolve_device
    from vce.train.losses import LossParams
    params = load_params(args.params)
    temporal_params = from_dict(TemporalParams, params["temporal"], "temporal")
    loss_params = from_dict(LossParams, params["loss"], "loss")
    post = from_dict(PostParams, params["post"], "post")
    source = post.probs
    seed = from_dict(BaseParams, params["base"], "base").seed
    predict_dir, out = Path(args.predict_dir), Path(args.out_dir)
    missing = missing_embeddings(predict_dir)
    began = time.perf_counter()
    fitted, reason = None, None
    if source == "frame":
        reason = "post.probs: frame reads the frame model's probabilities, so no temporal model is fitted"
    elif missing:
        reason = f"no frame embeddings ({', '.join(missing)}): set predict.embeddings: true"
    else:
        try:
            fitted = fit_temporal(predict_dir, read_index(args.frames), temporal_params, loss_params, seed,
                                  resolve_device(temporal_params.device))
        except TooFewVideos as err:
            reason = str(err)
    if fitted is None:
        return _without_model(args, source, reason, temporal_params)

    routed = route_fit(fitted, predict_dir, source, route_rule(post, seed))
    write_probs(out / "val.parquet", routed.val)
    write_probs(out / "test.parquet", routed.test)
    # Wall-clock times are printed, not written: git-tracked metrics must repeat exactly.
    write_json(args.metrics, fitted.metrics)
    write_json(args.route, routed.choice.to_dict(source, routed.reason))
    save_temporal(args.model_out, fitted.model, temporal_params, routed.choice.routes)
    before, after = (f"{m:.4f}" if m is not None else "n/a" for m in (fitted.metrics.get("input_frame_map"),
                                                                    fitted.metrics.get("frame_map")))
    counts = routed.choice.to_dict(source)["counts"]
    print(f"temporal: {fitted.metrics['train_frames']} validation frames learned from, cross-fitted val frame mAP "
          f"{before} → {after}; routes ({source}) {counts}; {time.perf_counter() - began:.1f} s -> {out}/, "
          f"{args.metrics}, {args.route}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
