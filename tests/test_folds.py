"""K-fold training and prediction: every labelled video predicted out of fold exactly once."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import ROOT, load_stage, prepare_demo
from viewer_check import check_viewer

from vce.core.errors import DataError, ParamsError
from vce.core.labels import LABELS
from vce.core.params import from_dict
from vce.data.folds import fold_frames
from vce.data.split import SplitParams
from vce.infer import detect
from vce.infer.ensemble import check_coverage
from vce.model import checkpoint


def fold_argv(args, tmp_path, fold: int, model_fold: int | None = None) -> dict[str, list[str]]:
    """train@fold, predict@fold (labelled) and predict_test@fold command lines under tmp_path."""
    p = args["train"][:2]
    model = str(tmp_path / f"models/folds/{fold if model_fold is None else model_fold}/model.pt")
    common = ["--fold", str(fold), "--model", model, "--cache", str(tmp_path / "cache")]
    return {
        "train": p + ["--fold", str(fold), "--frames", str(tmp_path / "split/frames.parquet"),
                      "--cache", str(tmp_path / "cache"), "--prompts", str(tmp_path / "models/prompt_embeddings.pt"),
                      "--model-out", model, "--state-dir", str(tmp_path / f"models/train_state/fold_{fold}"),
                      "--metrics", str(tmp_path / f"metrics/folds/train_{fold}.json"),
                      "--live-dir", str(tmp_path / f"metrics/train/fold_{fold}")],
        "predict": p + ["--part", "labelled", *common, "--frames", str(tmp_path / "split/frames.parquet"),
                        "--out-dir", str(tmp_path / f"predict/fold_{fold}"),
                        "--report", str(tmp_path / f"metrics/folds/predict_{fold}.json")],
        "predict_test": p + ["--part", "test", *common, "--test", str(tmp_path / "index/test.parquet"),
                             "--held-out", str(tmp_path / "split/test.parquet"),
                             "--out-dir", str(tmp_path / f"predict_test/fold_{fold}"),
                             "--report", str(tmp_path / f"metrics/folds/predict_test_{fold}.json")],
    }


def ensemble_argv(args, tmp_path) -> list[str]:
    return args["train"][:2] + ["--predict-dir", str(tmp_path / "predict"), "--test-dir", str(tmp_path / "predict_test"),
                                "--frames", str(tmp_path / "split/frames.parquet"),
                                "--out-dir", str(tmp_path / "ensemble"), "--metrics", str(tmp_path / "metrics/ensemble.json")]


def run_folds(tmp_path, n_folds: int, **overrides):
    args = prepare_demo(tmp_path, split={"folds": list(range(n_folds))},
                        train={"epochs": 1, "samples_per_epoch": 64}, **overrides)
    for fold in range(n_folds):
        argv = fold_argv(args, tmp_path, fold)
        for stage in ("train", "predict", "predict_test"):
            assert load_stage("train" if stage == "train" else "predict").main(argv[stage]) == 0, (stage, fold)
    assert load_stage("ensemble").main(ensemble_argv(args, tmp_path)) == 0
    return args


@pytest.fixture(scope="module")
def three_folds(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("folds")
    return tmp_path, run_folds(tmp_path, 3)


def test_every_labelled_video_is_predicted_once_by_a_model_that_never_saw_it(three_folds):
    tmp_path, _ = three_folds
    frames = pd.read_parquet(tmp_path / "split/frames.parquet")
    oof = pd.read_parquet(tmp_path / "ensemble/val.parquet")
    # exactly the labelled frames, each once
    assert not oof.duplicated(["video_id", "frame"]).any()
    assert sorted(zip(oof["video_id"], oof["frame"])) == sorted(zip(frames["video_id"], frames["frame"]))
    fold_of = frames.groupby("video_id")["fold"].first()
    assert sorted(fold_of.unique()) == [0, 1, 2]
    for video, fold in fold_of.items():
        trained_on = checkpoint.load(tmp_path / f"models/folds/{fold}/model.pt")["train_videos"]
        assert video not in trained_on
        # ... and every other fold's model did train on it (k-fold: held out by one fold only)
        assert all(video in checkpoint.load(tmp_path / f"models/folds/{k}/model.pt")["train_videos"]
                   for k in range(3) if k != fold)
        mine = pd.read_parquet(tmp_path / f"predict/fold_{fold}/val.parquet")
        rows = oof[oof["video_id"] == video].reset_index(drop=True)
        assert rows.equals(mine[mine["video_id"] == video].reset_index(drop=True))
    # with folds the temporal model learns from the out-of-fold predictions of every video
    train = pd.read_parquet(tmp_path / "ensemble/train.parquet")
    assert train.equals(oof)
    index = pd.read_parquet(tmp_path / "ensemble/frames.parquet")
    assert (index["split"] == "val").all() and len(index) == len(frames)


def test_metrics_say_what_each_fold_scores_out_of_fold(three_folds):
    tmp_path, _ = three_folds
    metrics = json.loads((tmp_path / "metrics/ensemble.json").read_text())
    frames = pd.read_parquet(tmp_path / "split/frames.parquet")
    assert set(metrics["members"]) == {"fold_0", "fold_1", "fold_2"}
    assert sum(m["frames"] for m in metrics["members"].values()) == metrics["oof"]["frames"] == len(frames)
    assert metrics["oof"]["videos"] == frames["video_id"].nunique()
    from sklearn.metrics import average_precision_score

    val = pd.read_parquet(tmp_path / "predict/fold_1/val.parquet").merge(frames, on=["video_id", "frame"],
                                                                          suffixes=("", ":true"))
    for label in LABELS:
        expected = metrics["members"]["fold_1"]["per_class_ap"][label]
        if val[f"{label}:true"].sum():
            assert expected == pytest.approx(average_precision_score(val[f"{label}:true"], val[label]), abs=1e-9)
        else:
            assert expected is None


def test_test_set_gets_every_folds_probabilities_fused(three_folds):
    tmp_path, _ = three_folds
    fused = pd.read_parquet(tmp_path / "ensemble/test.parquet")
    folds = [pd.read_parquet(tmp_path / f"predict_test/fold_{k}/test.parquet") for k in range(3)]
    assert len(fused) == len(pd.read_parquet(tmp_path / "index/test.parquet")) > 0
    for fold in folds:
        assert fold[["video_id", "frame"]].equals(fused[["video_id", "frame"]])
        assert not np.allclose(fold[list(LABELS)], folds[0][list(LABELS)]) or fold is folds[0]
    mean = sum(f[list(LABELS)].to_numpy(np.float64) for f in folds) / 3
    np.testing.assert_allclose(fused[list(LABELS)].to_numpy(), mean, rtol=1e-6)
    emb = [pd.read_parquet(tmp_path / f"predict_test/fold_{k}/test_embeddings.parquet") for k in range(3)]
    fused_emb = np.stack(pd.read_parquet(tmp_path / "ensemble/test_embeddings.parquet")["embedding"])
    np.testing.assert_allclose(fused_emb, sum(np.stack(e["embedding"]).astype(np.float32) for e in emb) / 3,
                               atol=2e-3)


@pytest.fixture(scope="module")
def downstream(three_folds):
    """temporal, thresholds, events and score on the fold ensemble (dvc.yaml's commands)."""
    tmp_path, args = three_folds
    params = yaml.safe_load((tmp_path / "params.yaml").read_text())
    params["temporal"].update(steps=5)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    redirect = {"--predict-dir": str(tmp_path / "ensemble"), "--frames": str(tmp_path / "ensemble/frames.parquet")}
    for name in ("temporal", "thresholds", "events", "score"):
        argv = list(args[name])
        for flag, value in redirect.items():
            if flag in argv:
                argv[argv.index(flag) + 1] = value
        assert load_stage(name).main(argv) == 0, name
    return tmp_path, args


def test_the_later_stages_run_on_the_fold_ensemble(downstream):
    tmp_path, _ = downstream
    submitted = json.loads((tmp_path / "events/val.json").read_text())
    frames = pd.read_parquet(tmp_path / "split/frames.parquet")
    assert {v["video_id"] for v in submitted["videos"]} == set(frames["video_id"])  # every labelled video scored
    assert json.loads((tmp_path / "metrics/temporal.json").read_text())["train_videos"] == frames["video_id"].nunique()
    assert json.loads((tmp_path / "metrics/temporal.json").read_text())["cross_fit"]["scheme"] == "folds"


def test_detect_on_one_exam_folder_gives_the_pipelines_events(downstream, tmp_path):
    root, args = downstream
    test = pd.read_parquet(root / "index/test.parquet")
    (video,) = test["video_id"].unique()
    exam = next((root / "demo/test").rglob(video))
    out = tmp_path / "events.json"
    argv = [str(exam), "--out", str(out), "--params", str(root / "params.yaml"),
            "--models", *[str(root / f"models/folds/{k}/model.pt") for k in range(3)],
            "--ensemble", str(root / "metrics/ensemble.json"), "--temporal", str(root / "models/temporal.pt"),
            "--thresholds", str(root / "models/thresholds.json")]
    assert json.loads((root / "models/thresholds.json").read_text())["probs"] == "auto"  # detect mixes as the stage did
    assert detect.main(argv + ["--clinical-out", str(tmp_path / "clinical.json"), "--viewer-dir", str(tmp_path / "viewer")]) == 0
    assert json.loads(out.read_text()) == json.loads((root / "events/submission.json").read_text())
    clinical = json.loads((tmp_path / "clinical.json").read_text())
    assert clinical == json.loads((root / "events/clinical_submission.json").read_text())
    counts = check_viewer(tmp_path / "viewer", {"exam": (json.loads(out.read_text()), clinical)})
    assert counts["events"] == sum(len(e["label"]) for v in json.loads(out.read_text())["videos"] for e in v["events"])
    # one model only: other probabilities, still a valid submission for that video
    assert detect.main(argv[:argv.index("--models") + 2] + argv[argv.index("--ensemble"):]) == 0
    assert [v["video_id"] for v in json.loads(out.read_text())["videos"]] == [video]


def test_predicting_with_a_model_that_saw_the_held_out_videos_is_refused(three_folds, tmp_path):
    root, args = three_folds
    argv = fold_argv(args, root, 1, model_fold=0)["predict"]
    argv[argv.index("--out-dir") + 1] = str(tmp_path / "out")
    with pytest.raises(DataError, match="trained on .* video\\(s\\) that fold 1 holds out"):
        load_stage("predict").main.__wrapped__(argv)


def test_a_video_predicted_by_two_folds_fails_the_coverage_check(three_folds, tmp_path):
    root, _ = three_folds
    frames = pd.read_parquet(root / "split/frames.parquet")
    dirs = {k: root / f"predict/fold_{k}" for k in range(3)}
    check_coverage(frames, dirs, 3)  # the real folds pass
    with pytest.raises(DataError, match="no out-of-fold prediction"):
        check_coverage(frames, {0: dirs[0], 1: dirs[1]}, 3)
    moved = frames.copy()
    moved.loc[moved["fold"] == 2, "fold"] = 1  # the index says fold 1 holds out fold 2's videos too
    with pytest.raises(DataError, match="split index has fold 1 hold out"):
        check_coverage(moved, dirs, 3)


def test_one_split_keeps_the_single_model_layout(tmp_path):
    args = run_folds(tmp_path, 1)
    split = pd.read_parquet(tmp_path / "split/frames.parquet")
    assert set(split.loc[split["split"] == "val", "fold"]) == {0} and set(split.loc[split["split"] == "train", "fold"]) == {-1}
    assert pd.read_parquet(tmp_path / "ensemble/frames.parquet").equals(split)
    for name in ("val", "test"):  # the fold-0 model's files, as predict wrote them before folds
        source = tmp_path / ("predict_test" if name == "test" else "predict") / f"fold_0/{name}.parquet"
        assert pd.read_parquet(tmp_path / f"ensemble/{name}.parquet").equals(pd.read_parquet(source)), name
    # predict.splits is [val]: the frame model's in-sample training probabilities are not predicted
    assert not (tmp_path / "ensemble/train.parquet").exists()
    # the default `--part all` writes both into one folder, as the pipeline did before folds
    argv = fold_argv(args, tmp_path, 0)["predict"]
    argv = [a for a in argv if a not in ("--part", "labelled")]
    argv[argv.index("--out-dir") + 1] = str(tmp_path / "all")
    argv += ["--test", str(tmp_path / "index/test.parquet"), "--held-out", str(tmp_path / "split/test.parquet")]
    assert load_stage("predict").main(argv) == 0
    assert {p.name for p in (tmp_path / "all").glob("*.parquet")} == {
        f"{s}{e}.parquet" for s in ("val", "test") for e in ("", "_embeddings")}


def test_folds_is_the_one_fold_key_and_must_be_0_to_k_minus_1():
    params = yaml.safe_load((ROOT / "params.yaml").read_text())["split"]
    three = from_dict(SplitParams, {**params, "folds": [0, 1, 2]}, "split")
    assert (three.folds, three.n_folds) == ([0, 1, 2], 3)
    for folds in ([1, 2], [0, 2], [1, 2, 0], [0, 0, 1]):
        with pytest.raises(ParamsError, match=r"^split\.folds = .*: must be the fold ids 0..k-1 in order"):
            from_dict(SplitParams, {**params, "folds": folds}, "split")
    with pytest.raises(ParamsError, match=r"^unknown key split\.n_folds"):
        from_dict(SplitParams, {**params, "n_folds": 3}, "split")


def test_fold_frames_names_the_missing_column_and_the_empty_fold():
    frames = pd.DataFrame({"video_id": ["a", "b"], "frame": [0, 0], "split": ["train", "val"]})
    with pytest.raises(DataError, match="no 'fold' column.*rerun the split stage"):
        fold_frames(frames, 0)
    frames["fold"] = [0, 1]
    assert fold_frames(frames, 1)["split"].tolist() == ["train", "val"]
    with pytest.raises(DataError, match="fold 2 holds out no video"):
        fold_frames(frames, 2)


def documented_detect_commands() -> list[str]:
    """Every `python -m vce.infer.detect …` command of the README and docs, as typed (backslash
    continuations joined), EXAM / EXAM_FOLDER standing for the exam folder."""
    import re

    commands = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text().replace("\\\n", " ")
        for found in re.finditer(r"python -m vce\.infer\.detect EXAM(?:_FOLDER)? --out [^`\n]*", text):
            commands.append(re.sub(r"\s+", " ", found.group(0)).strip())
    return sorted(set(commands))


def test_the_documented_detect_commands_run_as_typed_with_the_shipped_params(downstream, tmp_path):
    """Issue 48, BUG 2: the README's one-exam command ended in `RuntimeError: [...] imported before
    base.exact_cpu could apply` (torch at detect's top), untested because the tests called
    `detect.main(argv)` in process. Here each documented command runs in a shell, in a folder laid
    out as the repository (shipped params.yaml, models/, metrics/ensemble.json, data/demo/test/).
    Also BUG 1: a rerun replaces its own viewer, `--viewer-dir .` and a user's folder are refused."""
    import os
    import shutil
    import subprocess

    root, _ = downstream
    (video,) = pd.read_parquet(root / "index/test.parquet")["video_id"].unique()
    work = tmp_path / "repo"
    (work / "metrics").mkdir(parents=True)
    (work / "data/demo/test").mkdir(parents=True)
    shutil.copy(ROOT / "params.yaml", work / "params.yaml")  # the shipped params: base.exact_cpu true
    (work / "models").symlink_to(root / "models")
    (work / "metrics/ensemble.json").symlink_to(root / "metrics/ensemble.json")
    (work / "data/demo/test/ukdd_navi_00051").symlink_to(next((root / "demo/test").rglob(video)))
    commands = documented_detect_commands()
    assert len(commands) >= 3 and any("--viewer-dir" in c for c in commands), commands
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def shell(command: str):
        exam = command.replace(" EXAM_FOLDER ", " data/demo/test/ukdd_navi_00051 ").replace(" EXAM ", " data/demo/test/ukdd_navi_00051 ")
        return subprocess.run(exam, shell=True, cwd=work, env=env, capture_output=True, text=True, timeout=600)

    for command in commands + [commands[-1]]:  # the last one twice: a rerun replaces its own outputs
        run = shell(command)
        assert run.returncode == 0, (command, run.stderr[-2000:])
        out = work / command.split("--out ")[1].split()[0]
        assert [v["video_id"] for v in json.loads(out.read_text())["videos"]] == ["ukdd_navi_00051"]
        if "--viewer-dir" in command:
            assert (work / command.split("--viewer-dir ")[1].split()[0] / "index.html").is_file()
    (work / "mine").mkdir()
    (work / "mine/important.txt").write_text("a user's file")
    before = sorted(p.name for p in work.iterdir())
    for folder, said in ((".", "is the working folder"), ("mine", "was not written by this tool")):
        run = shell(f"python -m vce.infer.detect EXAM --out again.json --viewer-dir {folder}")
        assert run.returncode == 2 and said in run.stderr and "Traceback" not in run.stderr, run.stderr
    assert sorted(p.name for p in work.iterdir()) == before and (work / "mine/important.txt").read_text() == "a user's file"
