"""Experiments do not compound: the train stage's scratch folder never changes what given params give.

`dvc exp run -S train.epochs=1` and then the default again must train the default from scratch
(same model, same metrics as a clean run); only `train.extend: true` continues a finished run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import ROOT, prepare_demo

from vce.model import checkpoint


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("experiments")
    return tmp_path, prepare_demo(tmp_path)  # tiny params: train.epochs = 2


def train(demo, out: Path, **train_overrides) -> str:
    """Run the train stage (a subprocess, as DVC does) with its outputs and state under `out`."""
    tmp_path, args = demo
    params = yaml.safe_load((tmp_path / "params.yaml").read_text())
    params["train"].update(train_overrides)
    out.mkdir(parents=True, exist_ok=True)
    (out / "params.yaml").write_text(yaml.safe_dump(params))
    argv = list(args["train"])
    for flag, value in (("--params", "params.yaml"), ("--model-out", "model.pt"), ("--state-dir", "state"),
                        ("--metrics", "train.json"), ("--live-dir", "live")):
        argv[argv.index(flag) + 1] = str(out / value)
    process = subprocess.run([sys.executable, "-m", "stages.train", *argv], cwd=ROOT, capture_output=True,
                             text=True, timeout=600, env={**os.environ, "CI": "1", "OMP_NUM_THREADS": "1"})
    assert process.returncode == 0, process.stdout + process.stderr
    return process.stdout


def same_model(a: Path, b: Path) -> bool:
    left, right = checkpoint.load(a)["state_dict"], checkpoint.load(b)["state_dict"]
    return left.keys() == right.keys() and all(torch.equal(left[k], right[k]) for k in left)


@pytest.fixture(scope="module")
def runs(demo):
    """clean: the default alone; shorter: 1 epoch first, then the default in the same state folder;
    extended: the same 1-epoch run continued with `train.extend: true`."""
    tmp_path, _ = demo
    clean_output = train(demo, tmp_path / "clean")
    one_epoch = train(demo, tmp_path / "shorter", epochs=1)
    shutil.copytree(tmp_path / "shorter", tmp_path / "extended")
    after_shorter = train(demo, tmp_path / "shorter")
    extended = train(demo, tmp_path / "extended", extend=True)
    return {"clean": clean_output, "one_epoch": one_epoch, "after_shorter": after_shorter, "extended": extended}


def test_a_shorter_run_before_does_not_change_the_default_run(demo, runs):
    tmp_path, _ = demo
    clean, shorter = tmp_path / "clean", tmp_path / "shorter"
    assert "written by a 1-epoch run, train.epochs is 2; training from scratch" in runs["after_shorter"]
    assert "resuming" not in runs["after_shorter"] and "extending" not in runs["after_shorter"]
    assert same_model(shorter / "model.pt", clean / "model.pt")
    assert (shorter / "train.json").read_bytes() == (clean / "train.json").read_bytes()
    curve = "live/plots/metrics/val/map.tsv"
    assert (shorter / curve).read_text() == (clean / curve).read_text(), "the curves hold this run's epochs only"


def test_extend_continues_a_finished_run_only_when_asked(demo, runs):
    tmp_path, _ = demo
    assert "extending the finished 1-epoch run" in runs["extended"]
    extended = json.loads((tmp_path / "extended" / "train.json").read_text())
    clean = json.loads((tmp_path / "clean" / "train.json").read_text())
    assert extended["epochs"] == 2 and extended["final"]["epoch"] == 2
    # A new OneCycle over epoch 2 on top of the 1-epoch run: not the 2-epoch default.
    assert extended["final"]["train_loss"] != clean["final"]["train_loss"]
    assert not same_model(tmp_path / "extended" / "model.pt", tmp_path / "clean" / "model.pt")


def test_training_prints_one_plain_line_per_epoch_and_a_summary(runs):
    output = runs["clean"]
    lines = re.findall(r"^epoch (\d)/2  train_loss \d+\.\d{4}  val_loss \d+\.\d{4}  val_mAP [01]\.\d{4}  "
                       r"lr \d\.\d\de[-+]\d\d \(backbone\) \d\.\d\de[-+]\d\d \(head\)", output, re.M)
    assert lines == ["1", "2"]
    assert "\r" not in output, "no progress bars outside a terminal"
    summary = output.strip().splitlines()[-1]
    assert re.fullmatch(r"train: \d+ train / \d+ val frames, 2 epochs, best epoch [12] val mAP [01]\.\d{4}, "
                        r"\d+ s -> .*model\.pt, .*train\.json", summary), summary


def test_train_outputs_have_the_mode_open_gives(demo, runs):
    """model.pt (copied from the scratch best.pt), train.json, DVCLive's files: not 0600."""
    tmp_path, _ = demo
    umask = os.umask(0o022)
    os.umask(umask)
    files = [p for p in (tmp_path / "clean").rglob("*") if p.is_file()]
    assert any(p.name == "model.pt" for p in files) and any(p.suffix == ".tsv" for p in files)
    wrong = [f"{p}: {oct(p.stat().st_mode & 0o777)}" for p in files if p.stat().st_mode & 0o777 != 0o666 & ~umask]
    assert not wrong, wrong
