"""Hostile inputs across stages (docs/reliability.md): empty inputs give valid empty outputs,
bad files give one line naming the file, outputs are never half-written."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml
from conftest import load_stage, prepare_demo

from vce.eval.score import check_submission

STAGES = ["train", "predict", "temporal", "thresholds", "events", "score", "report"]


def test_no_test_set_runs_every_stage_and_writes_an_empty_submission(tmp_path, capsys):
    """`data.test_root: null` alone (`dvc exp run -S data.test_root=null`): predict → … → report end to
    end, submission empty; score.test_gt still names the demo's test ground truth, which is not scored."""
    args = prepare_demo(tmp_path, data={"test_root": None},
                        train={"epochs": 1}, temporal={"steps": 20}, thresholds={"rounds": 1})
    assert yaml.safe_load((tmp_path / "params.yaml").read_text())["score"]["test_gt"]  # still set
    assert len(pd.read_parquet(tmp_path / "index/test.parquet")) == 0
    for name in STAGES:
        assert load_stage(name).main(args[name]) == 0, f"stage {name} failed"
    assert "the test set is not scored" in capsys.readouterr().err
    assert json.loads((tmp_path / "metrics/headline/test.json").read_text()) == {}
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


# ----------------------------------------------------------------------------- decompression bombs

@pytest.mark.parametrize("side,max_pixels,message", [
    (60000, None, "header declares 3,600,000,000 pixels, over the 1,073,741,824 any decoder here accepts"),
    (20000, 25_000_000, "header declares 400,000,000 pixels, over data.max_frame_pixels = 25,000,000"),
])
def test_a_decompression_bomb_is_an_invalid_frame_for_every_decoder(tmp_path, side, max_pixels, message):
    """Never a cv2.error / DecompressionBombError traceback, never a 1 GB allocation."""
    from test_index import png_header_claiming

    from vce.data.frames import FrameError, available_decoders, decode_frame

    path = tmp_path / "frame_000001.png"
    path.write_bytes(png_header_claiming(side, side))
    for decoder in available_decoders():
        with pytest.raises(FrameError, match=f"^{path}: {message}$"):
            decode_frame(path, size=64, decoder=decoder, max_pixels=max_pixels)


def test_pils_own_bomb_error_is_a_frame_error(tmp_path):
    from test_index import png_header_claiming

    from vce.data.frames import FrameError, decode_frame

    path = tmp_path / "frame_000001.png"
    path.write_bytes(png_header_claiming(20000, 20000))  # under 2**30, over PIL's 178,956,970
    with pytest.raises(FrameError, match="not decodable .*decompression bomb"):
        decode_frame(path, decoder="pil")


def test_a_bomb_in_the_loader_is_counted_as_an_invalid_frame(tmp_path):
    from test_index import PNG, png_header_claiming

    from vce.data.dataset import FrameDataset, eval_transform

    (tmp_path / "good.png").write_bytes(PNG)
    (tmp_path / "bomb.png").write_bytes(png_header_claiming(60000, 60000))
    dataset = FrameDataset(tmp_path, ["good.png", "bomb.png"], None, 8, 8, "bilinear", eval_transform(), "opencv")
    assert [dataset[i][2] for i in range(2)] == [True, False]


# ----------------------------------------------------------------------------- empty inputs and events

def _event_params():
    import yaml
    from conftest import ROOT

    from vce.core.params import from_dict
    from vce.post.events import EventParams

    return from_dict(EventParams, yaml.safe_load((ROOT / "params.yaml").read_text())["events"], "events")


def _probs(rows: dict[str, int], value=0.0, valid=True) -> pd.DataFrame:
    import numpy as np

    from vce.core.labels import LABELS

    video_ids = [v for v, n in rows.items() for _ in range(n)]
    times = [t for n in rows.values() for t in range(n)]
    table = pd.DataFrame({"video_id": pd.Series(video_ids, dtype=str), "t": np.array(times, np.int64)})
    for label in LABELS:
        table[label] = np.full(len(table), value, np.float32)
    table["valid"] = valid
    return table


@pytest.mark.parametrize("anatomy", ["none", "viterbi"])
def test_no_frames_at_all_give_an_empty_valid_submission(anatomy):
    from vce.core.labels import LABELS
    from vce.post.events import probs_to_submission

    params = _event_params().replace(anatomy=anatomy)
    submission = probs_to_submission(_probs({}), {label: 0.5 for label in LABELS}, params)
    assert submission == {"videos": []}
    check_submission(submission)


def test_a_video_whose_every_frame_is_invalid_is_listed_without_events():
    import numpy as np

    from vce.core.labels import LABELS
    from vce.post.events import probs_to_submission

    probs = _probs({"a": 20, "b": 20}, value=0.99)
    probs.loc[probs["video_id"] == "a", list(LABELS)] = np.nan
    probs.loc[probs["video_id"] == "a", "valid"] = False
    submission = probs_to_submission(probs, {label: 0.5 for label in LABELS}, _event_params())
    check_submission(submission)
    events = {video["video_id"]: video["events"] for video in submission["videos"]}
    assert events["a"] == [] and events["b"], "every video is listed; only the valid one has events"


