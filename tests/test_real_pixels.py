"""bench/real_pixels.py's video builder: real stills in the Galar and test layouts, read by the index."""

import json

import numpy as np
import pandas as pd
import pytest

from bench.real_pixels import build_videos, still_sequence, video_labels
from tests.conftest import tiny_params
from vce.core.labels import LABEL_INDEX, LABELS, PATHOLOGY, REGIONS
from vce.core.params import from_dict
from vce.data.index import DataParams, build_index
from vce.demo.generate import DemoParams

HOLDS = {"lead": 0.15, "run": (2, 4), "background": (3, 8), "blood": (2, 4)}


def runs_of(values: list) -> list[tuple]:
    """(value, length) of each run of equal consecutive values."""
    cuts = [0] + [i for i in range(1, len(values)) if values[i] != values[i - 1]] + [len(values)]
    return [(values[a], b - a) for a, b in zip(cuts[:-1], cuts[1:])]


def test_still_sequence_holds_each_still_once_and_keeps_blood_after_the_lead():
    bleeding = [f"b{i}" for i in range(9)]
    background = [f"n{i}" for i in range(20)]
    files, blood = still_sequence(bleeding, background, np.random.default_rng(3), HOLDS)
    runs = runs_of(files)
    assert sorted(name for name, _ in runs) == sorted(bleeding + background)  # each still one run
    for name, length in runs:
        low, high = HOLDS["blood" if name.startswith("b") else "background"]
        assert low <= length <= high, (name, length)
    assert blood.tolist() == [int(name.startswith("b")) for name in files]
    first_blood = files[int(np.flatnonzero(blood)[0])]
    backgrounds_before = {name for name in files[:files.index(first_blood)] if name.startswith("n")}
    assert len(backgrounds_before) >= int(np.ceil(HOLDS["lead"] * len(background)))


def test_video_labels_keep_blood_as_given_with_or_without_anatomy(tmp_path):
    demo = from_dict(DemoParams, tiny_params(tmp_path)["demo"], "demo")
    blood = (np.arange(200) % 7 < 2).astype(np.uint8)
    with_anatomy = video_labels(blood, demo, np.random.default_rng(0))
    blood_only = video_labels(blood, demo, np.random.default_rng(0), anatomy=False)
    for labels in (with_anatomy, blood_only):
        assert (labels[:, LABEL_INDEX["blood"]] == blood).all()
    assert (with_anatomy[:, [LABEL_INDEX[r] for r in REGIONS]].sum(axis=1) == 1).all()
    others = [k for k, label in enumerate(LABELS) if label != "blood"]
    assert blood_only[:, others].sum() == 0


@pytest.fixture(scope="module")
def built(tmp_path_factory, fixtures_dir):
    out = tmp_path_factory.mktemp("real_pixels")
    params = tiny_params(out)
    demo = from_dict(DemoParams, params["demo"], "demo")
    truth = build_videos(fixtures_dir / "wcebleedgen", out / "videos", 2, 1, demo, HOLDS, seed=1)
    params["data"].update(root=str(out / "videos/galar"), test_root=str(out / "videos/test"), metadata=None)
    frames, test, report = build_index(from_dict(DataParams, params["data"], "data"))
    return out, truth, frames, test, report


def test_videos_use_every_still_once_with_its_real_label(built, fixtures_dir):
    _, truth, _, _, _ = built
    sources = pd.read_csv(fixtures_dir / "wcebleedgen/labels.csv").set_index("file")["bleeding"]
    assert truth.groupby("source")["video_id"].nunique().max() == 1  # disjoint between videos
    assert set(truth["source"]) == set(sources.index)  # all 300 stills dealt
    assert (truth["blood"].to_numpy() == sources[truth["source"]].to_numpy()).all()
    for _, video in truth.groupby("video_id"):  # about half the stills of a video bleed
        per_still = video.drop_duplicates("source")["blood"]
        assert abs(per_still.mean() - 0.5) < 0.02


def test_index_reads_the_layouts_with_the_labels_written(built):
    _, truth, frames, test, report = built
    assert sum(report.counts.values()) == 0  # no warning: every frame listed and on disk
    assert sorted(frames["video_id"].unique()) == ["1", "2"]
    assert test["video_id"].unique().tolist() == ["ukdd_navi_00051"]
    joined = frames.merge(truth, on=["video_id", "frame"], suffixes=("", "_truth"), validate="one_to_one")
    assert len(joined) == len(truth[truth["video_id"].isin(["1", "2"])])
    assert (joined["blood"] == joined["blood_truth"]).all()
    regions = frames[list(REGIONS)].to_numpy()
    assert (regions.sum(axis=1) == 1).all()  # one region per frame
    for _, video in frames.groupby("video_id"):
        order = video[list(REGIONS)].to_numpy().argmax(axis=1)
        assert (np.diff(order) >= 0).all()  # mouth → colon, never back
    other_findings = [finding for finding in PATHOLOGY if finding != "blood"]
    assert frames[other_findings].to_numpy().sum() == 0  # blood is the only finding


def test_test_ground_truth_has_the_blood_runs_in_frame_units(built):
    out, truth, _, test, _ = built
    gt = json.loads((out / "videos/test_ground_truth.json").read_text())
    assert [v["video_id"] for v in gt["videos"]] == ["ukdd_navi_00051"]
    video = truth[truth["video_id"] == "ukdd_navi_00051"]
    blood_frames = set(video.loc[video["blood"] == 1, "frame"])
    in_events = {f for e in gt["videos"][0]["events"] if "blood" in e["label"]
                 for f in range(e["start"], e["end"] + 1)}
    assert in_events == blood_frames
    assert set(test["frame"]) == set(video["frame"])
