"""Stage `predict`: stream frames through one fold's model into probabilities Parquet.

Split by purpose, so that a new test exam costs only its own frames:

- ``--part labelled`` (dvc.yaml `predict@k`): the labelled videos fold k holds out
  (`val.parquet`, out of fold: the model never trained on them, checked against the videos the
  model file records) and, with one split (`split.folds: [0]`) and `train` in `predict.splits`, its own
  training videos (`train.parquet`, for the temporal model). Also writes `coverage.json`
  (fold, held-out videos, the model's training videos) for the ensemble stage's coverage check.
- ``--part test`` (dvc.yaml `predict_test@k`): the test set (`test.parquet`, possibly empty):
  the unlabelled test index under `data.test_root` and, with `--held-out`, the labelled videos
  `split.test_videos` holds out (under `data.root`; the model must not have trained on them).
- ``--part all`` (the default, outside DVC): both, into one folder (the layout before folds).

With `predict.embeddings` each predicted split also gets `<split>_embeddings.parquet`; a small
JSON report holds counts and undecodable frames.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from vce.core import runner
from vce.core.errors import DataError
from vce.core.io import write_json
from vce.core.params import from_dict, load_params

if TYPE_CHECKING:  # the heavy imports (torch, pandas) happen in the functions: `--help` stays fast
    from vce.data.index import DataParams
    from vce.infer.predict import PredictParams


def parse_args(argv):
    parser = argparse.ArgumentParser(prog=runner.module_prog(__spec__), description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--params", default="params.yaml", help="the params file")
    parser.add_argument("--part", choices=("labelled", "test", "all"), default="all",
                        help="labelled: the fold's held-out (and, with one split, training) videos; "
                             "test: the test set; all: both")
    parser.add_argument("--fold", type=int, default=0, help="the fold whose model predicts (labelled: its held-out videos)")
    parser.add_argument("--model", default=None, help="trained model file (None: models/folds/<fold>/model.pt)")
    parser.add_argument("--frames", default="data/split/frames.parquet", help="labelled frame index with split and fold")
    parser.add_argument("--test", default="data/index/test.parquet", help="unlabelled test frame index")
    parser.add_argument("--held-out", default="data/split/test.parquet",
                        help="labelled test videos held out by split.test_videos (test and all parts)")
    parser.add_argument("--cache", default="data/cache", help="decoded-frame cache (used when enabled)")
    parser.add_argument("--features", default="data/embed",
                        help="frozen-backbone frame features (stage embed): a probe's model predicts from them")
    parser.add_argument("--out-dir", default=None, help="probabilities (and embeddings) written here "
                        "(None: data/predict_test/fold_<fold> for the test part, else data/predict/fold_<fold>)")
    parser.add_argument("--report", default=None, help="frame counts and undecodable frames (None: "
                        "metrics/folds/predict_test_<fold>.json for the test part, else metrics/folds/predict_<fold>.json)")
    return fold_paths(parser.parse_args(argv))


def fold_paths(args):
    """Fill the paths left None with fold k's, the ones dvc.yaml's `predict@k` / `predict_test@k` declare."""
    k, test = args.fold, "_test" if args.part == "test" else ""
    args.model = args.model or f"models/folds/{k}/model.pt"
    args.out_dir = args.out_dir or f"data/predict{test}/fold_{k}"
    args.report = args.report or f"metrics/folds/predict{test}_{k}.json"
    return args


def labelled_jobs(args, params: dict, data: DataParams, predict_params: PredictParams, payload: dict):
    """(split, rows, root) to predict for the labelled part, and the coverage record."""
    from vce.core.contracts import read_index
    from vce.data.folds import check_unseen, fold_frames, held_out_videos
    from vce.data.split import SplitParams
    split = from_dict(SplitParams, params["split"], "split")
    frames = fold_frames(read_index(args.frames), args.fold, args.frames)
    held_out = held_out_videos(frames, args.fold)
    check_unseen(held_out, payload.get("train_videos"), args.fold, args.model)
    # With k folds the other folds' models predict these training videos out of fold: the
    # temporal model learns from those, so in-sample predictions of them would be wasted time.
    splits = ["val"] + (["train"] if split.n_folds == 1 and "train" in predict_params.splits else [])
    jobs = [(name, frames[frames["split"] == name], data.root) for name in splits]
    coverage = {"fold": args.fold, "model": str(args.model), "held_out_videos": held_out,
                "model_train_videos": sorted(payload["train_videos"])}
    return jobs, coverage


def job_for_test_set(args, data: DataParams, payload: dict):
    """("test", rows, root): the test index, plus the held-out labelled videos (paths joined to their roots)."""
    from vce.core.contracts import all_test_frames, read_index
    from vce.data.folds import check_unseen
    test = read_index(args.test)
    if len(test) and data.test_root is None:
        raise DataError(f"{args.test} has frames but data.test_root is null")
    held = read_index(args.held_out) if args.held_out else None
    if held is None or not len(held):
        return "test", test, data.test_root
    check_unseen(sorted(held["video_id"].astype(str).unique()), payload.get("train_videos"), args.fold, args.model,
                 holder="split.test_videos")
    rows = all_test_frames(test.assign(path=[str(Path(data.test_root or ".") / p) for p in test["path"]]),
                           held.assign(path=[str(Path(data.root) / p) for p in held["path"]]))
    return "test", rows, "."


def predict_from_features(args, model, backbone: str, split: str, rows, probs_out, embeddings_out,
                          predict_params: PredictParams, device) -> dict:
    """A frozen model's predictions: its heads on the embed stage's features of `rows` (no pixels
    decoded, the backbone never run); its embeddings output is those features."""
    from vce.data.features import read_features
    from vce.infer.embed import probe_predict

    features, valid = read_features(args.features, "test" if split == "test" else "labelled", rows, backbone)
    return probe_predict(model, rows, features, valid, probs_out, embeddings_out, predict_params.batch_size, device)


@runner.stage
def main(argv=None) -> int:
    args = parse_args(argv)
    began = time.perf_counter()
    # Heavy imports here, not at the top: `--help` stays fast and torch-free.
    from vce.data.frame_cache import FrameCache
    from vce.data.index import DataParams
    from vce.data.split import SplitParams
    from vce.infer.predict import PredictParams, predict_sharded
    from vce.infer.sink import NonFiniteOutput
    from vce.model import checkpoint
    from vce.model.device import resolve_device, setup_distributed
    params = load_params(args.params)
    data = from_dict(DataParams, params["data"], "data")
    predict_params = from_dict(PredictParams, params["predict"], "predict")
    from_dict(SplitParams, params["split"], "split")  # checked before the model loads (labelled_jobs reads it)
    device = resolve_device(predict_params.device)
    ddp = setup_distributed(device)
    model, payload = checkpoint.load_model(args.model, device)
    out = Path(args.out_dir)
    jobs, coverage = [], None
    if args.part in ("labelled", "all"):
        jobs, coverage = labelled_jobs(args, params, data, predict_params, payload)
    if args.part in ("test", "all"):
        jobs.append(job_for_test_set(args, data, payload))
    cache = FrameCache.open(args.cache)
    report = {}
    for split, rows, root in jobs:
        embeddings = out / f"{split}_embeddings.parquet" if predict_params.embeddings else None
        if payload.get("features"):  # a probe (train.freeze_backbone): its heads on the cached features
            if not ddp.is_main:  # seconds of work: one process writes the files
                continue
            report[split] = predict_from_features(args, model, payload["features"], split, rows, out / f"{split}.parquet",
                                                  embeddings, predict_params, device)
            continue
        try:
            report[split] = predict_sharded(model, rows, root or ".", out / f"{split}.parquet", predict_params,
                                            device, embeddings, desc=f"predict {split} (fold {args.fold})",
                                            cache=cache, max_pixels=data.max_frame_pixels)
        except NonFiniteOutput as err:  # no output written: the error names the weights that did it
            raise DataError(f"{args.model}: {err}") from None
        if report[split]["invalid_frames"]:
            print(f"warning: {report[split]['invalid_frames']} undecodable frame(s) in {split}, "
                  f"e.g. {report[split]['invalid_examples'][0]} (rows kept with valid=false)", file=sys.stderr)
    if ddp.is_main:
        if coverage is not None:
            write_json(out / "coverage.json", coverage)
        write_json(args.report, {"fold": args.fold, "part": args.part, **report})
        counts = ", ".join(f"{split} {report[split]['frames']}" for split in report)
        print(f"predict (fold {args.fold}): {counts} frames, {time.perf_counter() - began:.0f} s -> {out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
