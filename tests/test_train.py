"""The train stage: resume after a kill, extending epochs, DDP on CPU, checkpoints, bad params."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from conftest import ROOT, prepare_demo, repo_params

from vce.core.params import ParamsError, from_dict
from vce.model import checkpoint
from vce.train.trainer import TrainParams

# Fast, deterministic and comparable across process counts: no dropout, no mixup.
OVERRIDES = {"train": {"epochs": 3, "mixup_alpha": 0.0, "checkpoint_every": 2}, "model": {"dropout": 0.0}}


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("train")
    return tmp_path, prepare_demo(tmp_path, **OVERRIDES)


def train_argv(args, out: Path) -> list[str]:
    """The train stage's arguments with its outputs redirected under `out`."""
    argv = list(args["train"])
    for flag, name in (("--model-out", "model.pt"), ("--state-dir", "state"), ("--metrics", "train.json"),
                       ("--live-dir", "live")):
        argv[argv.index(flag) + 1] = str(out / name)
    return argv


def run_train(argv, env=None, nproc: int = 1) -> subprocess.Popen:
    command = [sys.executable, "-m", "stages.train", *argv]
    if nproc > 1:
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
                   "--master_port", "29531", "-m", "stages.train", *argv]
    return subprocess.Popen(command, env={**os.environ, "CI": "1", "OMP_NUM_THREADS": "1", **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)


def finish(process: subprocess.Popen) -> str:
    output, _ = process.communicate(timeout=600)
    assert process.returncode == 0, output
    return output


@pytest.fixture(scope="module")
def uninterrupted(demo):
    tmp_path, args = demo
    out = tmp_path / "uninterrupted"
    finish(run_train(train_argv(args, out)))
    return out


def test_killed_run_resumes_to_the_same_metrics(demo, uninterrupted):
    tmp_path, args = demo
    out = tmp_path / "killed"
    argv = train_argv(args, out)
    state = out / "state" / "last.pt"
    for kill_after_steps in (2, 6):  # kill twice, mid-epoch and after an epoch boundary
        process = run_train(argv)
        deadline = time.time() + 300
        while time.time() < deadline and process.poll() is None:
            if state.is_file() and _saved_steps(state) >= kill_after_steps:
                process.send_signal(signal.SIGKILL)
                break
            time.sleep(0.05)
        process.wait(timeout=60)
        assert process.returncode == -signal.SIGKILL, "the run ended before it could be killed"
        assert not (out / "train.json").exists(), "a killed run must not leave its metrics"
    output = finish(run_train(argv))
    assert "resuming from" in output
    resumed = json.loads((out / "train.json").read_text())
    clean = json.loads((uninterrupted / "train.json").read_text())
    for key in ("best", "final"):
        assert resumed[key] == clean[key]
    resumed_model = checkpoint.load(out / "model.pt")["state_dict"]
    clean_model = checkpoint.load(uninterrupted / "model.pt")["state_dict"]
    assert all(torch.equal(resumed_model[k], clean_model[k]) for k in clean_model)
    curve = pd.read_csv(out / "live/plots/metrics/val/map.tsv", sep="\t")
    assert list(curve["step"]) == [0, 1, 2], "resumed curves hold every epoch once"


def _saved_steps(state: Path) -> int:
    try:
        saved = checkpoint.load(state)
    except Exception:  # being written right now
        return -1
    return saved["epoch"] * 1000 + saved["step"] if saved["epoch"] else saved["step"]


def rerun_with_epochs(demo, uninterrupted, name: str, epochs: int, extend: bool = False) -> tuple[Path, str]:
    """Copy the finished 3-epoch run's outputs and state, then train again with `epochs`."""
    tmp_path, args = demo
    out = tmp_path / name
    shutil.copytree(uninterrupted, out)
    params = yaml.safe_load((tmp_path / "params.yaml").read_text())
    params["train"].update(epochs=epochs, extend=extend)
    (out / "params.yaml").write_text(yaml.safe_dump(params))
    argv = train_argv(args, out)
    argv[argv.index("--params") + 1] = str(out / "params.yaml")
    return out, finish(run_train(argv))


def test_more_epochs_resume_a_finished_run_with_train_extend(demo, uninterrupted):
    out, output = rerun_with_epochs(demo, uninterrupted, "extended", 4, extend=True)
    assert "resuming from" in output and "extending the finished 3-epoch run" in output and "epoch 4" in output
    metrics = json.loads((out / "train.json").read_text())
    assert metrics["epochs"] == 4 and metrics["final"]["epoch"] == 4


def test_ddp_two_processes_match_one(demo, uninterrupted):
    """torchrun, 2 gloo processes, each half of every batch: same result within float tolerance."""
    tmp_path, args = demo
    out = tmp_path / "ddp"
    finish(run_train(train_argv(args, out), nproc=2))
    ddp = json.loads((out / "train.json").read_text())
    single = json.loads((uninterrupted / "train.json").read_text())
    for key in ("train_loss", "val_loss"):
        assert ddp["final"][key] == pytest.approx(single["final"][key], rel=1e-3)
    assert ddp["final"]["val_map"] == pytest.approx(single["final"]["val_map"], abs=0.02)


def test_checkpoints_load_with_weights_only(uninterrupted):
    state = torch.load(uninterrupted / "state" / "last.pt", weights_only=True)
    assert state["epoch"] == 3 and len(state["history"]) == 3
    model = torch.load(uninterrupted / "model.pt", weights_only=True)
    assert set(model) >= {"arch", "state_dict", "labels"}


@pytest.mark.parametrize("key,value,message", [
    ("epochs", 0, "train.epochs = 0: must be >= 1"),
    ("lr_head", -1.0, "train.lr_head = -1.0: must be > 0"),
    ("lr_head", float("inf"), "train.lr_head = inf: must be a finite number"),
    ("device", "tpu", "train.device = 'tpu': must be one of 'auto', 'cpu' or 'cuda'"),
    ("epoch", 3, "unknown key train.epoch; known keys: ["),
])
def test_bad_train_params_name_the_key(key, value, message):
    with pytest.raises(ParamsError) as err:
        from_dict(TrainParams, {**repo_params()["train"], key: value}, "train")
    assert message in str(err.value)


def test_train_stage_reports_bad_params_without_traceback(demo, tmp_path):
    demo_path, args = demo
    params = yaml.safe_load((demo_path / "params.yaml").read_text())
    params["train"]["epochs"] = 0
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    argv = train_argv(args, tmp_path)
    argv[argv.index("--params") + 1] = str(tmp_path / "params.yaml")
    process = run_train(argv)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 2
    assert output.strip().splitlines()[-1] == "error: train.epochs = 0: must be >= 1"
    assert not (tmp_path / "model.pt").exists()


def test_fewer_epochs_than_the_saved_run_start_fresh(demo, uninterrupted):
    """`dvc exp run -S train.epochs=1` after a 3-epoch run trains 1 epoch, not reuse the 3."""
    out, output = rerun_with_epochs(demo, uninterrupted, "fewer", 1)
    assert "train.epochs is 1" in output
    metrics = json.loads((out / "train.json").read_text())
    assert metrics["epochs"] == 1 and "resuming from" not in output


def test_freeze_backbone_trains_the_heads_only_and_the_model_predicts(demo, tmp_path):
    """`train.freeze_backbone: true` (linear probe) through the stage: every `visual.*` weight is
    bit-identical to the seeded initial model after an epoch of steps, the heads moved, and the
    saved model runs through predict."""
    from conftest import load_stage

    from vce.model.frame_model import ModelParams, create_model
    from vce.model.prompts import load_prompt_embeddings

    demo_path, args = demo
    params = yaml.safe_load((demo_path / "params.yaml").read_text())
    params["train"].update(freeze_backbone=True, epochs=1)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    embed = list(args["embed"])
    embed[embed.index("--params") + 1] = str(tmp_path / "params.yaml")
    embed[embed.index("--out") + 1] = str(tmp_path / "embed")
    assert load_stage("embed").main(embed) == 0  # the frozen tower's features, once (tests/test_embed.py)
    argv = train_argv(args, tmp_path)
    argv[argv.index("--params") + 1] = str(tmp_path / "params.yaml")
    argv[argv.index("--features") + 1] = str(tmp_path / "embed")
    assert load_stage("train").main(argv) == 0
    torch.manual_seed(params["base"]["seed"])  # the stage's initial model
    prompts = load_prompt_embeddings(argv[argv.index("--prompts") + 1])
    initial = create_model(from_dict(ModelParams, params["model"], "model"), prompts).state_dict()
    trained = checkpoint.load(tmp_path / "model.pt")["state_dict"]
    backbone = [name for name in initial if name.startswith("visual.")]
    heads = [name for name in initial if not name.startswith("visual.") and initial[name].is_floating_point()]
    assert backbone and heads
    assert all(torch.equal(initial[name], trained[name]) for name in backbone)
    assert any(not torch.equal(initial[name], trained[name]) for name in heads)
    assert json.loads((tmp_path / "train.json").read_text())["final"]["lr_backbone"] == 0.0
    predict = list(args["predict"])
    for flag, value in (("--model", tmp_path / "model.pt"), ("--out-dir", tmp_path / "predict"),
                        ("--features", tmp_path / "embed"),
                        ("--report", tmp_path / "predict.json"), ("--params", tmp_path / "params.yaml")):
        predict[predict.index(flag) + 1] = str(value)
    assert load_stage("predict").main(predict) == 0
    assert len(pd.read_parquet(tmp_path / "predict" / "val.parquet")) > 0


def test_a_state_resumes_only_under_the_same_source_torch_and_numerics(tmp_path, monkeypatch):
    """A finished run in models/train_state once outlived a change of the exact-CPU kernels and was
    handed back as the new run's model (the fresh clone then trained another one)."""
    from vce.core.exact import MARKER, SETTINGS

    package = tmp_path / "vce"
    (package / "model").mkdir(parents=True)
    (package / "model" / "a.py").write_text("x = 1\n")
    monkeypatch.delenv(MARKER, raising=False)
    first = checkpoint.run_environment(package)
    assert first == checkpoint.run_environment(package) and first["exact_cpu"] is None
    (package / "model" / "a.py").write_text("x = 2\n")
    assert checkpoint.run_environment(package)["source"] != first["source"]
    (package / "model" / "a.py").write_text("x = 1\n")
    (package / "b.py").write_text("")
    assert checkpoint.run_environment(package)["source"] != first["source"], "a new file is another source"
    monkeypatch.setenv(MARKER, "1")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", SETTINGS["ATEN_CPU_CAPABILITY"])
    pinned = checkpoint.run_environment(package)["exact_cpu"]
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    assert checkpoint.run_environment(package)["exact_cpu"] != pinned
    fingerprint = checkpoint.fingerprint("params")
    monkeypatch.setattr(checkpoint, "run_environment", lambda: {"source": "other"})
    assert checkpoint.fingerprint("params") != fingerprint
