"""The demo dataset: deterministic bytes, the real layouts, realistic timelines, learnable pixels."""

from __future__ import annotations

import hashlib
import json
import re

import cv2
import numpy as np
import pandas as pd
import pytest
from conftest import repo_params, section_params

from vce.core.labels import LABEL_INDEX, LABELS, LANDMARKS, PATHOLOGY, REGIONS
from vce.core.params import ParamsError, from_dict
from vce.data.index import DataParams, build_index
from vce.demo.generate import EXTRA_COLUMNS, DemoParams, events_of, generate, timeline

SMALL = section_params(DemoParams, "demo", n_videos=2, frames_per_video=150, n_test_videos=2, test_frames_per_video=120,
                   image_size=32)


def digest(root) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def small_demo(tmp_path_factory):
    root = tmp_path_factory.mktemp("demo")
    generate(root, SMALL)
    return root


def test_same_seed_gives_identical_bytes_other_seed_differs(small_demo, tmp_path):
    generate(tmp_path / "again", SMALL)
    assert digest(tmp_path / "again") == digest(small_demo)
    generate(tmp_path / "other", SMALL.replace(seed=7))
    assert digest(tmp_path / "other") != digest(small_demo)


def test_galar_layout_names_and_label_csvs(small_demo):
    galar = small_demo / "galar"
    for video_id in ("1", "2"):
        folder = galar / "Galar_Frames_1_to_10" / video_id
        names = sorted(p.name for p in folder.iterdir())
        assert len(names) == 150 and all(re.fullmatch(r"frame_\d{6}\.PNG", n) for n in names)
        table = pd.read_csv(galar / "Labels" / f"{video_id}.csv")
        assert list(table.columns) == ["index", *LABELS, *EXTRA_COLUMNS, "frame"]
        assert table["index"].tolist() == list(range(150))
        assert set(np.diff(table["frame"])) == {SMALL.frame_step}
        assert names == [f"frame_{f:06d}.PNG" for f in table["frame"]]
        assert set(np.unique(table[list(LABELS)])) <= {0, 1}
    metadata = pd.read_csv(galar / "metadata.csv")
    assert list(metadata.columns) == ["video_id", "capsule"] and len(metadata) == 2


def test_test_layout_names_lists_and_hidden_truth(small_demo):
    test = small_demo / "test"
    for video_id, first in (("ukdd_navi_00051", 49), ("ukdd_navi_00068", 81)):
        names = sorted(p.name for p in (test / video_id).iterdir())
        assert names == [f"frame_{f:07d}.png" for f in range(first, first + 120)]
        frame_list = pd.read_csv(test / "ukdd_navi_00051_00068" / f"{video_id}.csv", sep=";")
        assert list(frame_list.columns) == ["frame_file", *LABELS]
        assert frame_list["frame_file"].tolist() == names
        assert frame_list[list(LABELS)].isna().all().all()
    truth = json.loads((small_demo / "test_ground_truth.json").read_text())
    assert [v["video_id"] for v in truth["videos"]] == ["ukdd_navi_00051", "ukdd_navi_00068"]
    events = truth["videos"][0]["events"]
    assert events[0]["start"] == 49 and events[-1]["end"] == 49 + 119
    assert all(set(e["label"]) <= set(LABELS) for e in events)


def test_index_reads_the_demo_without_warnings(small_demo):
    frames, test, report = build_index(section_params(DataParams, "data",
        root=str(small_demo / "galar"), test_root=str(small_demo / "test")))
    assert len(frames) == 300 and len(test) == 240
    assert report.as_dict()["n_warnings"] == 0
    assert set(frames.groupby("video_id")["capsule"].first()) <= {
        "PillCam SB3", "Olympus", "PillCam COLON2", "PillCam SB2"}


