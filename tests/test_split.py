"""The split by video: disjoint, deterministic, rare labels covered in validation; k-fold."""

from __future__ import annotations

import importlib
import json

import numpy as np
import pandas as pd
import pytest
from conftest import repo_params, section_params, write_params

from vce.core.io import write_parquet
from vce.core.labels import LABELS
from vce.core.params import ParamsError, from_dict
from vce.data.split import SplitParams, split_frames

RARE = {"z-line": ("3", "17"), "active bleeding": ("5", "11"), "ulcer": ("8", "19"),
        "hematin": ("2",)}


def frame_table(n_videos: int = 20, per_video: int = 30) -> pd.DataFrame:
    """Videos "1".."n" with common region labels and a few labels each in 1-2 videos only."""
    rng = np.random.default_rng(1)
    ids = np.repeat([str(v) for v in range(1, n_videos + 1)], per_video)
    frames = pd.DataFrame({"video_id": ids, "frame": np.tile(np.arange(per_video) * 5, n_videos),
                           "index": np.tile(np.arange(per_video), n_videos)})
    for label in LABELS:
        frames[label] = (rng.random(len(frames)) < 0.2).astype(np.uint8)
    for label, videos in RARE.items():
        frames[label] = (frames["video_id"].isin(videos) & (frames["frame"] < 20)).astype(np.uint8)
    return frames


def test_split_is_by_video_deterministic_and_sized():
    frames = frame_table()
    cfg = section_params(SplitParams, "split", seed=3, val_fraction=0.25)
    out, summary = split_frames(frames, cfg)
    assert list(out.columns) == [*frames.columns, "split", "fold"]
    assert (out.groupby("video_id")["split"].nunique() == 1).all()
    assert summary["n_videos"] == {"train": 15, "val": 5}
    assert set(summary["videos"]["train"]).isdisjoint(summary["videos"]["val"])
    assert summary["n_frames"]["val"] == 5 * 30
    again, _ = split_frames(frames, cfg)
    assert again.equals(out)
    others = {tuple(split_frames(frames, section_params(SplitParams, "split", seed=s))[1]["videos"]["val"]) for s in range(5)}
    assert len(others) > 1, "the seed changes the split"


def test_rare_labels_have_positives_on_both_sides():
    frames = frame_table()
    for seed in range(5):
        _, summary = split_frames(frames, section_params(SplitParams, "split", seed=seed))
        for label in ("z-line", "active bleeding", "ulcer"):  # each in exactly 2 videos
            assert summary["positive_videos"][label] == {"train": 1, "val": 1}, (seed, label)
        assert summary["labels_without_val_positives"] in ([], ["hematin"])


def test_summary_counts_match_the_frames():
    frames = frame_table()
    out, summary = split_frames(frames, section_params(SplitParams, "split"))
    for label in LABELS:
        for part in ("train", "val"):
            rows = out[out["split"] == part]
            assert summary["positive_frames"][label][part] == int(rows[label].sum())
            assert summary["positive_videos"][label][part] == \
                int((rows.groupby("video_id")[label].sum() > 0).sum())
    json.dumps(summary)  # plain JSON types only


def test_k_fold_partitions_videos_and_fold_0_is_the_split_columns_validation():
    from vce.data.folds import fold_frames

    out, summary = split_frames(frame_table(), section_params(SplitParams, "split", folds=[0, 1, 2, 3]))
    fold_of = summary["fold_of_video"]
    vals = [{v for v, f in fold_of.items() if f == fold} for fold in range(4)]
    assert [len(v) for v in vals] == [5, 5, 5, 5]
    assert set().union(*vals) == {str(v) for v in range(1, 21)}, "each video is validation in exactly one fold"
    assert set(out.loc[out["split"] == "val", "video_id"]) == vals[0] == set(summary["videos"]["val"])
    for fold in range(4):
        view = fold_frames(out, fold)
        assert set(view.loc[view["split"] == "val", "video_id"]) == vals[fold]
    assert summary["n_folds"] == 4 and summary["fold"] == 0


