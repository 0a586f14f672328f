"""`split.test_videos`: labelled videos held out as a test set, predicted and scored like the test set.

End to end through the stages' `main([...])` on the tiny demo with `data.test_root: null`: the
test set is then exactly the held-out videos, their ground truth comes from their labels, and
nothing upstream (training, best epoch, thresholds, engine) ever sees them. The score stage is
also checked alone with both kinds of test video (test_root with `score.test_gt`, held out).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import load_stage, prepare_demo, repo_params

from vce.core.contracts import all_test_frames, probs_schema
from vce.core.errors import DataError
from vce.core.labels import LABELS
from vce.eval.score import score
from vce.post.events import labels_to_submission
from vce.post.timeline import labels_on_time

HELD = "2"  # the tiny demo's videos are "1".."4"
STAGES = ["train", "predict", "temporal", "thresholds", "events", "score", "report"]


def held_out_args(args: dict, tmp_path) -> dict:
    """The conftest command lines, with the held-out videos passed where dvc.yaml passes them."""
    held = ["--held-out", str(tmp_path / "split/test.parquet")]
    return {name: argv + held if name in ("predict", "events", "score", "report") else argv
            for name, argv in args.items()}


def expected_gt(tmp_path) -> dict:
    index = pd.read_parquet(tmp_path / "index/frames.parquet")
    return labels_to_submission(labels_on_time(index[index["video_id"] == HELD]))


@pytest.fixture(scope="module")
def held_out_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("test_videos")
    args = held_out_args(prepare_demo(tmp_path, data={"test_root": None}, split={"test_videos": [HELD]},
                                      train={"epochs": 1}, temporal={"steps": 20}, thresholds={"rounds": 1}),
                         tmp_path)
    for name in STAGES:
        assert load_stage(name).main(args[name]) == 0, f"stage {name} failed"
    return tmp_path, args


def test_held_out_videos_are_never_trained_nor_validated_on(held_out_run):
    tmp_path, _ = held_out_run
    index = pd.read_parquet(tmp_path / "index/frames.parquet")
    assert sorted(index["video_id"].unique()) == ["1", "2", "3", "4"]
    split = pd.read_parquet(tmp_path / "split/frames.parquet")
    assert HELD not in set(split["video_id"]) and set(split["split"]) == {"train", "val"}
    test = pd.read_parquet(tmp_path / "split/test.parquet")
    assert set(test["video_id"]) == {HELD} and len(test) == (index["video_id"] == HELD).sum()
    from vce.model import checkpoint

    assert HELD not in checkpoint.load(tmp_path / "models/model.pt")["train_videos"]
    # nor predicted as a labelled split (the temporal model, thresholds); predict.splits: [val] leaves the
    # frame model's in-sample training videos unpredicted
    assert HELD not in set(pd.read_parquet(tmp_path / "predict/val.parquet")["video_id"])
    assert not (tmp_path / "predict/train.parquet").exists()
    assert HELD not in {v["video_id"] for v in json.loads((tmp_path / "events/val.json").read_text())["videos"]}


def test_the_test_set_is_exactly_the_held_out_videos(held_out_run):
    tmp_path, _ = held_out_run
    index = pd.read_parquet(tmp_path / "index/frames.parquet")
    probs = pd.read_parquet(tmp_path / "predict/test.parquet")
    assert sorted(zip(probs["video_id"], probs["frame"])) == sorted(
        zip(*index.loc[index["video_id"] == HELD, ["video_id", "frame"]].to_numpy().T))
    assert probs["valid"].all(), "the held-out frames were decoded from data.root"
    assert len(pd.read_parquet(tmp_path / "temporal/test.parquet")) == len(probs)
    submission = json.loads((tmp_path / "events/submission.json").read_text())
    assert [video["video_id"] for video in submission["videos"]] == [HELD]


def test_the_test_score_is_against_the_held_out_labels(held_out_run):
    tmp_path, _ = held_out_run
    gt = expected_gt(tmp_path)
    assert json.loads((tmp_path / "score/test_gt.json").read_text()) == gt
    submission = json.loads((tmp_path / "events/submission.json").read_text())
    result = score(gt, submission)
    empty = score(gt, {"videos": [{"video_id": HELD, "events": []}]})
    assert json.loads((tmp_path / "metrics/headline/test.json").read_text()) == {
        "map@0.5": result["map@0.5"], "map@0.95": result["map@0.95"],
        "empty@0.5": empty["map@0.5"], "empty@0.95": empty["map@0.95"]}
    assert list(json.loads((tmp_path / "metrics/score.json").read_text())["test"]["per_video@0.5"]) == [HELD]
    report = (tmp_path / "metrics/report.md").read_text()
    assert f"### Test video {HELD}" in report and "test (held out)" in report
    assert (tmp_path / f"plots/timelines/test_{HELD}.png").is_file()


def test_perfect_probabilities_of_the_held_out_videos_score_1(held_out_run):
    """Events → score on the held-out video from its own labels as probabilities: every event matched."""
    tmp_path, args = held_out_run
    index = pd.read_parquet(tmp_path / "index/frames.parquet")
    held = index[index["video_id"] == HELD]
    perfect = held[["video_id", "frame"]].assign(**{label: held[label].astype(np.float32) for label in LABELS},
                                                 valid=True)
    perfect.to_parquet(tmp_path / "perfect.parquet", schema=probs_schema(), index=False)
    params = yaml.safe_load((tmp_path / "params.yaml").read_text())
    params["events"].update(style="tuple", median_window=1, fill_gap=0, min_length=1, presence="none",
                            multi_label=True, anatomy="none", per_label={})
    (tmp_path / "perfect_params.yaml").write_text(yaml.safe_dump(params))
    (tmp_path / "half.json").write_text(json.dumps({"method": "f1", "probs": "frame", "thresholds": {k: 0.5 for k in LABELS}}))
    perfect_args = {name: [a.replace("params.yaml", "perfect_params.yaml") for a in argv] for name, argv in args.items()}
    events = perfect_args["events"] + ["--thresholds", str(tmp_path / "half.json"),
                                       "--test-probs", str(tmp_path / "perfect.parquet"),
                                       "--out-dir", str(tmp_path / "perfect_events")]
    assert load_stage("events").main(events) == 0
    score_args = perfect_args["score"] + ["--test-events", str(tmp_path / "perfect_events/submission.json"),
                                          "--test-headline", str(tmp_path / "perfect_test.json"),
                                          "--gt-out", str(tmp_path / "perfect/val_gt.json"),
                                          "--metrics", str(tmp_path / "perfect/score.json")]
    assert load_stage("score").main(score_args) == 0
    headline = json.loads((tmp_path / "perfect_test.json").read_text())
    assert headline["map@0.5"] == headline["map@0.95"] == 1.0
    assert headline["empty@0.5"] < 1.0


def test_a_model_that_trained_on_a_held_out_video_is_refused(held_out_run, capsys):
    from vce.model import checkpoint

    tmp_path, args = held_out_run
    payload = checkpoint.load(tmp_path / "models/model.pt")
    payload["train_videos"] = sorted([*payload["train_videos"], HELD])
    checkpoint.save(tmp_path / "leaky.pt", payload)
    argv = args["predict"] + ["--part", "test", "--model", str(tmp_path / "leaky.pt"),
                              "--out-dir", str(tmp_path / "leaky"), "--report", str(tmp_path / "leaky.json")]
    assert load_stage("predict").main(argv) == 2
    assert f"was trained on 1 video(s) that split.test_videos holds out, e.g. {HELD}" in capsys.readouterr().err
    assert not (tmp_path / "leaky/test.parquet").exists()


def test_the_frame_cache_holds_the_held_out_videos_for_predict_test(held_out_run):
    """cache.enabled: cache_frames caches the held-out frames too, so predict_test reads them from it."""
    tmp_path, args = held_out_run
    params = yaml.safe_load((tmp_path / "params.yaml").read_text())
    params["cache"].update(enabled=True, num_workers=0)
    (tmp_path / "cache_params.yaml").write_text(yaml.safe_dump(params))
    swap = {str(tmp_path / "params.yaml"): str(tmp_path / "cache_params.yaml"), str(tmp_path / "cache"): str(tmp_path / "cache2")}
    cache_args = [swap.get(a, a) for a in args["cache_frames"]] + ["--held-out", str(tmp_path / "split/test.parquet")]
    assert load_stage("cache_frames").main(cache_args) == 0
    index = pd.read_parquet(tmp_path / "index/frames.parquet")
    assert json.loads((tmp_path / "cache2/meta.json").read_text())["count"] == len(index), "labelled + held out"
    argv = [swap.get(a, a) for a in args["predict"]] + ["--part", "test", "--out-dir", str(tmp_path / "cached"),
                                                         "--report", str(tmp_path / "cached.json")]
    assert load_stage("predict").main(argv) == 0
    cached = pd.read_parquet(tmp_path / "cached/test.parquet")
    assert set(cached["video_id"]) == {HELD} and len(cached) == (index["video_id"] == HELD).sum()


# ----------------------------------------------------------------------------- score alone, both kinds


def _frames(videos: list[str], n: int = 40) -> pd.DataFrame:
    """Labelled frames: a stomach → colon video with a short blood run, per id."""
    rows = []
    for v, video in enumerate(videos):
        t = np.arange(n)
        frame = pd.DataFrame({"video_id": video, "frame": t * 5, "index": t, "event_unit": "index"})
        for label in LABELS:
            frame[label] = np.uint8(0)
        frame["stomach"] = (t < n // 2).astype(np.uint8)
        frame["colon"] = (t >= n // 2).astype(np.uint8)
        frame["blood"] = ((t >= 5 + v) & (t < 9 + v)).astype(np.uint8)
        rows.append(frame)
    return pd.concat(rows, ignore_index=True)


@pytest.fixture
def score_inputs(tmp_path):
    """Validation files (one video), held-out frames ("7", "8") and a test_root video with its own truth."""
    val = _frames(["1"]).assign(split="val", fold=0)
    val.to_parquet(tmp_path / "frames.parquet", index=False)
    (tmp_path / "val.json").write_text(json.dumps(labels_to_submission(labels_on_time(val))))
    (tmp_path / "thresholds_metrics.json").write_text(json.dumps({"frame_map": 0.5}))
    held = _frames(["7", "8"]).assign(split="test", fold=-1)
    held.to_parquet(tmp_path / "held.parquet", index=False)
    root_gt = {"videos": [{"video_id": "ukdd_navi_00051", "events": [{"start": 49, "end": 60, "label": ["colon"]}]}]}
    (tmp_path / "root_gt.json").write_text(json.dumps(root_gt))
    held_gt = labels_to_submission(labels_on_time(held))
    # A prediction that is exact on "7", empty on "8", and right on the test_root video.
    submission = {"videos": [*root_gt["videos"], held_gt["videos"][0], {"video_id": "8", "events": []}]}
    (tmp_path / "submission.json").write_text(json.dumps(submission))

    def run(test_gt, held_out=True, events="submission.json"):
        params = repo_params()
        params["score"]["test_gt"] = test_gt and str(tmp_path / test_gt)
        (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
        argv = ["--params", str(tmp_path / "params.yaml"), "--events", str(tmp_path / "val.json"),
                "--frames", str(tmp_path / "frames.parquet"), "--test-events", str(tmp_path / events),
                "--frame-metrics", str(tmp_path / "thresholds_metrics.json"),
                "--gt-out", str(tmp_path / "out/val_gt.json"), "--metrics", str(tmp_path / "out/score.json"),
                "--val-headline", str(tmp_path / "out/val.json"), "--test-headline", str(tmp_path / "out/test.json")]
        code = load_stage("score").main(argv + ["--held-out", str(tmp_path / "held.parquet") if held_out else ""])
        return code, tmp_path / "out"

    return run, root_gt, held_gt, submission


def test_score_holds_the_test_set_against_the_union_of_both_truths(score_inputs):
    run, root_gt, held_gt, submission = score_inputs
    code, out = run("root_gt.json")
    assert code == 0
    union = {"videos": [*root_gt["videos"], *held_gt["videos"]]}
    assert json.loads((out / "test_gt.json").read_text()) == union
    expected = score(union, submission)
    assert json.loads((out / "test.json").read_text())["map@0.5"] == expected["map@0.5"]
    per_video = json.loads((out / "score.json").read_text())["test"]["per_video@0.5"]
    assert per_video["ukdd_navi_00051"] == 1.0 and per_video["7"] == 1.0 and per_video["8"] < 1.0
    assert set(per_video) == {"ukdd_navi_00051", "7", "8"}


def test_score_without_test_gt_scores_the_held_out_videos_only(score_inputs, capsys):
    run, _, held_gt, submission = score_inputs
    code, out = run(None)
    assert code == 0
    assert "1 data.test_root video(s) have no ground truth (score.test_gt: null): the test score covers " \
           "the 2 held-out labelled video(s) only" in capsys.readouterr().err
    assert json.loads((out / "test_gt.json").read_text()) == held_gt
    expected = score(held_gt, {"videos": submission["videos"][1:]})
    assert json.loads((out / "test.json").read_text())["map@0.5"] == expected["map@0.5"]
    assert set(json.loads((out / "score.json").read_text())["test"]["per_video@0.5"]) == {"7", "8"}


def test_score_without_any_known_test_truth_writes_no_test_score(score_inputs):
    run, *_ = score_inputs
    code, out = run(None, held_out=False)
    assert code == 0
    assert json.loads((out / "test.json").read_text()) == {}
    assert json.loads((out / "test_gt.json").read_text()) == {"videos": []}


def test_an_empty_submission_without_a_test_set_is_said_in_one_line(score_inputs, capsys, tmp_path):
    """`data.test_root: null` without held-out videos writes an empty submission: the score stage
    says so (it used to pass in silence when score.test_gt was null too)."""
    run, *_ = score_inputs
    (tmp_path / "empty.json").write_text(json.dumps({"videos": []}))
    for test_gt in (None, "root_gt.json"):
        code, out = run(test_gt, held_out=False, events="empty.json")
        assert code == 0 and json.loads((out / "test.json").read_text()) == {}
        notes = [line for line in capsys.readouterr().err.splitlines() if "holds no video" in line]
        assert len(notes) == 1 and "empty.json" in notes[0] and "data.test_root" in notes[0], notes
        assert ("the test set is not scored" in notes[0]) == (test_gt is not None)
    run(None, held_out=False)  # a submission with videos: nothing to say
    assert "holds no video" not in capsys.readouterr().err


def test_a_submission_without_the_held_out_videos_is_an_error(score_inputs, capsys):
    """The official check: the test events must hold exactly the videos of the known truth."""
    run, *_ = score_inputs
    code, _ = run("root_gt.json", events="val.json")  # the validation events: video "1" only
    assert code == 2
    assert "val.json: video ids differ from the ground truth's (missing: ['7', '8', 'ukdd_navi_00051']; " \
           "extra: ['1'])" in capsys.readouterr().err


def test_a_video_both_in_the_test_root_and_held_out_is_an_error():
    test = pd.DataFrame({"video_id": ["7"], "frame": [1], "index": [0], "path": ["7/f.png"], "event_unit": ["frame"]})
    with pytest.raises(DataError, match=r"video id\(s\) \['7'\] are both a data.test_root video and a held-out"):
        all_test_frames(test, _frames(["7"]).assign(path="x"))
    joined = all_test_frames(test.assign(video_id="ukdd"), _frames(["7"]).assign(path="x"))
    assert list(joined.columns) == list(test.columns) and len(joined) == 41
    assert all_test_frames(test, None) is test
