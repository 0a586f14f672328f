"""Stage `temporal`: a sequence model over frame embeddings → refined val/test probabilities.

Trains `vce.infer.temporal`'s dilated temporal convolution network on the training videos'
embeddings (labels from the split frame index) and writes `val.parquet` and `test.parquet` in
the probabilities contract, plus `metrics/temporal.json` (validation frame mAP of the refined
and of the frame model's probabilities). `post.probs: temporal` makes thresholds and
events read these instead of `data/predict`.

With k > 1 folds (data/ensemble: every labelled video is out of fold, so "train" and "val" are
the same videos) the validation probabilities are **cross-fitted**: the videos fold j held out
are refined by a temporal model trained on the other folds' videos only, so thresholds and the
score engine tune on probabilities no model saw the labels of. The test set (and
`models/temporal.pt`, which `vce.infer.detect` uses) gets one model trained on every labelled
video. With one split the model learns from the training videos and refines validation as is.

Needs `predict.embeddings: true` with `train` in `predict.splits`. Without those embeddings the
stage is an error when `post.probs` is `temporal`; otherwise it writes empty files of the
contract's schema and `{"enabled": false, ...}` so the pipeline runs unchanged.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from vce.core import runner
from vce.core.contracts import label_matrix, probs_schema, read_index
from vce.core.errors import DataError
from vce.core.io import atomic_path, write_json
from vce.core.labels import LABELS
from vce.core.params import BaseParams, PostParams, from_dict, load_params
from vce.eval.frame_metrics import frame_metrics

SPLITS = ("train", "val", "test")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--params", default="params.yaml", help="the params file")
    parser.add_argument("--predict-dir", default="data/predict", help="probabilities and <split>_embeddings.parquet")
    parser.add_argument("--frames", default="data/split/frames.parquet", help="frame index with labels and split")
    parser.add_argument("--out-dir", default="data/temporal", help="refined probabilities written here")
    parser.add_argument("--metrics", default="metrics/temporal.json", help="training summary and frame mAP")
    parser.add_argument("--model-out", default="models/temporal.pt", help="the trained model (read by vce.infer.detect)")
    return parser.parse_args(argv)


def write_probs(path: Path, table) -> None:
    with atomic_path(path) as tmp:
        pq.write_table(pa.Table.from_pandas(table, schema=probs_schema(), preserve_index=False), tmp)


def load_split(predict_dir: Path, split: str, labelled_frames):
    """Sequences of one split: embeddings, valid flags from its probabilities, labels if given."""
    from vce.infer.temporal import align, build_sequences, read_embeddings

    frames, embeddings = read_embeddings(predict_dir / f"{split}_embeddings.parquet")
    probs_path = predict_dir / f"{split}.parquet"
    valid = None
    if probs_path.is_file():
        valid = align(frames, read_index(probs_path, ["video_id", "frame", "valid"]), ["valid"], str(probs_path))
        valid = valid["valid"].to_numpy(bool)
    labels = None
    if labelled_frames is not None:
        labels = align(frames, labelled_frames, list(LABELS), "the split frame index").to_numpy("uint8")
    return build_sequences(frames, embeddings, valid, labels)


def train_videos(seq) -> list[str]:
    return list(dict.fromkeys(seq.frames["video_id"].astype(str)))


def held_out_folds(frames, val, train) -> dict[int, set[str]]:
    """fold → its validation videos, when validation must be cross-fitted (k folds), else {}.

    Cross-fitting is needed when the temporal model's training videos include validation
    videos (data/ensemble with k folds trains on every out-of-fold video); the folds come from
    the index's `fold` column (the fold that held each video out).
    """
    val_videos = set(train_videos(val))
    if not val_videos & set(train_videos(train)):
        return {}
    first = frames.drop_duplicates("video_id")
    fold_of = dict(zip(first["video_id"].astype(str), first["fold"].astype(int))) if "fold" in frames else {}
    folds: dict[int, set[str]] = {}
    for video in sorted(val_videos):
        folds.setdefault(int(fold_of.get(video, -1)), set()).add(video)
    if -1 in folds or len(folds) < 2:
        raise DataError(f"{sorted(val_videos & set(train_videos(train)))[:5]}…: validation videos are also the "
                        "temporal model's training videos but the frame index gives them no two folds to cross-fit "
                        "(its `fold` column): rerun the split and ensemble stages")
    return folds


@runner.stage
def main(argv=None) -> int:
    args = parse_args(argv)
    # Heavy imports here, not at the top: `--help` stays fast and torch-free.
    from vce.infer.temporal import (
        TemporalParams,
        align,
        probs_frame,
        refine,
        save_temporal,
        select_videos,
        train_temporal,
    )
    from vce.model.device import resolve_device
    from vce.train.losses import LossParams
    params = load_params(args.params)
    temporal_params = from_dict(TemporalParams, params["temporal"], "temporal")
    loss_params = from_dict(LossParams, params["loss"], "loss")
    source = from_dict(PostParams, params["post"], "post").probs
    seed = from_dict(BaseParams, params["base"], "base").seed
    predict_dir, out = Path(args.predict_dir), Path(args.out_dir)
    missing = [str(predict_dir / f"{s}_embeddings.parquet") for s in SPLITS
               if not (predict_dir / f"{s}_embeddings.parquet").is_file()]
    if missing:
        reason = (f"no frame embeddings ({', '.join(missing)}): set predict.embeddings: true "
                  "and add train to predict.splits")
        if source == "temporal":
            raise DataError(f"post.probs is temporal but there are {reason}")
        for name in ("val", "test"):
            write_probs(out / f"{name}.parquet", probs_schema().empty_table().to_pandas())
        write_json(args.metrics, {"enabled": False, "reason": reason})
        save_temporal(args.model_out, None, temporal_params)
        print(f"temporal: disabled, {reason}; wrote empty outputs")
        return 0

    began = time.perf_counter()
    device = resolve_device(temporal_params.device)
    frames = read_index(args.frames)
    label_matrix(frames)  # raises naming a missing label column
    # Labels from the whole index: with k folds (data/ensemble) every labelled video is "val" and
    # its out-of-fold embeddings are also the training set.
    train = load_split(predict_dir, "train", frames)
    val = load_split(predict_dir, "val", frames[frames["split"] == "val"])
    test = load_split(predict_dir, "test", None)
    model, losses = train_temporal(train, temporal_params, loss_params, seed, device)
    held_out = held_out_folds(frames, val, train)
    metrics = {"enabled": True, "device": device.type, "train_frames": len(train.frames),
               "train_videos": len(train.offsets) - 1, "final_loss": losses[-1] if losses else None,
               "cross_fitted_folds": len(held_out),
               }  # wall-clock times are printed, not written: git-tracked metrics must repeat exactly
    val_probs = refine(model, val, device)
    for fold, videos in held_out.items():  # k folds: each fold's videos refined by a model that never saw them
        fold_model, _ = train_temporal(select_videos(train, set(train_videos(train)) - videos),
                                       temporal_params, loss_params, seed + 1 + fold, device)
        rows = val.frames["video_id"].astype(str).isin(videos).to_numpy()
        val_probs[rows] = refine(fold_model, select_videos(val, videos), device)
    trained = time.perf_counter() - began
    for name, seq in (("val", val), ("test", test)):
        probs = val_probs if name == "val" else refine(model, seq, device)
        write_probs(out / f"{name}.parquet", probs_frame(seq, probs))
        if name == "val" and seq.labels is not None and len(seq.frames):
            metrics["frame_map"] = frame_metrics(seq.labels, probs)["map"]
        if name == "val" and seq.labels is not None and (predict_dir / "val.parquet").is_file():
            frame_probs = align(seq.frames, read_index(predict_dir / "val.parquet"), list(LABELS), "val probabilities")
            metrics["input_frame_map"] = frame_metrics(seq.labels, frame_probs.to_numpy("float32"))["map"]
    write_json(args.metrics, metrics)
    save_temporal(args.model_out, model, temporal_params)
    before, after = (f"{m:.4f}" if m is not None else "n/a" for m in (metrics.get("input_frame_map"),
                                                                    metrics.get("frame_map")))
    print(f"temporal: {metrics['train_frames']} training frames, val frame mAP {before} → {after}; "
          f"trained in {trained:.1f} s, {time.perf_counter() - began:.1f} s in all -> {out}/, {args.metrics}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
