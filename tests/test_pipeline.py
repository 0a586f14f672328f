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
import yaml
from conftest import load_stage, prepare_demo
from viewer_check import check_viewer

from vce.core.labels import LABELS
from vce.eval.score import check_submission

STAGES = ["train", "predict", "temporal", "thresholds", "events", "score", "report"]
# Two validation videos of four: the temporal model learns from validation only, cross-fitted over it.
OVERRIDES = {"split": {"val_fraction": 0.5}}


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("pipeline")
    args = prepare_demo(tmp_path, **OVERRIDES)
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


def test_routed_probabilities_feed_thresholds_and_report(pipeline):
    thresholds = json.loads((pipeline / "models/thresholds.json").read_text())
    params = yaml.safe_load((pipeline / "params.yaml").read_text())
    assert thresholds["probs"] == params["post"]["probs"] == "auto"
    route = json.loads((pipeline / "metrics/route.json").read_text())
    assert route["reason"] is None and list(route["routes"]) == list(LABELS)
    temporal_meta = json.loads((pipeline / "metrics/temporal.json").read_text())
    assert temporal_meta["train_videos"] == 2 and len(temporal_meta["cross_fit"]["groups"]) == 2
    assert thresholds["method"] == params["thresholds"]["method"] == "engine" and thresholds["engine"]
    tuning = json.loads((pipeline / "metrics/thresholds.json").read_text())["tuning"]
    assert tuning["evaluations"] > 0 and "seconds" not in tuning  # git-tracked: no wall-clock field
    temporal = pd.read_parquet(pipeline / "temporal/val.parquet")
    assert list(temporal.columns) == ["video_id", "frame", *LABELS, "valid"]
    report = (pipeline / "metrics/report.md").read_text()
    score = json.loads((pipeline / "metrics/score.json").read_text())
    assert f"{score['map@0.5']:.4f}" in report
    assert "Route per label" in report and "| label | route |" in report
    for label, used in route["routes"].items():  # the per-class table says which route each label used
        assert f"| {label} | {used} |" in report
    assert list((pipeline / "plots/timelines").glob("*.png"))


def test_report_writes_the_viewer_of_both_sets(pipeline):
    """The stage's viewer covers the validation and test submissions and clinical lists, offline."""
    events = {name: json.loads((pipeline / f"events/{name}.json").read_text())
              for name in ("val", "clinical_val", "submission", "clinical_submission")}
    counts = check_viewer(pipeline / "plots/viewer", {"validation": (events["val"], events["clinical_val"]),
                                                      "test": (events["submission"], events["clinical_submission"])})
    assert counts["events"] == sum(len(e["label"]) for name in ("val", "submission")
                                   for v in events[name]["videos"] for e in v["events"])
    assert counts["thumbnails"] > 0 and (pipeline / "plots/viewer/label_validation_ulcer.html").is_file()


def test_two_runs_from_scratch_give_identical_results(pipeline, tmp_path):
    """Determinism: the same params on a fresh directory reproduce every number."""
    args = prepare_demo(tmp_path, **OVERRIDES)
    for name in STAGES:
        assert load_stage(name).main(args[name]) == 0, f"stage {name} failed"
    for metrics in ("score.json", "train.json", "thresholds.json", "temporal.json", "route.json"):
        # Byte for byte: these are git-tracked DVC outputs, so no wall-clock field may be in them.
        assert (pipeline / "metrics" / metrics).read_text() == (tmp_path / "metrics" / metrics).read_text(), metrics
    assert pd.read_parquet(pipeline / "predict/val.parquet").equals(pd.read_parquet(tmp_path / "predict/val.parquet"))
    assert (pipeline / "events/submission.json").read_text() == (tmp_path / "events/submission.json").read_text()
