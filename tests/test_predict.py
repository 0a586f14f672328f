"""The predict stage: the probabilities contract, undecodable frames, embeddings, atomic output, torchrun."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from conftest import ROOT, load_stage, prepare_demo, repo_params

from vce.core.labels import LABELS
from vce.infer.predict import PredictParams, shard_by_video


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("predict")
    args = prepare_demo(tmp_path, train={"epochs": 1, "samples_per_epoch": 64})
    assert load_stage("train").main(args["train"]) == 0
    return tmp_path, args


def predict_argv(args, out_dir, report):
    argv = list(args["predict"])
    argv[argv.index("--out-dir") + 1] = str(out_dir)
    argv[argv.index("--report") + 1] = str(report)
    return argv


def test_undecodable_frame_gets_an_invalid_row_not_a_dropped_one(trained):
    tmp_path, args = trained
    frames = pd.read_parquet(tmp_path / "split/frames.parquet")
    victim = frames[frames["split"] == "val"].iloc[5]
    frame_file = tmp_path / "demo" / "galar" / victim["path"]
    original = frame_file.read_bytes()
    frame_file.write_bytes(original[: len(original) // 2])  # truncated PNG
    try:
        out = tmp_path / "predict_bad"
        assert load_stage("predict").main(predict_argv(args, out, tmp_path / "predict_bad.json")) == 0
    finally:
        frame_file.write_bytes(original)
    probs = pd.read_parquet(out / "val.parquet")
    assert len(probs) == (frames["split"] == "val").sum()
    row = probs[(probs["video_id"] == victim["video_id"]) & (probs["frame"] == victim["frame"])].iloc[0]
    assert not row["valid"] and np.isnan(row[list(LABELS)].astype(float)).all()
    assert probs["valid"].sum() == len(probs) - 1
    report = json.loads((tmp_path / "predict_bad.json").read_text())
    assert report["val"]["invalid_frames"] == 1 and report["val"]["invalid_examples"] == [victim["path"]]


def test_embeddings_are_keyed_like_the_probabilities(trained):
    tmp_path, args = trained
    out = tmp_path / "predict_emb"
    assert load_stage("predict").main(predict_argv(args, out, tmp_path / "p.json")) == 0
    for split in ("val", "test"):  # predict.splits [val]: no in-sample train probabilities
        probs = pd.read_parquet(out / f"{split}.parquet")
        table = pq.read_table(out / f"{split}_embeddings.parquet")
        kind = table.schema.field("embedding").type
        assert kind.list_size == 64 and str(kind.value_type) == "halffloat"
        embeddings = table.to_pandas()
        assert embeddings[["video_id", "frame"]].equals(probs[["video_id", "frame"]])


def test_no_partial_output_after_a_kill(trained, tmp_path):
    _, args = trained
    out = tmp_path / "killed"
    argv = predict_argv(args, out, tmp_path / "p.json")
    argv[argv.index("--params") + 1] = str(slow_params(trained[0], tmp_path))
    process = subprocess.Popen([sys.executable, "-m", "stages.predict", *argv],
                               env={**os.environ, "CI": "1"}, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    while time.time() < deadline and not list(out.glob(".*.tmp")):  # mid-write
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL, "predict ended before it could be killed"
    leftovers = sorted(p.name for p in out.glob("*"))
    assert leftovers and not [name for name in leftovers if not name.startswith(".")], leftovers
    # The rerun completes and clears the dead run's temporary files.
    argv[argv.index("--params") + 1] = str(trained[0] / "params.yaml")
    assert load_stage("predict").main(argv) == 0
    assert sorted(p.name for p in out.glob(".*")) == []


def slow_params(demo_path, tmp_path):
    """Batches of one frame: predict takes long enough to be killed mid-video."""
    import yaml

    params = yaml.safe_load((demo_path / "params.yaml").read_text())
    params["predict"].update(batch_size=1, row_group_frames=1)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def test_torchrun_two_processes_write_the_same_file(trained):
    tmp_path, args = trained
    single, sharded = tmp_path / "single", tmp_path / "sharded"
    assert load_stage("predict").main(predict_argv(args, single, tmp_path / "s.json")) == 0
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29533",
               "-m", "stages.predict", *predict_argv(args, sharded, tmp_path / "d.json")]
    result = subprocess.run(command, env={**os.environ, "CI": "1", "OMP_NUM_THREADS": "1"},
                            capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    for split in ("val", "test"):
        one, two = pd.read_parquet(single / f"{split}.parquet"), pd.read_parquet(sharded / f"{split}.parquet")
        assert one[["video_id", "frame", "valid"]].equals(two[["video_id", "frame", "valid"]])
        np.testing.assert_allclose(one[list(LABELS)], two[list(LABELS)], atol=1e-5)
    assert not list(sharded.glob("*.part*")), "rank parts are merged and removed"


def test_shard_by_video_keeps_whole_videos_in_order():
    frames = pd.DataFrame({"video_id": ["a"] * 5 + ["b"] * 1 + ["c"] * 4, "frame": range(10)})
    parts = [shard_by_video(frames, rank, 2) for rank in range(2)]
    assert pd.concat(parts).equals(frames)
    assert set(parts[0]["video_id"]).isdisjoint(parts[1]["video_id"])


def test_predict_params_reject_unknown_split():
    from vce.core.params import ParamsError, from_dict

    with pytest.raises(ParamsError, match=r"^predict.splits\[0\] = 'tset': must be one of 'train' or 'val'$"):
        from_dict(PredictParams, {**repo_params()["predict"], "splits": ["tset"]}, "predict")