def test_too_few_videos_and_bad_params_are_errors():
    with pytest.raises(ValueError, match="^a split by video needs at least 2 videos, the index has 1$"):
        split_frames(frame_table(n_videos=1), section_params(SplitParams, "split"))
    with pytest.raises(ValueError, match=(
            r"^split.folds = \[0, 1, 2, 3, 4\]: 5 folds need at least that many videos, the index has 3$")):
        split_frames(frame_table(n_videos=3), section_params(SplitParams, "split", folds=[0, 1, 2, 3, 4]))
    with pytest.raises(ParamsError, match=r"^split.folds = \[0, 2\]: must be the fold ids 0..k-1 in order, e.g. \[0, 1\]"):
        from_dict(SplitParams, {**repo_params()["split"], "folds": [0, 2]}, "split")
    with pytest.raises(ParamsError, match=r"^split.folds = \[\]: must have at least 1 item"):
        from_dict(SplitParams, {**repo_params()["split"], "folds": []}, "split")
    with pytest.raises(ParamsError, match=r"^split.val_fraction = 1.0: must be < 1.0$"):
        from_dict(SplitParams, {**repo_params()["split"], "val_fraction": 1.0}, "split")


def load_stage():
    return importlib.import_module("stages.split")


def test_stage_writes_split_and_metrics(tmp_path, capsys):
    write_parquet(tmp_path / "frames.parquet", frame_table())
    write_params(tmp_path / "params.yaml", split={"seed": 42, "val_fraction": 0.25})
    args = ["--params", str(tmp_path / "params.yaml"), "--index", str(tmp_path / "frames.parquet"),
            "--out", str(tmp_path / "split/frames.parquet"), "--metrics", str(tmp_path / "split.json")]
    stage = load_stage()
    assert stage.main(args) == 0
    out = pd.read_parquet(tmp_path / "split/frames.parquet")
    assert set(out["split"]) == {"train", "val"} and len(out) == 600
    first = (tmp_path / "split/frames.parquet").read_bytes()
    assert stage.main(args) == 0 and (tmp_path / "split/frames.parquet").read_bytes() == first
    assert json.loads((tmp_path / "split.json").read_text())["n_videos"] == {"train": 15, "val": 5}
    args[3] = str(tmp_path / "missing.parquet")
    assert stage.main(args) == 2
    assert capsys.readouterr().err.endswith(
        f"error: frame index not found: {tmp_path}/missing.parquet (run the index stage first)\n")


def test_explicit_validation_videos_are_exactly_the_validation_part():
    frames = frame_table()
    cfg = section_params(SplitParams, "split", val_videos=["3", 17, "20"])  # YAML may give integers
    out, summary = split_frames(frames, cfg)
    assert summary["videos"]["val"] == ["17", "20", "3"] and summary["chosen_by"] == "split.val_videos"
    assert set(out.loc[out["split"] == "val", "video_id"]) == {"3", "17", "20"}
    assert summary["n_videos"] == {"train": 17, "val": 3}
    assert split_frames(frames, section_params(SplitParams, "split"))[1]["chosen_by"] == "search"


def test_explicit_validation_videos_are_checked_against_the_index():
    frames = frame_table(n_videos=4)
    with pytest.raises(ParamsError, match=r"^split.val_videos: unknown video id\(s\) \['99'\]; "
                                          r"the frame index has \['1', '2', '3', '4'\]$"):
        split_frames(frames, section_params(SplitParams, "split", val_videos=["2", "99"]))
    with pytest.raises(ParamsError, match=r"^split.val_videos: lists all 4 videos"):
        split_frames(frames, section_params(SplitParams, "split", val_videos=["1", "2", "3", "4"]))
    with pytest.raises(ParamsError, match=r"^split.val_videos = \[.1.\]: explicit validation videos need one split, split.folds = \[0\] \(it lists 2 folds\)$"):
        from_dict(SplitParams, {**repo_params()["split"], "folds": [0, 1], "val_videos": ["1"]}, "split")
    with pytest.raises(ParamsError, match=r"^split.val_videos = .*: lists a video twice"):
        from_dict(SplitParams, {**repo_params()["split"], "val_videos": ["1", 1]}, "split")


# ----------------------------------------------------------------------------- split.test_videos


def test_test_videos_are_held_out_of_every_part_and_fold():
    frames = frame_table()
    for n_folds in (1, 4):
        folds = {"folds": list(range(n_folds))}
        out, summary = split_frames(frames, section_params(SplitParams, "split", test_videos=["3", 17], **folds))
        test = out[out["split"] == "test"]
        assert set(test["video_id"]) == {"3", "17"} and len(test) == 2 * 30
        assert (test["fold"] == -1).all(), "no fold trains on, nor validates on, a test video"
        assert test.drop(columns=["split", "fold"]).reset_index(drop=True).equals(
            frames[frames["video_id"].isin(["3", "17"])].reset_index(drop=True)), "rows and labels kept as indexed"
        assert summary["test"]["videos"] == ["17", "3"] and summary["test"]["n_frames"] == 60
        assert summary["test"]["positive_videos"]["z-line"] == 2  # z-line is only in videos 3 and 17
        assert "3" not in summary["videos"]["train"] + summary["videos"]["val"]
        # The folds / parts are built on the remaining videos only: exactly the split of the index without them.
        rest = frames[~frames["video_id"].isin(["3", "17"])].reset_index(drop=True)
        alone, alone_summary = split_frames(rest, section_params(SplitParams, "split", **folds))
        assert out[out["split"] != "test"].reset_index(drop=True).equals(alone)
        assert {k: v for k, v in summary.items() if k != "test"} == alone_summary
        if n_folds > 1:
            assert "3" not in summary["fold_of_video"] and len(summary["fold_of_video"]) == 18