def test_timelines_follow_anatomy_order_and_real_statistics():
    cfg = section_params(DemoParams, "demo")
    rng = np.random.default_rng(0)
    present = {label: 0 for label in LABELS}
    for _ in range(40):
        labels = timeline(1200, cfg, rng)
        regions = labels[:, [LABEL_INDEX[r] for r in REGIONS]]
        assert (regions.sum(1) == 1).all(), "exactly one region per frame"
        order = regions.argmax(1)
        assert (np.diff(order) >= 0).all() and order[0] == 0 and order[-1] == 4
        for landmark, (_, after) in LANDMARKS.items():
            frames = np.flatnonzero(labels[:, LABEL_INDEX[landmark]])
            if len(frames):
                boundary = np.flatnonzero(order == REGIONS.index(after))[0]
                assert frames[0] <= boundary <= frames[-1] + 1, landmark
        for label in PATHOLOGY:
            column = labels[:, LABEL_INDEX[label]]
            edges = np.diff(np.r_[0, column, 0].astype(int))
            lengths = np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)
            assert (lengths >= cfg.min_event_frames).all()
            assert column.mean() < 0.2, "findings are rare"
        present = {label: present[label] + int(labels[:, LABEL_INDEX[label]].any())
                   for label in LABELS}
    for label in PATHOLOGY + tuple(LANDMARKS):
        assert 0 < present[label] < 40, f"{label} should be absent from some videos only"


def test_events_cut_whenever_the_label_set_changes():
    labels = np.zeros((6, len(LABELS)), np.uint8)
    labels[:, LABEL_INDEX["stomach"]] = 1
    labels[2:4, LABEL_INDEX["ulcer"]] = 1
    events = events_of(labels, np.arange(10, 16))
    assert events == [{"start": 10, "end": 11, "label": ["stomach"]},
                      {"start": 12, "end": 13, "label": ["stomach", "ulcer"]},
                      {"start": 14, "end": 15, "label": ["stomach"]}]


def test_pixels_separate_regions_and_show_findings(small_demo):
    """Nearest-centroid on mean colour tells regions apart; marks change the frames they touch."""
    frames, _, _ = build_index(section_params(DataParams, "data", root=str(small_demo / "galar"), test_root=None))
    images = np.stack([cv2.imread(str(small_demo / "galar" / p))[:, :, ::-1] for p in frames["path"]])
    colour = images.reshape(len(images), -1, 3).mean(1)  # (N, 3)
    region = frames[list(REGIONS)].to_numpy().argmax(1)
    train, held = frames["video_id"] == "1", frames["video_id"] == "2"
    centroids = np.stack([colour[train & (region == r)].mean(0) for r in range(2, 5)])
    big = held & (region >= 2)
    guess = 2 + np.linalg.norm(colour[big][:, None] - centroids[None], axis=2).argmin(1)
    assert (guess == region[big]).mean() > 0.7
    # A frame with a finding differs more from its region's mean than a plain frame does.
    marked = frames[list(PATHOLOGY)].to_numpy().any(1)
    plain = {r: images[(region == r) & ~marked].mean(0) for r in range(5)
             if ((region == r) & ~marked).any()}
    distance = np.array([np.abs(images[i] - plain[region[i]]).mean() for i in range(len(images))])
    assert distance[marked].mean() > distance[~marked].mean()


def test_bad_params_name_the_key():
    with pytest.raises(ParamsError, match=r"^demo.region_fractions = \[1, 2\]: must be 5 positive numbers \(shares of mouth,"):
        from_dict(DemoParams, {**repo_params()["demo"], "region_fractions": [1, 2]}, "demo")
    with pytest.raises(ParamsError, match=r"^demo.min_event_frames = 80: must be <= max_event_frames \(60\)$"):
        from_dict(DemoParams, {**repo_params()["demo"], "min_event_frames": 80}, "demo")


def test_the_stage_never_replaces_a_folder_it_did_not_write(tmp_path, capsys):
    """Issue 48, BUG 1: `stages.demo_data --out DIR` shares `atomic_dir`, which swapped a whole
    folder in and removed the old one, a user's files with it. Refused in one line before any
    frame is generated. Mutation killed: no mark check in `vce.core.io.check_folder_output`."""
    from conftest import ROOT, load_stage

    mine = tmp_path / "mine"
    (mine / "sub").mkdir(parents=True)
    (mine / "important.txt").write_text("a user's file")
    argv = ["--params", str(ROOT / "params.yaml"), "--out", str(mine)]
    assert load_stage("demo_data").main(argv) == 2
    assert capsys.readouterr().err == (f"error: {mine}: exists and was not written by this tool (no .vce-output in it); "
                                       "it would be replaced whole: name a new or empty folder, or remove it\n")
    assert sorted(p.name for p in mine.iterdir()) == ["important.txt", "sub"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]
