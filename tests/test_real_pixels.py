"""bench/real_pixels.py's video builder: real stills in the Galar and test layouts, read by the index."""

import json

import numpy as np
import pandas as pd
import pytest

from bench.real_pixels import (
    build_curve_videos,
    build_videos,
    check_no_leak,
    picture_groups,
    still_sequence,
    video_labels,
)
from tests.conftest import tiny_params
from vce.core.labels import LABEL_INDEX, LABELS, PATHOLOGY, REGIONS
from vce.core.params import from_dict
from vce.data.index import DataParams, build_index
from vce.data.split import SplitParams, split_frames
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


# ---------------------------------------------------------------- the learning curve's videos

def curve_build(out, fixtures, train_stills: int, seed: int = 0):
    demo = from_dict(DemoParams, tiny_params(out)["demo"], "demo")
    return build_curve_videos(fixtures, out / "videos", 8, 2, 2, train_stills, demo, HOLDS, seed)


@pytest.fixture(scope="module")
def curve(tmp_path_factory, fixtures_dir):
    """Seed 0 at 20 and at 45 distinct training stills per class: (frames, validation ids, folder)."""
    built = {}
    for n in (20, 45):
        out = tmp_path_factory.mktemp(f"curve_{n}")
        built[n] = (*curve_build(out, fixtures_dir / "wcebleedgen", n), out)
    return built


def test_curve_training_videos_share_no_still_or_source_picture_with_validation_or_held_out(curve, fixtures_dir):
    table = pd.read_csv(fixtures_dir / "wcebleedgen/labels.csv").set_index("file")
    for truth, _, _ in curve.values():
        training = truth["role"] == "train"
        train_stills, other_stills = set(truth.loc[training, "source"]), set(truth.loc[~training, "source"])
        assert not train_stills & other_stills
        # the fixture's own record of each still's source picture, compared as written
        assert not set(table.loc[list(train_stills), "source_file"]) & set(table.loc[list(other_stills), "source_file"])
        assert truth.loc[truth["role"] == "test", "video_id"].nunique() == 2


def test_curve_training_videos_hold_n_distinct_stills_per_class_over_about_the_same_frames(curve, fixtures_dir):
    table = pd.read_csv(fixtures_dir / "wcebleedgen/labels.csv").set_index("file")["bleeding"]
    train_frames = {}
    for n, (truth, _, _) in curve.items():
        train = truth[truth["role"] == "train"]
        stills = train.drop_duplicates("source")
        assert (stills["blood"].to_numpy() == table[stills["source"]].to_numpy()).all()
        assert stills["blood"].sum() == n and (stills["blood"] == 0).sum() == n
        assert sorted(train["video_id"].unique(), key=int) == [str(v) for v in range(1, 7)]
        train_frames[n] = len(train)
    assert abs(train_frames[20] - train_frames[45]) / train_frames[45] < 0.1
    # nested: the 20-still pictures are among the 45
    assert set(curve[20][0].query("role == 'train'")["source"]) <= set(curve[45][0].query("role == 'train'")["source"])


def test_curve_validation_and_held_out_videos_do_not_depend_on_the_count(curve):
    fixed = {n: truth[truth["role"] != "train"].reset_index(drop=True) for n, (truth, _, _) in curve.items()}
    pd.testing.assert_frame_equal(fixed[20], fixed[45])
    assert curve[20][1] == curve[45][1] == ["7", "8"]
    assert sorted(fixed[20].loc[fixed[20]["role"] == "val", "video_id"].unique()) == ["7", "8"]


def test_pinned_validation_videos_leave_the_builders_training_videos_to_train(curve):
    truth, val_ids, out = curve[20]
    params = tiny_params(out)
    params["data"].update(root=str(out / "videos/galar"), test_root=str(out / "videos/test"), metadata=None)
    params["split"].update(val_videos=val_ids, folds=[0])
    frames, _, _ = build_index(from_dict(DataParams, params["data"], "data"))
    split, _ = split_frames(frames, from_dict(SplitParams, params["split"], "split"))
    assert set(split.loc[split["split"] == "train", "video_id"]) == set(truth.loc[truth["role"] == "train", "video_id"])
    assert set(split.loc[split["split"] == "val", "video_id"]) == set(val_ids)


def test_a_leaked_still_or_source_picture_is_refused(curve, fixtures_dir):
    table = pd.read_csv(fixtures_dir / "wcebleedgen/labels.csv")
    truth, _, _ = curve[20]
    check_no_leak(truth, table)  # the built videos pass
    held_still = truth.loc[truth["role"] == "test", "source"].iloc[0]
    leaked = truth.copy()
    leaked.loc[leaked.index[leaked["role"] == "train"][0], "source"] = held_still
    with pytest.raises(RuntimeError, match="share stills"):
        check_no_leak(leaked, table)
    # another export of a held-out picture (same source_file but Roboflow's hash) in a training video
    train_still = truth.loc[truth["role"] == "train", "source"].iloc[0]
    twin = table.copy()
    held_source = twin.loc[twin["file"] == held_still, "source_file"].iloc[0]
    twin.loc[twin["file"] == train_still, "source_file"] = held_source.split(".rf.")[0] + ".rf.0123abcd.jpg"
    assert picture_groups(twin).nunique() == len(twin) - 1
    with pytest.raises(RuntimeError, match="source pictures"):
        check_no_leak(truth, twin)