def test_without_test_videos_the_split_and_its_summary_are_unchanged():
    """split.test_videos: [] (the demo): no "test" rows and no "test" key (dvc.lock outputs unchanged)."""
    out, summary = split_frames(frame_table(), section_params(SplitParams, "split"))
    assert set(out["split"]) == {"train", "val"} and "test" not in summary


def test_test_videos_with_explicit_validation_videos():
    out, summary = split_frames(frame_table(), section_params(SplitParams, "split", val_videos=["5", "6"],
                                                             test_videos=["7"]))
    assert summary["videos"]["val"] == ["5", "6"] and summary["test"]["videos"] == ["7"]
    assert summary["n_videos"] == {"train": 17, "val": 2}
    assert set(out.loc[out["split"] == "test", "video_id"]) == {"7"}


def test_test_videos_are_checked_against_the_index_and_the_other_keys():
    frames = frame_table(n_videos=4)
    with pytest.raises(ParamsError, match=r"^split.test_videos: unknown video id\(s\) \['99'\]; "
                                          r"the frame index has \['1', '2', '3', '4'\]$"):
        split_frames(frames, section_params(SplitParams, "split", test_videos=["2", 99]))
    with pytest.raises(ParamsError, match=r"^split.test_videos: holds out 3 of the 4 labelled videos, 1 left "
                                          r"for training and validation; split.folds = \[0\] needs at least 2$"):
        split_frames(frames, section_params(SplitParams, "split", test_videos=["1", "2", "3"]))
    with pytest.raises(ParamsError, match=r"^split.test_videos: holds out 2 of the 4 labelled videos, 2 left "
                                          r"for training and validation; split.folds = \[0, 1, 2\] needs at least 3$"):
        split_frames(frames, section_params(SplitParams, "split", folds=[0, 1, 2], test_videos=["1", "2"]))
    assert split_frames(frames, section_params(SplitParams, "split", test_videos=["1", "2"]))[1]["n_videos"] == {
        "train": 1, "val": 1}
    with pytest.raises(ParamsError, match=r"^split.test_videos = \['3', '4'\]: video\(s\) \['3'\] are also in "
                                          r"split.val_videos: a video is validation or test, not both$"):
        from_dict(SplitParams, {**repo_params()["split"], "val_videos": [3], "test_videos": ["3", "4"]}, "split")
    with pytest.raises(ParamsError, match=r"^split.test_videos = .*: lists a video twice"):
        from_dict(SplitParams, {**repo_params()["split"], "test_videos": ["1", 1]}, "split")


def test_stage_writes_the_held_out_videos_beside_the_split(tmp_path):
    write_parquet(tmp_path / "frames.parquet", frame_table())
    args = ["--params", str(tmp_path / "params.yaml"), "--index", str(tmp_path / "frames.parquet"),
            "--out", str(tmp_path / "split/frames.parquet"), "--metrics", str(tmp_path / "split.json")]
    write_params(tmp_path / "params.yaml", split={"test_videos": []})
    assert load_stage().main(args) == 0
    empty = pd.read_parquet(tmp_path / "split/test.parquet")
    assert len(empty) == 0 and list(empty.columns) == list(pd.read_parquet(tmp_path / "split/frames.parquet").columns)
    write_params(tmp_path / "params.yaml", split={"test_videos": ["4", "9"]})
    assert load_stage().main(args) == 0
    split, test = pd.read_parquet(tmp_path / "split/frames.parquet"), pd.read_parquet(tmp_path / "split/test.parquet")
    assert set(test["video_id"]) == {"4", "9"} and set(test["split"]) == {"test"} and len(test) == 60
    assert not set(split["video_id"]) & {"4", "9"} and set(split["split"]) == {"train", "val"} and len(split) == 540
    assert json.loads((tmp_path / "split.json").read_text())["test"]["videos"] == ["4", "9"]
    assert load_stage().main([*args, "--test-out", str(tmp_path / "elsewhere.parquet")]) == 0
    assert pd.read_parquet(tmp_path / "elsewhere.parquet").equals(test)


