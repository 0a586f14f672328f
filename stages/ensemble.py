"""Stage `ensemble`: the folds' predictions → one set of probabilities for every later stage.

Reads `data/predict/fold_<k>/` (each fold's out-of-fold predictions of the videos it holds out)
and `data/predict_test/fold_<k>/` (each fold's test-set predictions) for every k in
`split.folds`, and writes `data/ensemble/` in the layout `data/predict` had (the probabilities
contract; `temporal`, `thresholds`, `events`, `score` and `report` read it):

- `val.parquet` / `train.parquet` (+ embeddings) and `frames.parquet`: out of fold, checked for
  coverage (vce/infer/ensemble.py); with k > 1 folds every labelled video is "val";
- `test.parquet` (+ embeddings): the folds' test probabilities fused per class with
  `ensemble.method` weights (mean, or proportional to each fold's out-of-fold AP); embeddings
  are the folds' mean.

`metrics/ensemble.json` says what each member scores out of fold (frame AP on the videos it
held out), what the pooled out-of-fold predictions score, and the fusion weights.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from vce.core import runner
from vce.core.errors import DataError
from vce.core.io import write_json
from vce.core.params import from_dict, load_params


def parse_args(argv):
    parser = argparse.ArgumentParser(prog=runner.module_prog(__spec__), description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--params", default="params.yaml", help="the params file")
    parser.add_argument("--predict-dir", default="data/predict", help="fold_<k>/ out-of-fold predictions")
    parser.add_argument("--test-dir", default="data/predict_test", help="fold_<k>/ test-set predictions")
    parser.add_argument("--frames", default="data/split/frames.parquet", help="labelled frame index with fold column")
    parser.add_argument("--out-dir", default="data/ensemble", help="fused probabilities written here")
    parser.add_argument("--metrics", default="metrics/ensemble.json", help="per-fold and pooled frame mAP")
    return parser.parse_args(argv)


@runner.stage
def main(argv=None) -> int:
    args = parse_args(argv)
    # Heavy imports here, not at the top: `--help` stays fast and torch-free.
    from vce.core.contracts import read_index
    from vce.core.labels import LABELS
    from vce.data.split import SplitParams
    from vce.infer.ensemble import EnsembleParams, class_weights, fuse, fuse_embeddings, gather_oof
    from vce.infer.predict import PredictParams
    params = load_params(args.params)
    split = from_dict(SplitParams, params["split"], "split")
    predict = from_dict(PredictParams, params["predict"], "predict")
    method = from_dict(EnsembleParams, params["ensemble"], "ensemble").method
    began = time.perf_counter()
    frames = read_index(args.frames)
    out = Path(args.out_dir)
    fold_dirs = {k: Path(args.predict_dir) / f"fold_{k}" for k in split.folds}
    scores = gather_oof(frames, fold_dirs, out, split.n_folds, predict.embeddings)
    weights = class_weights(scores["members"], method)
    test_dirs = [Path(args.test_dir) / f"fold_{k}" for k in split.folds]
    absent = [str(d / "test.parquet") for d in test_dirs if not (d / "test.parquet").is_file()]
    if absent:
        raise DataError(f"test predictions missing: {absent} (run predict_test for every fold)")
    test_frames = fuse([d / "test.parquet" for d in test_dirs], weights, out / "test.parquet")
    if predict.embeddings:
        fuse_embeddings([d / "test_embeddings.parquet" for d in test_dirs], out / "test_embeddings.parquet")
    write_json(args.metrics, {
        "method": method, "n_folds": split.n_folds, **scores, "test_frames": test_frames,
        "weights": {label: [round(float(w), 6) for w in weights[:, k]] for k, label in enumerate(LABELS)},
    })
    members = ", ".join(f"{name} {m['map'] if m['map'] is None else round(m['map'], 4)}"
                        for name, m in scores["members"].items())
    print(f"ensemble ({method}, {split.n_folds} fold(s)): frame mAP out of fold: {members}; pooled "
          f"{scores['oof']['map']}; {test_frames} test frames fused in {time.perf_counter() - began:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
