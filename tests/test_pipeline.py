"""The real stage entry points, end to end, on a very small generated demo.

Runs every stage's `main([...])` in dvc.yaml order with the repository's params.yaml scaled
down, then checks the contracts between stages (columns, dtypes, order, one row per frame,
the official JSON, the score file).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from conftest import load_stage, prepare_demo
from vce.labels import LABELS
from vce.score import check_submission

STAGES = ["train", "predict", "thresholds", "events", "score"]


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("pipeline")
    args = prepare_demo(tmp_path)
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
    test_videos = set(pd.read_parquet(pipeline / "index/test.parquet")["video_id"])
    assert set(result["test"]["per_video@0.5"]) == test_videos
    train = json.loads((pipeline / "metrics/train.json").read_text())
    assert train["epochs"] == 2 and np.isfinite(train["best"]["val_loss"])