def test_a_label_never_predicted_gets_no_event_and_the_others_still_do():
    from vce.core.labels import LABELS
    from vce.post.events import probs_to_submission

    probs = _probs({"a": 30}, value=0.0)
    probs["blood"] = 0.99
    submission = probs_to_submission(probs, {label: 0.5 for label in LABELS}, _event_params())
    labels = {label for event in submission["videos"][0]["events"] for label in event["label"]}
    assert labels == {"blood"}


def test_past_the_xlsx_row_limit_events_continue_on_more_sheets(tmp_path, monkeypatch, capsys):
    from vce.post import events

    monkeypatch.setattr(events, "XLSX_MAX_ROWS", 4)  # 3 events per sheet
    submission = {"videos": [{"video_id": "v", "events": [
        {"start": 10 * i, "end": 10 * i + 3, "label": ["blood"]} for i in range(7)]}]}
    events.write_xlsx(submission, tmp_path / "sub.xlsx")
    sheets = pd.read_excel(tmp_path / "sub.xlsx", sheet_name=None)
    assert list(sheets) == ["Sheet1", "Sheet2", "Sheet3"]
    assert [len(s) for s in sheets.values()] == [3, 3, 1]
    assert pd.concat(sheets.values())["start"].tolist() == [10 * i for i in range(7)]
    assert "7 events exceed one worksheet's 3 rows; written on 3 sheets" in capsys.readouterr().err


def test_a_nan_threshold_is_an_error_naming_label_and_file(tmp_path):
    from vce.core.errors import DataError
    from vce.core.labels import LABELS
    from vce.post.thresholds_file import read_thresholds

    path = tmp_path / "thresholds.json"
    thresholds = {label: 0.5 for label in LABELS}
    saved = {"method": "f1", "probs": "frame", "events": None, "engine": None}
    path.write_text(json.dumps({**saved, "thresholds": {**thresholds, "blood": float("nan")}}))
    with pytest.raises(DataError, match=rf"^{path}: threshold of 'blood' is nan, must be a number >= 0$"):
        read_thresholds(path)
    path.write_text(json.dumps({**saved, "thresholds": thresholds}))
    assert read_thresholds(path).thresholds == thresholds
    path.write_text("{not json")
    with pytest.raises(DataError, match=rf"^thresholds file: {path} is not valid JSON"):
        read_thresholds(path)


def test_disk_full_while_saving_a_checkpoint_is_one_oserror_and_keeps_the_old_file(tmp_path, monkeypatch):
    """torch's zip writer reports some failed writes as RuntimeError (`torch.save(obj, "/dev/full")`:
    "[enforce fail at inline_container.cc:672] . unexpected pos"); the runner prints OSError in one line."""
    import torch

    from vce.model import checkpoint

    path = tmp_path / "last.pt"
    checkpoint.save(path, {"fingerprint": "old", "w": torch.zeros(2)})

    def full(*args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 64 vs 0\nmore")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(OSError, match=rf"^{path}: cannot write checkpoint \(\[enforce fail"):
        checkpoint.save(path, {"fingerprint": "new"})
    monkeypatch.undo()
    assert checkpoint.load(path)["fingerprint"] == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_predict_and_the_cache_pass_data_max_frame_pixels_to_the_decoder(tmp_path):
    """A frame that decodes fine but declares more pixels than the limit: invalid, counted."""
    import cv2
    import numpy as np
    import torch
    import yaml
    from conftest import ROOT

    from vce.core.labels import NUM_LABELS
    from vce.core.params import from_dict
    from vce.data.frame_cache import CacheParams, build_cache
    from vce.infer.predict import PredictParams, predict_frames
    from vce.model.frame_model import ModelParams, create_model

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    for name, side in (("small.png", 32), ("large.png", 96)):
        cv2.imwrite(str(tmp_path / name), np.full((side, side, 3), 120, np.uint8))
    table = pd.DataFrame({"video_id": ["v", "v"], "frame": [1, 2], "path": ["small.png", "large.png"],
                          "root": [str(tmp_path)] * 2})
    torch.manual_seed(0)
    model = create_model(from_dict(ModelParams, params["model"], "model"), torch.randn(NUM_LABELS, 64)).eval()
    predict = from_dict(PredictParams, {**params["predict"], "num_workers": 0, "batch_size": 2, "bf16": False,
                                        "decoder": "opencv"}, "predict")
    stats = predict_frames(model, table, tmp_path, tmp_path / "p.parquet", predict, torch.device("cpu"),
                           max_pixels=50 * 50)
    assert pd.read_parquet(tmp_path / "p.parquet")["valid"].tolist() == [True, False]
    assert stats["invalid_frames"] == 1
    cache = from_dict(CacheParams, {**params["cache"], "enabled": True, "size": 16, "num_workers": 0,
                                    "decoder": "opencv"}, "cache")
    meta = build_cache(table, tmp_path / "cache", cache, max_pixels=50 * 50)
    assert meta["invalid"] == 1
    assert build_cache(table, tmp_path / "cache2", cache, max_pixels=None)["invalid"] == 0
