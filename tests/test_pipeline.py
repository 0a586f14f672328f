"""The real stage entry points, end to end, on a very small generated demo.

Runs every stage's `main([...])` in dvc.yaml order with the repository's params.yaml scaled
down, then checks the contracts between stages (columns, dtypes, order, one row per frame,
the official JSON, the score file).
"""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pandas as pd
import pytest
import yaml

from conftest import ROOT
from vce.labels import LABELS
from vce.score import check_submission

STAGES = ["demo_data", "index", "split", "cache_frames", "prompts", "train", "predict", "thresholds", "events", "score"]


def load_stage(name: str):
    spec = importlib.util.spec_from_file_location(f"stage_{name}", ROOT / "stages" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_params(tmp_path) -> dict:
    """The repository's params.yaml, scaled to seconds: 4 short videos, 2 tiny epochs."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["demo"].update(n_videos=4, frames_per_video=240, n_test_videos=1, test_frames_per_video=120)
    params["data"].update(root=str(tmp_path / "demo" / "galar"), test_root=str(tmp_path / "demo" / "test"))
    params["train"].update(epochs=2, batch_size=32, samples_per_epoch=256, num_workers=0, checkpoint_every=3)
    params["predict"].update(batch_size=64, num_workers=0)
    return params


def stage_args(tmp_path) -> dict[str, list[str]]:
    p = ["--params", str(tmp_path / "params.yaml")]
    d = tmp_path
    return {
        "demo_data": p + ["--out", str(d / "demo")],
        "index": p + ["--frames-out", str(d / "index/frames.parquet"), "--test-out", str(d / "index/test.parquet"),
                      "--report", str(d / "metrics/index_report.json")],
        "split": p + ["--index", str(d / "index/frames.parquet"), "--out", str(d / "split/frames.parquet"),
                      "--metrics", str(d / "metrics/split.json")],
        "cache_frames": p + ["--frames", str(d / "split/frames.parquet"), "--test", str(d / "index/test.parquet"),
                             "--out", str(d / "cache")],
        "prompts": p + ["--out", str(d / "models/prompt_embeddings.pt")],
        "train": p + ["--frames", str(d / "split/frames.parquet"), "--cache", str(d / "cache"), "--prompts", str(d / "models/prompt_embeddings.pt"),
                      "--model-out", str(d / "models/model.pt"), "--state-dir", str(d / "models/train_state"),
                      "--metrics", str(d / "metrics/train.json"), "--live-dir", str(d / "metrics/train")],
        "predict": p + ["--model", str(d / "models/model.pt"), "--frames", str(d / "split/frames.parquet"),
                        "--test", str(d / "index/test.parquet"), "--cache", str(d / "cache"),
                        "--out-dir", str(d / "predict"),
                        "--report", str(d / "metrics/predict.json")],
        "thresholds": p + ["--probs", str(d / "predict/val.parquet"), "--frames", str(d / "split/frames.parquet"),
                           "--out", str(d / "models/thresholds.json"), "--metrics", str(d / "metrics/thresholds.json")],
        "events": p + ["--thresholds", str(d / "models/thresholds.json"), "--val-probs", str(d / "predict/val.parquet"),
                       "--test-probs", str(d / "predict/test.parquet"), "--frames", str(d / "split/frames.parquet"),
                       "--test-frames", str(d / "index/test.parquet"), "--out-dir", str(d / "events")],
        "score": ["--events", str(d / "events/val.json"), "--frames", str(d / "split/frames.parquet"),
                      "--gt-out", str(d / "score/val_gt.json"), "--metrics", str(d / "metrics/score.json")],
    }


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("pipeline")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(tiny_params(tmp_path)))
    args = stage_args(tmp_path)
    for name in STAGES:
        assert load_stage(name).main(args[name]) == 0, f"stage {name} failed"
    return tmp_path


def test_frame_index_contract(pipeline):
    frames = pd.read_parquet(pipeline / "split/frames.parquet")
    for column, kind in [("video_id", "object"), ("frame", "int64"), ("index", "int64"), ("path", "object")]:
        assert str(frames[column].dtype) in (kind, "string", "str"), column
    assert all(frames[label].dtype == np.uint8 for label in LABELS)
    assert set(frames["split"]) == {"train", "val"}
    by_video = frames.groupby("video_id")["split"].nunique()
    assert (by_video == 1).all(), "a video must sit in one split only"


def test_probabilities_contract(pipeline):
    frames = pd.read_parquet(pipeline / "split/frames.parquet")
    probs = pd.read_parquet(pipeline / "predict/val.parquet")
    assert list(probs.columns) == ["video_id", "frame", *LABELS, "valid"]
    val = frames[frames["split"] == "val"]
    assert len(probs) == len(val)
    assert probs[["video_id", "frame"]].equals(
        val.sort_values(["video_id", "frame"])[["video_id", "frame"]].reset_index(drop=True).astype(probs.dtypes[:2]))
    values = probs[list(LABELS)].to_numpy()
    assert probs["valid"].all() and np.isfinite(values).all()
    assert ((values >= 0) & (values <= 1)).all()


def test_submission_is_official_json(pipeline):
    test = pd.read_parquet(pipeline / "index/test.parquet")
    submission = json.loads((pipeline / "events/submission.json").read_text())
    check_submission(submission)
    assert {v["video_id"] for v in submission["videos"]} == set(test["video_id"])
    xlsx = pd.read_excel(pipeline / "events/submission.xlsx")
    assert list(xlsx.columns) == ["video_id", "start", "end", "label"]


def test_score_file(pipeline):
    result = json.loads((pipeline / "metrics/score.json").read_text())
    for key in ("map@0.5", "map@0.95"):
        assert 0.0 <= result[key] <= 1.0
    val_videos = set(pd.read_parquet(pipeline / "split/frames.parquet").query("split == 'val'")["video_id"])
    assert set(result["per_video@0.5"]) == val_videos
    train = json.loads((pipeline / "metrics/train.json").read_text())
    assert train["epochs"] == 2 and np.isfinite(train["best"]["val_loss"])
