"""Bad and empty inputs through the stage entry points, on tiny generated tables
(docs/reliability.md): a user-caused failure is exit 2 and one line naming the file, key or row,
no traceback; empty is a valid input everywhere; an output set is all or nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import ROOT, load_stage
from test_engine_policies import _engine_json

from vce.core.contracts import write_probs
from vce.core.labels import LABELS


def write_tables(folder: Path, videos=("v1", "v2"), n: int = 40, test_videos=("t1",), test_n: int = 30) -> dict:
    """A labelled validation index with probabilities, and a test index with probabilities."""
    rows = [(v, i) for v in videos for i in range(n)]
    frames = pd.DataFrame({"video_id": pd.Series([v for v, _ in rows], dtype=str),
                           "frame": np.array([i * 5 for _, i in rows], np.int64),
                           "index": np.array([i for _, i in rows], np.int64),
                           "path": [f"{v}/{i}.png" for v, i in rows], "event_unit": "index", "capsule": "",
                           "split": "val"})
    for label in LABELS:
        frames[label] = np.uint8(0)
    frames["colon"] = np.uint8(1)
    frames.loc[frames["index"].between(10, 20), "blood"] = np.uint8(1)
    frames.to_parquet(folder / "frames.parquet", index=False)
    probs = frames[["video_id", "frame"]].copy()
    for label in LABELS:
        probs[label] = np.float32(0.6 if label == "colon" else 0.01)
    probs.loc[frames["blood"] == 1, "blood"] = np.float32(0.9)
    probs["valid"] = True
    write_probs(folder / "val.parquet", probs)
    test_rows = [(v, i) for v in test_videos for i in range(test_n)]
    test = pd.DataFrame({"video_id": pd.Series([v for v, _ in test_rows], dtype=str),
                         "frame": np.array([i for _, i in test_rows], np.int64),
                         "index": np.array([i for _, i in test_rows], np.int64),
                         "path": [f"{v}/{i}.png" for v, i in test_rows], "event_unit": "frame", "capsule": ""})
    test.to_parquet(folder / "test_frames.parquet", index=False)
    test_probs = test[["video_id", "frame"]].copy()
    for label in LABELS:
        test_probs[label] = np.float32(0.6 if label == "colon" else 0.01)
    test_probs["valid"] = True
    write_probs(folder / "test.parquet", test_probs)
    return {"frames": frames, "probs": probs}


def write_thresholds(folder: Path, engine: dict | None = None) -> Path:
    from vce.post.thresholds_file import thresholds_checksum

    path = folder / "thresholds.json"
    thresholds = {label: 0.5 for label in LABELS}
    checksum = {"thresholds_sha256": thresholds_checksum(thresholds)} if engine else {}
    path.write_text(json.dumps({"method": "engine" if engine else "f1", "probs": "frame", "thresholds": thresholds,
                                "events": None, "engine": engine, **checksum}))
    return path


def events_args(folder: Path) -> list[str]:
    return ["--params", str(ROOT / "params.yaml"), "--thresholds", str(folder / "thresholds.json"),
            "--val-probs", str(folder / "val.parquet"), "--test-probs", str(folder / "test.parquet"),
            "--frames", str(folder / "frames.parquet"), "--test-frames", str(folder / "test_frames.parquet"),
            "--held-out", "", "--out-dir", str(folder / "events")]


def run_stage(name: str, args: list[str]) -> subprocess.CompletedProcess:
    """`python -m stages.<name>` as DVC runs it."""
    return subprocess.run([sys.executable, "-m", f"stages.{name}", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def one_line_error(capsys, *named: str) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    for text in named:
        assert text in lines[0], (text, lines[0])
    return lines[0]


# ----------------------------------------------------------------------------- probabilities files

def _edit_val(folder: Path, edit) -> None:
    probs = pd.read_parquet(folder / "val.parquet")
    edit(probs).to_parquet(folder / "val.parquet", index=False)


@pytest.mark.parametrize(("edit", "named"), [
    (lambda p: p.assign(blood=np.where(p.index == 7, np.nan, p["blood"]).astype(np.float32)),
     ["'blood'", "valid row 7", "video v1 frame 35"]),
    (lambda p: p.assign(polyp=np.float32(np.inf)), ["'polyp'", "inf", "valid row 0"]),
    (lambda p: p.assign(ulcer=np.float32(-0.1)), ["'ulcer'", "valid row 0"]),
    (lambda p: p.assign(colon=np.float32(1.5)), ["'colon'", "1.5"]),
    (lambda p: p.drop(columns=["erythema"]), ["lack column(s) ['erythema']"]),
    (lambda p: p.assign(blood=p["blood"].astype(str)), ["'blood' has dtype"]),
    (lambda p: p.assign(frame=p["frame"].astype(np.float64)), ["'frame' has dtype"]),
    (lambda p: pd.concat([p, p.iloc[[3]]], ignore_index=True), ["video v1 frame 15 appears more than once"]),
])
def test_a_bad_probabilities_file_is_one_line_naming_it_before_any_output(tmp_path, capsys, edit, named):
    """Mutations killed: dropping the [0, 1] / finite check (NaN, inf, <0, >1 accepted), the column,
    dtype or duplicate-key check (a pandas MergeError traceback), or checking after writing."""
    write_tables(tmp_path)
    write_thresholds(tmp_path)
    _edit_val(tmp_path, edit)
    for stage, args in (("events", events_args(tmp_path)),
                        ("thresholds", ["--params", str(ROOT / "params.yaml"), "--probs", str(tmp_path / "val.parquet"),
                                        "--frames", str(tmp_path / "frames.parquet"),
                                        "--out", str(tmp_path / "out.json"), "--metrics", str(tmp_path / "m.json")])):
        assert load_stage(stage).main(args) == 2
        one_line_error(capsys, str(tmp_path / "val.parquet"), *named)
    assert not (tmp_path / "events").exists() and not (tmp_path / "out.json").exists()


def test_nan_on_an_invalid_row_is_a_gap_not_an_error(tmp_path):
    """predict writes NaN on undecodable frames (valid=false): that is the contract, not bad data."""
    write_tables(tmp_path)
    write_thresholds(tmp_path)
    _edit_val(tmp_path, lambda p: p.assign(valid=p.index != 3,
                                           blood=np.where(p.index == 3, np.nan, p["blood"]).astype(np.float32)))
    assert load_stage("events").main(events_args(tmp_path)) == 0


def test_a_file_that_is_not_parquet_is_one_line_in_a_subprocess(tmp_path):
    write_tables(tmp_path)
    write_thresholds(tmp_path)
    (tmp_path / "val.parquet").write_text("video_id,frame\nv1,0\n")
    result = run_stage("events", events_args(tmp_path))
    assert result.returncode == 2 and result.stderr.count("Traceback") == 0, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: {tmp_path / 'val.parquet'}: not a Parquet file")


def test_a_duplicate_frame_in_the_index_is_named_not_a_merge_error(tmp_path, capsys):
    tables = write_tables(tmp_path)
    frames = tables["frames"]
    pd.concat([frames, frames.iloc[[0]]], ignore_index=True).to_parquet(tmp_path / "frames.parquet", index=False)
    write_thresholds(tmp_path)
    assert load_stage("events").main(events_args(tmp_path)) == 2
    one_line_error(capsys, str(tmp_path / "frames.parquet"), "video v1 frame 0 appears more than once")


def test_embeddings_with_a_non_finite_vector_name_the_file_and_frame(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from vce.core.contracts import embeddings_schema
    from vce.core.errors import DataError
    from vce.infer.temporal import read_embeddings

    values = np.ones((3, 4), np.float16)
    values[2, 1] = np.inf
    table = pa.Table.from_arrays([pa.array(["v", "v", "v"]), pa.array([0, 1, 2], pa.int64()),
                                  pa.FixedSizeListArray.from_arrays(pa.array(values.ravel(), pa.float16()), 4)],
                                 schema=embeddings_schema(4))
    pq.write_table(table, tmp_path / "e.parquet")
    with pytest.raises(DataError, match=r"e.parquet: embedding of video v frame 2 \(row 2\) is not finite"):
        read_embeddings(tmp_path / "e.parquet")
    (tmp_path / "e.parquet").write_bytes(b"PAR1 no")
    with pytest.raises(DataError, match=r"e.parquet: not a Parquet file"):
        read_embeddings(tmp_path / "e.parquet")


# ----------------------------------------------------------------------------- model outputs, checkpoints

def _tiny_model():
    import torch
    import yaml

    from vce.core.labels import NUM_LABELS
    from vce.core.params import from_dict
    from vce.model.frame_model import ModelParams, create_model

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    torch.manual_seed(0)
    return create_model(from_dict(ModelParams, params["model"], "model"), torch.randn(NUM_LABELS, 64)).eval(), params


def test_a_model_that_outputs_nan_stops_predict_naming_the_checkpoint_and_frame(tmp_path, one_thread):
    """All-NaN weights: predict used to exit 0 with every probability NaN and valid=true."""
    import cv2
    import torch

    from vce.model import checkpoint

    model, params = _tiny_model()
    with torch.no_grad():
        for weight in model.parameters():
            weight.fill_(float("nan"))
    checkpoint.save_model(tmp_path / "model.pt", model, train_videos=["a"])
    (tmp_path / "frames").mkdir()
    for i in range(3):
        cv2.imwrite(str(tmp_path / "frames" / f"{i}.png"), np.full((16, 16, 3), 100, np.uint8))
    frames = pd.DataFrame({"video_id": "b", "frame": np.arange(3, dtype=np.int64), "index": np.arange(3),
                           "path": [f"frames/{i}.png" for i in range(3)], "event_unit": "index", "capsule": "",
                           "split": "val", "fold": 0, **{label: np.uint8(0) for label in LABELS}})
    frames.to_parquet(tmp_path / "split.parquet", index=False)
    params["data"].update(root=str(tmp_path), test_root=None)
    params["split"]["folds"] = [0]
    params["predict"].update(num_workers=0, batch_size=2, bf16=False, embeddings=False, splits=["val"])
    (tmp_path / "params.yaml").write_text(json.dumps(params))
    frames.iloc[:0][["video_id", "frame", "index", "path", "event_unit", "capsule"]].to_parquet(
        tmp_path / "test.parquet", index=False)
    args = ["--params", str(tmp_path / "params.yaml"), "--part", "labelled", "--model", str(tmp_path / "model.pt"),
            "--frames", str(tmp_path / "split.parquet"), "--test", str(tmp_path / "test.parquet"),
            "--cache", str(tmp_path / "no_cache"), "--out-dir", str(tmp_path / "predict"),
            "--report", str(tmp_path / "predict.json")]
    result = run_stage("predict", args)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"error: {tmp_path / 'model.pt'}: the model output NaN/inf" in result.stderr
    assert "first video b frame 0" in result.stderr
    assert not (tmp_path / "predict" / "val.parquet").exists() and not (tmp_path / "predict.json").exists()


@pytest.mark.parametrize("damage", ["missing_key", "wrong_shape", "no_arch"])
def test_a_checkpoint_of_another_architecture_is_one_line_naming_it(tmp_path, damage):
    import torch

    from vce.model import checkpoint

    model, _ = _tiny_model()
    checkpoint.save_model(tmp_path / "model.pt", model, train_videos=["a"])
    payload = torch.load(tmp_path / "model.pt", weights_only=True)
    name = next(iter(payload["state_dict"]))
    if damage == "missing_key":
        del payload["state_dict"][name]
    elif damage == "wrong_shape":
        payload["state_dict"][name] = torch.zeros(3, 3, 3)
    else:
        del payload["arch"]
    torch.save(payload, tmp_path / "model.pt")
    with pytest.raises(checkpoint.CheckpointError) as err:
        checkpoint.load_model(tmp_path / "model.pt")
    message = str(err.value)
    assert message.startswith(f"{tmp_path / 'model.pt'}: ") and "\n" not in message, message


class _RunsCode:
    def __reduce__(self):
        import os

        return (os.getpid, ())


def test_a_prompts_file_holding_code_is_one_line_without_torchs_advice(tmp_path):
    import torch

    from vce.core.errors import DataError
    from vce.model.prompts import load_prompt_embeddings

    torch.save({"labels": list(LABELS), "embeddings": _RunsCode()}, tmp_path / "prompts.pt")
    with pytest.raises(DataError) as err:
        load_prompt_embeddings(tmp_path / "prompts.pt")
    message = str(err.value)
    assert str(tmp_path / "prompts.pt") in message and "could run code" in message
    assert "weights_only" not in message and "\n" not in message


# ----------------------------------------------------------------------------- empty inputs

@pytest.mark.parametrize("engine", [False, True])
@pytest.mark.parametrize("test_n", [0, 30])
@pytest.mark.parametrize("invalid", [False, True])
def test_empty_test_sets_and_all_invalid_frames_through_the_events_stage(tmp_path, engine, test_n, invalid):
    """`data.test_root: null` / a 0-row test table with an `ar` policy using `ar_levels` crashed
    in vce/post/arhmm.py (zero-size minimum); every detector of the engine is exercised here
    (head, region, anchored, ar runs with levels, threshold runs, shadow)."""
    write_tables(tmp_path, test_videos=("t1",) if test_n else (), test_n=test_n)
    if invalid:  # zero valid frames: every test frame undecodable
        test = pd.read_parquet(tmp_path / "test.parquet")
        test[list(LABELS)] = np.float32(np.nan)
        write_probs(tmp_path / "test.parquet", test.assign(valid=False))
    write_thresholds(tmp_path, _engine_json() if engine else None)
    assert load_stage("events").main(events_args(tmp_path)) == 0
    submission = json.loads((tmp_path / "events" / "submission.json").read_text())
    expected = [{"video_id": "t1", "events": []}] if test_n and invalid else None
    if not test_n:
        assert submission == {"videos": []}
    elif expected:
        assert submission["videos"] == expected
    assert len(pd.read_excel(tmp_path / "events" / "submission.xlsx")) == sum(
        len(v["events"]) for v in submission["videos"])


def test_nan_engine_coefficients_are_one_line_naming_the_file_and_key(tmp_path, capsys):
    """They made `monotone_path` recurse until RecursionError (no finite path score)."""
    write_tables(tmp_path)
    engine = _engine_json()
    engine["coef"][2][3] = float("nan")
    write_thresholds(tmp_path, engine)
    assert load_stage("events").main(events_args(tmp_path)) == 2
    one_line_error(capsys, f"{tmp_path / 'thresholds.json'}:engine.coef: not finite")
    engine["coef"] = [[1.0]]
    write_thresholds(tmp_path, engine)
    assert load_stage("events").main(events_args(tmp_path)) == 2
    one_line_error(capsys, "engine.coef: shape (1, 1), expected (5, 5)")


def test_monotone_path_without_a_finite_score_is_an_error_not_a_recursion():
    from vce.core.errors import DataError
    from vce.post.anatomy import monotone_path

    with pytest.raises(DataError, match="no path has a finite score"):
        monotone_path(np.full((4, 5), np.nan), 0.3, min_durations=[2] * 5)


# ----------------------------------------------------------------------------- thresholds under the engine

@pytest.mark.parametrize("edit", ["edited", "no_checksum"])
def test_under_the_engine_an_edited_threshold_is_refused_naming_the_file(tmp_path, capsys, edit):
    """The engine ignores the per-label thresholds: a hand edit used to change nothing, silently.
    Mutation killed: not checking the stored checksum (or not writing it)."""
    write_tables(tmp_path)
    path = write_thresholds(tmp_path, _engine_json())
    assert load_stage("events").main(events_args(tmp_path)) == 0
    saved = json.loads(path.read_text())
    if edit == "edited":
        saved["thresholds"]["blood"] = 0.2
    else:
        del saved["thresholds_sha256"]
    path.write_text(json.dumps(saved))
    before = {p.name: p.read_bytes() for p in (tmp_path / "events").iterdir()}
    assert load_stage("events").main(events_args(tmp_path)) == 2
    one_line_error(capsys, str(path), "edited" if edit == "edited" else "thresholds_sha256")
    assert {p.name: p.read_bytes() for p in (tmp_path / "events").iterdir()} == before


def test_the_thresholds_stage_writes_the_checksum_only_under_the_engine(tmp_path):
    import yaml

    from vce.post.thresholds_file import thresholds_checksum

    write_tables(tmp_path)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["post"]["probs"] = "frame"
    params["thresholds"]["method"] = "f1"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    args = ["--params", str(tmp_path / "params.yaml"), "--probs", str(tmp_path / "val.parquet"),
            "--frames", str(tmp_path / "frames.parquet"), "--out", str(tmp_path / "out.json"),
            "--metrics", str(tmp_path / "m.json")]
    assert load_stage("thresholds").main(args) == 0
    assert "thresholds_sha256" not in json.loads((tmp_path / "out.json").read_text())
    from vce.core.errors import DataError
    from vce.post.thresholds_file import check_saved

    thresholds = {label: 0.5 for label in LABELS}
    saved = {"method": "engine", "probs": "frame", "thresholds": thresholds, "events": None, "engine": {"coef": []}}
    with pytest.raises(DataError, match="thresholds_sha256"):
        check_saved(saved, "t.json")
    check_saved({**saved, "thresholds_sha256": thresholds_checksum(thresholds)}, "t.json")


def test_a_stage_whose_stdout_reader_stops_finishes_its_outputs_quietly(tmp_path):
    """The runner's stdout survives `| head`: the summary line is lost, the outputs are not."""
    write_tables(tmp_path)
    write_thresholds(tmp_path)
    process = subprocess.Popen([sys.executable, "-m", "stages.events", *events_args(tmp_path)], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    process.stdout.close()
    err = process.stderr.read()
    assert process.wait(timeout=300) == 0 and "Traceback" not in err and "Broken pipe" not in err, err
    assert json.loads((tmp_path / "events" / "submission.json").read_text())["videos"]


# ----------------------------------------------------------------------------- full disk at every write

def _snapshot(*folders: Path) -> dict:
    """Every file under `folders` (temporaries included) → its bytes."""
    return {str(p): p.read_bytes() for folder in folders for p in sorted(folder.rglob("*")) if p.is_file()}


def _disk_full_at(monkeypatch, k: int) -> dict:
    """Fake ENOSPC at the k-th output completed through `vce.core.io` (k = 0: never); counts them."""
    import errno

    from vce.core import io

    calls = {"n": 0}
    real = io._complete

    def complete(tmp, path):
        calls["n"] += 1
        if calls["n"] == k:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(tmp, path)

    monkeypatch.setattr(io, "_complete", complete)
    return calls


def check_all_or_nothing(monkeypatch, capsys, run, change, folders: list[Path], least: int = 2) -> int:
    """Run once; change the inputs; then with a full disk at each write k = 1..n the stage exits 2
    with one line naming an output and no traceback, and the first run's files survive byte for
    byte (no temporary left); without the fault the changed inputs do change the outputs.
    `least`: the fewest writes the stage makes (1 for a stage of one file or folder).
    Mutations killed: publishing each file as it is written (a half-updated set), removing no
    temporary, a disk-full error that names no file."""
    calls = _disk_full_at(monkeypatch, 0)
    assert run() == 0
    writes = calls["n"]
    assert writes >= least
    capsys.readouterr()
    before = _snapshot(*folders)
    change()
    for k in range(1, writes + 1):
        _disk_full_at(monkeypatch, k)
        assert run() == 2, f"write {k} of {writes}"
        line = one_line_error(capsys, "No space left on device", "cannot write ")
        assert str(folders[0].parent) in line, line
        assert _snapshot(*folders) == before, f"a full disk at write {k} of {writes} changed the outputs"
    calls = _disk_full_at(monkeypatch, 0)
    assert run() == 0 and calls["n"] == writes
    assert _snapshot(*folders) != before, "the change must show in the outputs, or the test proves nothing"
    return writes


def test_events_outputs_are_all_or_nothing_under_a_full_disk(tmp_path, monkeypatch, capsys):
    write_tables(tmp_path)
    write_thresholds(tmp_path)

    def change():
        test = pd.read_parquet(tmp_path / "test.parquet")
        test.loc[test["frame"].between(5, 15), "blood"] = np.float32(0.95)
        write_probs(tmp_path / "test.parquet", test)

    writes = check_all_or_nothing(monkeypatch, capsys, lambda: load_stage("events").main(events_args(tmp_path)),
                                  change, [tmp_path / "events"])
    assert writes == 6  # val and submission: .json, clinical .json, .xlsx


def test_thresholds_outputs_are_all_or_nothing_under_a_full_disk(tmp_path, monkeypatch, capsys):
    import yaml

    write_tables(tmp_path)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["post"]["probs"] = "frame"
    params["thresholds"]["method"] = "f1"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    (tmp_path / "out").mkdir()
    args = ["--params", str(tmp_path / "params.yaml"), "--probs", str(tmp_path / "val.parquet"),
            "--frames", str(tmp_path / "frames.parquet"), "--out", str(tmp_path / "out/thresholds.json"),
            "--metrics", str(tmp_path / "out/metrics.json")]
    change = lambda: _edit_val(tmp_path, lambda p: p.assign(  # noqa: E731
        blood=np.where(p.index % 7 == 0, np.maximum(p["blood"], 0.5), p["blood"]).astype(np.float32)))  # a new threshold
    assert check_all_or_nothing(monkeypatch, capsys, lambda: load_stage("thresholds").main(args), change,
                                [tmp_path / "out"]) == 2


def test_index_outputs_are_all_or_nothing_under_a_full_disk(tmp_path, monkeypatch, capsys):
    import yaml
    from conftest import tiny_params

    params = tiny_params(tmp_path)
    params["demo"].update(n_videos=2, frames_per_video=100, n_test_videos=1, test_frames_per_video=100, image_size=16)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    assert load_stage("demo_data").main(["--params", str(tmp_path / "params.yaml"), "--out", str(tmp_path / "demo")]) == 0
    (tmp_path / "index").mkdir()
    args = ["--params", str(tmp_path / "params.yaml"), "--frames-out", str(tmp_path / "index/frames.parquet"),
            "--test-out", str(tmp_path / "index/test.parquet"), "--report", str(tmp_path / "index/report.json")]
    change = lambda: next((tmp_path / "demo" / "test").rglob("*.png")).unlink()  # noqa: E731
    assert check_all_or_nothing(monkeypatch, capsys, lambda: load_stage("index").main(args), change,
                                [tmp_path / "index"]) == 3


def test_predict_outputs_are_all_or_nothing_under_a_full_disk(tmp_path, monkeypatch, capsys, one_thread):
    import cv2
    import torch

    from vce.model import checkpoint

    model, params = _tiny_model()
    checkpoint.save_model(tmp_path / "model.pt", model, train_videos=["a"])
    for folder, video in (("galar", "b"), ("test", "t")):
        (tmp_path / folder / video).mkdir(parents=True)
        for i in range(3):
            cv2.imwrite(str(tmp_path / folder / video / f"{i}.png"), np.full((16, 16, 3), 60 * i, np.uint8))
    frames = pd.DataFrame({"video_id": "b", "frame": np.arange(3, dtype=np.int64), "index": np.arange(3),
                           "path": [f"b/{i}.png" for i in range(3)], "event_unit": "index", "capsule": "",
                           "split": "val", "fold": 0, **{label: np.uint8(0) for label in LABELS}})
    frames.to_parquet(tmp_path / "split.parquet", index=False)
    frames.assign(video_id="t", path=[f"t/{i}.png" for i in range(3)], event_unit="frame")[
        ["video_id", "frame", "index", "path", "event_unit", "capsule"]].to_parquet(tmp_path / "test.parquet",
                                                                                   index=False)
    params["data"].update(root=str(tmp_path / "galar"), test_root=str(tmp_path / "test"))
    params["split"]["folds"] = [0]
    params["predict"].update(num_workers=0, batch_size=2, bf16=False, embeddings=True, splits=["val"])
    (tmp_path / "params.yaml").write_text(json.dumps(params))
    (tmp_path / "out").mkdir()
    args = ["--params", str(tmp_path / "params.yaml"), "--part", "all", "--model", str(tmp_path / "model.pt"),
            "--frames", str(tmp_path / "split.parquet"), "--test", str(tmp_path / "test.parquet"), "--held-out", "",
            "--cache", str(tmp_path / "no_cache"), "--out-dir", str(tmp_path / "out/predict"),
            "--report", str(tmp_path / "out/predict.json")]

    def change():
        other, _ = _tiny_model()
        with torch.no_grad():
            for weight in other.parameters():
                weight.mul_(0.5)
        checkpoint.save_model(tmp_path / "model.pt", other, train_videos=["a"])

    # val and test probabilities and embeddings, coverage.json, the report
    assert check_all_or_nothing(monkeypatch, capsys, lambda: load_stage("predict").main(args), change,
                                [tmp_path / "out"]) == 6


def test_a_temporal_model_file_of_another_version_is_one_line_naming_it(tmp_path):
    from vce.core.errors import DataError
    from vce.infer.temporal import load_temporal
    from vce.model import checkpoint

    checkpoint.save(tmp_path / "temporal.pt", {"enabled": True, "embed_dim": 8, "params": {}, "state_dict": {}})
    with pytest.raises(DataError, match=rf"^{tmp_path / 'temporal.pt'}: not a temporal model this version loads"):
        load_temporal(tmp_path / "temporal.pt")


# ----------------------------------------------------------------------------- issue 48: no video vanishes

@pytest.mark.parametrize("cut,named", [
    ("video", "video t2 every frame (30 row(s))"),
    ("frames", "video t1 frame(s) 10-29 (20 row(s))"),
    ("all", "video t1 every frame (30 row(s))"),
])
def test_test_probabilities_lacking_a_video_or_frames_stop_the_events_stage_naming_them(tmp_path, capsys, cut, named):
    """Issue 48, BUG 3: probabilities lacking a test video (or frames 301-648, or every row)
    gave a submission without it (or events stopping at 300), exit 0. Mutation killed: not
    checking the index's rows (exit 0, t2 absent from submission.json)."""
    write_tables(tmp_path, test_videos=("t1", "t2"))
    write_thresholds(tmp_path)
    assert load_stage("events").main(events_args(tmp_path)) == 0
    before = {p.name: p.read_bytes() for p in (tmp_path / "events").iterdir()}
    assert [v["video_id"] for v in json.loads(before["submission.json"])["videos"]] == ["t1", "t2"]
    probs = pd.read_parquet(tmp_path / "test.parquet")
    keep = {"video": probs["video_id"] != "t2", "frames": ~((probs["video_id"] == "t1") & (probs["frame"] >= 10)),
            "all": probs["frame"] < 0}[cut]
    write_probs(tmp_path / "test.parquet", probs[keep].reset_index(drop=True))
    assert load_stage("events").main(events_args(tmp_path)) == 2
    one_line_error(capsys, str(tmp_path / "test.parquet"), named, "rerun predict_test")
    assert {p.name: p.read_bytes() for p in (tmp_path / "events").iterdir()} == before


def test_events_never_end_past_a_videos_last_frame():
    """Issue 48, BUG 4: a 1-frame video got an event 0-44 (the demo's engine; 0-3 in the issue's
    run), a long one events past its end: a run reached into the separator after the video.
    Mutation killed: not clipping (the 1-frame video's event ends at 44)."""
    from conftest import section_params

    from vce.post.engine import Engine, engine_submission
    from vce.post.events import EventParams, probs_to_submission
    from vce.post.runs import clip_to_videos
    from vce.post.timeline import build_timeline

    engine = Engine.from_dict(json.loads((ROOT / "tests/golden/demo_engine.json").read_text()), "demo_engine")
    rng = np.random.default_rng(0)
    lengths = {"one": 1, "long": 2000}
    probs = pd.DataFrame([(v, t) for v, n in lengths.items() for t in range(n)], columns=["video_id", "t"])
    for label in LABELS:
        probs[label] = (rng.random(len(probs)) * 0.3).astype(np.float32)
    probs["small intestine"] = np.float32(0.9)
    probs.loc[probs["video_id"] == "long", "colon"] = np.linspace(0, 1, 2000, dtype=np.float32)
    probs["valid"] = True
    params = section_params(EventParams, "events", median_window=9, fill_gap=8)
    ranked, clinical = engine_submission(probs, engine)
    assert all(video["events"] for video in ranked["videos"])  # the 1-frame video's events too
    for submission in (ranked, clinical, probs_to_submission(probs, {label: 0.5 for label in LABELS}, params)):
        assert {v["video_id"] for v in submission["videos"]} == set(lengths)
        for video in submission["videos"]:
            assert all(0 <= e["start"] <= e["end"] <= lengths[video["video_id"]] - 1 for e in video["events"]), video
    timeline = build_timeline(probs, max_reach=4)
    clipped = clip_to_videos(timeline, {"videos": [{"video_id": "one", "events": [{"start": 0, "end": 3, "label": ["colon"]}]},
                                                   {"video_id": "long", "events": [{"start": 1999, "end": 2004, "label": ["colon"]},
                                                                                   {"start": 2001, "end": 2004, "label": ["ulcer"]}]}]})
    assert clipped["videos"] == [{"video_id": "one", "events": [{"start": 0, "end": 0, "label": ["colon"]}]},
                                 {"video_id": "long", "events": [{"start": 1999, "end": 1999, "label": ["colon"]}]}]


@pytest.mark.parametrize("method,edit,named", [
    ("engine", {"engine": None}, "method engine needs its 'engine' block, which is missing"),
    ("map", {"events": None}, "method map needs its 'events' block, which is missing"),
    ("f1", {"engine": {"coef": []}}, "method f1 with an 'engine' block"),
    ("f1", {"method": "magic"}, "method 'magic'"),
    ("f1", {"thresholds": {label: 0.5 for label in LABELS if label != "ulcer"}}, "thresholds lack label(s) ['ulcer']"),
])
def test_a_thresholds_file_whose_method_lacks_its_block_is_refused(tmp_path, capsys, method, edit, named):
    """Issue 48, BUG 5: `method: engine` with its engine block deleted decoded with plain
    thresholds, exit 0 (7 events instead of 78); WEAK: `thresholds lack label(s) ['ulcer']`
    named no file. Mutation killed: not checking the block (exit 0)."""
    write_tables(tmp_path)
    path = write_thresholds(tmp_path, _engine_json() if method == "engine" else None)
    saved = json.loads(path.read_text())
    if method == "map":
        saved["method"] = "map"
    path.write_text(json.dumps({**saved, **edit}))
    assert load_stage("events").main(events_args(tmp_path)) == 2
    one_line_error(capsys, str(path), named)
    assert not (tmp_path / "events").exists()