def test_curve_builder_keeps_the_exports_of_one_picture_on_one_side(tmp_path, fixtures_dir):
    """A fixture whose stills come in pairs of one source picture: every pair lands together."""
    fixtures = tmp_path / "wcebleedgen"
    fixtures.mkdir()
    (fixtures / "frames").symlink_to(fixtures_dir / "wcebleedgen/frames")
    table = pd.read_csv(fixtures_dir / "wcebleedgen/labels.csv")
    base = picture_groups(table)
    for flag in (0, 1):  # within a class, still 2k+1 becomes another export of still 2k's picture
        rows = table.index[table["bleeding"] == flag]
        table.loc[rows[1::2], "source_file"] = base[rows[0::2]].to_numpy() + ".rf.feedbeef.jpg"
    table.to_csv(fixtures / "labels.csv", index=False)
    truth, _ = curve_build(tmp_path, fixtures, 20, seed=3)
    group = dict(zip(table["file"], picture_groups(table)))
    side = truth.drop_duplicates("source").assign(group=lambda t: t["source"].map(group),
                                                   train=lambda t: t["role"] == "train")
    assert side.groupby("group")["train"].nunique().max() == 1
    assert truth.query("role == 'train'").drop_duplicates("source")["blood"].sum() >= 20


def test_curve_summary_gives_mean_sd_and_auto_minus_frame_per_seed():
    from bench.real_pixels_curve import markdown_tables, summary

    def fake_run(frame_auc: float, auto_auc: float) -> dict:
        events = {"temporal_ap@0.5": 0.3, "temporal_ap@0.95": 0.2, "test_map@0.5": 0.6, "test_map@0.95": 0.5}
        result = {name: {"frame": {"auc": auc, "ap": auc - 0.1}, **events}
                  for name, auc in (("model", frame_auc), ("model+temporal", auto_auc), ("temporal", 0.7),
                                    ("baseline", 0.9))}
        return {"results": result, "routes": {"blood": "frame", "moved": {}}, "train": {"best_epoch": 3},
                "data": {"train_stills": {"blood": 20, "background": 20, "frames": 750, "mean_hold": 18.8}}}

    runs = {(20, 0): fake_run(0.8, 0.9), (20, 1): fake_run(1.0, 1.0)}
    curve = summary(runs, [20, 45], [0, 1])
    assert list(curve) == ["20"]  # a count with no finished run is left out
    assert curve["20"]["frame"]["auc"] == {"values": [0.8, 1.0], "mean": 0.9, "sd": round(float(np.std([0.8, 1.0], ddof=1)), 4)}
    assert curve["20"]["auto_minus_frame"]["auc"] == [0.1, 0.0]
    assert curve["20"]["temporal_minus_frame"]["auc"] == [-0.1, -0.3]
    table = markdown_tables({"curve": curve})
    assert "| 20 | 2 | 0.900 ± 0.141 / 0.800 ± 0.141 | 0.950 ± 0.071 / 0.850 ± 0.071 | 0.700 ± 0.000 / 0.600 ± 0.000 | 0.900 ± 0.000" in table


def test_a_tiny_curve_point_scores_frame_auto_the_temporal_route_and_the_baseline(tmp_path):
    """The bench's whole chain on real stills (1 short epoch, ~25 s): each source is scored from
    its own probabilities, and the temporal route is `post.probs: temporal` on every label."""
    from bench.real_pixels_curve import main as curve_main

    out = tmp_path / "curve.json"
    assert curve_main(["--tiny", "--counts", "20", "--seeds", "1", "--work", str(tmp_path / "w"), "--out", str(out)]) == 0
    run = json.loads((tmp_path / "w/n20_s0.json").read_text())
    assert list(run["results"]) == ["model", "model+temporal", "temporal", "baseline"]
    routes = json.loads((tmp_path / "w/n20_s0/metrics/route_temporal_route.json").read_text())
    assert routes["post_probs"] == "temporal" and routes["counts"]["temporal"] == 17
    auto = json.loads((tmp_path / "w/n20_s0/metrics/route.json").read_text())
    assert auto["post_probs"] == "auto" and run["routes"]["counts"] == auto["counts"]
    if auto["counts"]["frame"] == 17:  # auto kept every label on frame: its numbers are the frame model's
        assert run["results"]["model+temporal"] == run["results"]["model"]
    assert run["results"]["temporal"]["frame"] != run["results"]["model"]["frame"]
    curve = json.loads(out.read_text())["curve"]["20"]
    assert curve["temporal_minus_frame"]["auc"] == [round(run["results"]["temporal"]["frame"]["auc"]
                                                          - run["results"]["model"]["frame"]["auc"], 4)]