def test_group_sizes_keep_one_video_on_each_side_and_allow_one_video_per_fold():
    from vce.data.split import group_sizes

    assert group_sizes(4, section_params(SplitParams, "split", val_fraction=0.95)) == [1, 3]  # never all validation
    assert group_sizes(4, section_params(SplitParams, "split", val_fraction=0.01)) == [3, 1]  # never none
    assert group_sizes(3, section_params(SplitParams, "split", folds=[0, 1, 2])) == [1, 1, 1]
    out, _ = split_frames(frame_table(n_videos=3), section_params(SplitParams, "split", folds=[0, 1, 2]))
    assert sorted(out.groupby("video_id")["fold"].first()) == [0, 1, 2]


def test_one_split_marks_validation_fold_0_and_training_no_fold():
    out, summary = split_frames(frame_table(), section_params(SplitParams, "split", val_fraction=0.25))
    folds = out.groupby("video_id").agg(split=("split", "first"), fold=("fold", "first"))
    assert set(folds.loc[folds["split"] == "val", "fold"]) == {0} and (folds["split"] == "val").sum() == 5
    assert set(folds.loc[folds["split"] == "train", "fold"]) == {-1}


def test_the_split_search_prefers_rare_labels_on_both_sides_then_balanced_shares():
    """Of the candidate splits, the chosen one holds every 2-video label on both sides (the
    first key), so a search over a single candidate does worse on the same frames."""
    frames = frame_table()
    cfg = section_params(SplitParams, "split", seed=0)
    _, summary = split_frames(frames, cfg)
    both = sum(summary["positive_videos"][label] == {"train": 1, "val": 1} for label in ("z-line", "active bleeding", "ulcer"))
    _, one = split_frames(frames, cfg.replace(candidates=1))
    one_both = sum(one["positive_videos"][label] == {"train": 1, "val": 1} for label in ("z-line", "active bleeding", "ulcer"))
    assert both == 3 and one_both < 3


def positives_table(counts: dict[str, dict[str, int]], per_video: int = 10) -> pd.DataFrame:
    """`per_video` frames per video; counts[video][label]: how many of them are positive (others 0)."""
    tables = []
    for video, labels in counts.items():
        table = pd.DataFrame({"video_id": video, "frame": np.arange(per_video) * 5, "index": np.arange(per_video)})
        for label in LABELS:
            table[label] = (np.arange(per_video) < labels.get(label, 0)).astype(np.uint8)
        tables.append(table)
    return pd.concat(tables, ignore_index=True)


def chosen_validation(counts: dict, val_fraction: float) -> list[str]:
    """The validation videos the search keeps (its 2000 candidates cover every choice of so few videos)."""
    cfg = section_params(SplitParams, "split", val_fraction=val_fraction)
    return split_frames(positives_table(counts), cfg)[1]["videos"]["val"]


def test_the_split_search_then_prefers_labels_in_validation():
    # One validation video of four. Every choice puts colon on both sides (first key tied); only
    # d holds hematin: with d in validation, validation sees 2 labels, else 1 (the second key).
    counts = {"a": {"colon": 5}, "b": {"colon": 5}, "c": {"colon": 5}, "d": {"colon": 5, "hematin": 3}}
    assert chosen_validation(counts, val_fraction=0.25) == ["d"]


def test_the_split_search_then_weighs_coverage_by_rarity():
    # One validation video of five; z-line is in 2 videos (a, b), ulcer in 3 (c, d, e). Any choice
    # puts one label on both sides (first two keys tied); covering z-line weighs 1/2, ulcer 1/3:
    # validation is a or b, although c (ulcer share 1/5 = its video share) is better balanced.
    counts = {"a": {"z-line": 5}, "b": {"z-line": 5}, "c": {"ulcer": 1}, "d": {"ulcer": 2}, "e": {"ulcer": 2}}
    assert chosen_validation(counts, val_fraction=0.2) in (["a"], ["b"])


def test_the_split_search_then_balances_each_labels_validation_share():
    # One validation video of three, each with colon (all keys before balance tied). Colon frames
    # 2, 3, 7 of 12: validation should hold a third of them; b (3/12) is the closest, c the farthest.
    counts = {"a": {"colon": 2}, "b": {"colon": 3}, "c": {"colon": 7}}
    assert chosen_validation(counts, val_fraction=1 / 3) == ["b"]
