"""Hostile inputs across stages (README "Reliability"): empty inputs give valid empty outputs,
bad files give one line naming the file, outputs are never half-written."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from conftest import load_stage, prepare_demo

from vce.eval.score import check_submission

STAGES = ["train", "predict", "temporal", "thresholds", "events", "score", "report"]


def test_no_test_set_runs_every_stage_and_writes_an_empty_submission(tmp_path):
    """`data.test_root: null` (documented): predict → … → report end to end, submission empty."""
    args = prepare_demo(tmp_path, data={"test_root": None}, score={"test_gt": None})
    assert len(pd.read_parquet(tmp_path / "index/test.parquet")) == 0
    for name in STAGES:
        assert load_stage(name).main(args[name]) == 0, f"stage {name} failed"
    submission = json.loads((tmp_path / "events/submission.json").read_text())
    assert submission == {"videos": []}
    check_submission(submission)
    assert len(pd.read_excel(tmp_path / "events/submission.xlsx")) == 0
    assert len(pd.read_parquet(tmp_path / "predict/test.parquet")) == 0
    assert json.loads((tmp_path / "metrics/predict.json").read_text())["test"]["frames"] == 0
    val = json.loads((tmp_path / "events/val.json").read_text())
    assert val["videos"], "the validation events are still written"
    score = json.loads((tmp_path / "metrics/score.json").read_text())
    assert 0.0 <= score["map@0.5"] <= 1.0


# ----------------------------------------------------------------------------- checkpoints

class _RunsCode:
    def __reduce__(self):
        import os

        return (os.getpid, ())


def test_a_checkpoint_holding_code_is_refused_in_one_line_without_advice_to_run_it(tmp_path):
    import torch

    from vce.model import checkpoint

    torch.save({"state_dict": {}, "hook": _RunsCode()}, tmp_path / "model.pt")
    with pytest.raises(checkpoint.CheckpointError) as err:
        checkpoint.load(tmp_path / "model.pt")
    message = str(err.value)
    assert str(tmp_path / "model.pt") in message and "could run code" in message
    assert "weights_only" not in message and "\n" not in message


@pytest.mark.parametrize("content", ["truncated", "junk", "empty", "code", "no_fingerprint"])
def test_an_unusable_train_state_is_ignored_with_a_warning(tmp_path, capsys, content):
    """A bad models/train_state/last.pt must not block training until someone deletes it."""
    import torch

    from vce.model import checkpoint

    path = tmp_path / "last.pt"
    checkpoint.save(path, {"fingerprint": "run", "epoch": 1, "w": torch.ones(1000)})
    good = path.read_bytes()
    assert checkpoint.load_train_state(path)["epoch"] == 1
    if content == "truncated":
        path.write_bytes(good[: len(good) // 2])
    elif content == "junk":
        path.write_bytes(b"\x80\x04not a pickle")
    elif content == "empty":
        path.write_bytes(b"")
    elif content == "code":
        torch.save({"fingerprint": _RunsCode()}, path)
    else:
        checkpoint.save(path, {"epoch": 1})
    assert checkpoint.load_train_state(path) is None
    warning = capsys.readouterr().err
    assert "starting fresh" in warning and str(path) in warning
    assert checkpoint.load_train_state(tmp_path / "absent.pt") is None


def test_trainer_resumes_through_the_tolerant_loader():
    """The trainer must use load_train_state (not load), or a bad last.pt blocks training."""
    import inspect

    from vce.train.trainer import Trainer

    source = inspect.getsource(Trainer.try_resume)
    assert "load_train_state" in source and "checkpoint.load(" not in source
