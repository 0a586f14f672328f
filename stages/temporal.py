"""Stage `temporal`: a sequence model over frame embeddings → refined val/test probabilities.

Trains `vce.infer.temporal`'s dilated temporal convolution network on the training videos'
embeddings (labels from the split frame index) and writes `val.parquet` and `test.parquet` in
the probabilities contract, plus `metrics/temporal.json` (validation frame mAP of the refined
and of the frame model's probabilities) and `models/temporal.pt` (read by `vce.infer.detect`).
`post.probs: temporal` makes thresholds and events read these instead of `data/predict`. With
k > 1 folds validation is cross-fitted (`vce.infer.temporal_fit`).

Needs `predict.embeddings: true` with `train` in `predict.splits`. Without those embeddings the
stage is an error when `post.probs` is `temporal`; otherwise it writes empty files of the
contract's schema and `{"enabled": false, ...}` so the pipeline runs unchanged.
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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--params", default="params.yaml", help="the params file")
    parser.add_argument("--predict-dir", default="data/ensemble", help="probabilities and <split>_embeddings.parquet")
    parser.add_argument("--frames", default="data/ensemble/frames.parquet", help="frame index with labels and split")
    parser.add_argument("--out-dir", default="data/temporal", help="refined probabilities written here")
    parser.add_argument("--metrics", default="metrics/temporal.json", help="training summary and frame mAP")
    parser.add_argument("--model-out", default="models/temporal.pt", help="the trained model (read by vce.infer.detect)")
    return parser.parse_args(argv)


@runner.stage
def main(argv=None) -> int:
    args = parse_args(argv)
    # Heavy imports here, not at the top: `--help` stays fast and torch-free.
    from vce.core.contracts import probs_schema, read_index, temporal_probs, write_probs
    from vce.infer.temporal import TemporalParams, probs_frame, save_temporal
    from vce.infer.temporal_fit import fit_temporal, missing_embeddings
    from vce.model.device import resolve_device
    from vce.train.losses import LossParams
    params = load_params(args.params)
    temporal_params = from_dict(TemporalParams, params["temporal"], "temporal")
    loss_params = from_dict(LossParams, params["loss"], "loss")
    source = from_dict(PostParams, params["post"], "post").probs
    seed = from_dict(BaseParams, params["base"], "base").seed
    predict_dir, out = Path(args.predict_dir), Path(args.out_dir)
    missing = missing_embeddings(predict_dir)
    if missing:
        reason = (f"no frame embeddings ({', '.join(missing)}): set predict.embeddings: true "
                  "and add train to predict.splits")
        if temporal_probs(source):
            raise DataError(f"post.probs is temporal but there are {reason}")
        for name in ("val", "test"):
            write_probs(out / f"{name}.parquet", probs_schema().empty_table().to_pandas())
        write_json(args.metrics, {"enabled": False, "reason": reason})
        save_temporal(args.model_out, None, temporal_params)
        print(f"temporal: disabled, {reason}; wrote empty outputs")
        return 0

    began = time.perf_counter()
    device = resolve_device(temporal_params.device)
    fitted = fit_temporal(predict_dir, read_index(args.frames), temporal_params, loss_params, seed, device)
    write_probs(out / "val.parquet", probs_frame(fitted.val, fitted.val_probs))
    write_probs(out / "test.parquet", probs_frame(fitted.test, fitted.test_probs))
    # Wall-clock times are printed, not written: git-tracked metrics must repeat exactly.
    write_json(args.metrics, fitted.metrics)
    save_temporal(args.model_out, fitted.model, temporal_params)
    before, after = (f"{m:.4f}" if m is not None else "n/a" for m in (fitted.metrics.get("input_frame_map"),
                                                                    fitted.metrics.get("frame_map")))
    print(f"temporal: {fitted.metrics['train_frames']} training frames, val frame mAP {before} → {after}; "
          f"{time.perf_counter() - began:.1f} s -> {out}/, {args.metrics}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
