"""`python -m vce.infer.detect` on one exam: what it says and refuses before any model runs.
(The whole detection against the pipeline's events, and the documented commands run as typed:
tests/test_folds.py.)"""

from __future__ import annotations

import json

import cv2
import numpy as np
from conftest import ROOT, section_params

from vce.core.labels import LABELS
from vce.data.index import DataParams
from vce.infer import detect

PNG = cv2.imencode(".png", np.zeros((4, 4, 3), np.uint8))[1].tobytes()


def test_frames_left_out_of_an_exam_are_said_naming_them(tmp_path, capsys):
    """Issue 48, WEAK: detect dropped 0-byte and truncated frames without a word (the index
    stage counts them). Mutation killed: not printing the exam's index report."""
    exam = tmp_path / "ukdd_navi_00051"
    exam.mkdir()
    for n in range(49, 54):
        (exam / f"frame_{n:07d}.png").write_bytes(PNG)
    (exam / "frame_0000054.png").write_bytes(b"")
    (exam / "frame_0000055.png").write_bytes(PNG[: len(PNG) // 2])
    frames = detect.exam_frames(exam, section_params(DataParams, "data"))
    assert len(frames) == 5
    err = capsys.readouterr().err
    assert "ukdd_navi_00051: warning: 1 × zero-byte frame file" in err and "frame_0000054.png" in err
    assert "ukdd_navi_00051: warning: 1 × PNG without its IEND" in err and "frame_0000055.png" in err


def test_an_exam_name_too_long_for_the_viewer_is_refused_before_any_model_runs(tmp_path, capsys):
    """Issue 48, WEAK: a 250-byte exam folder name failed only after the whole run (the viewer's
    page name passed the file-name limit). Mutation killed: the early check (then the missing
    model file is the error)."""
    exam = tmp_path / ("x" * 250)
    exam.mkdir()
    (exam / "frame_0000049.png").write_bytes(PNG)
    thresholds = tmp_path / "thresholds.json"
    thresholds.write_text(json.dumps({"method": "f1", "probs": "frame", "thresholds": {label: 0.5 for label in LABELS},
                                      "events": None, "engine": None}))
    argv = [str(exam), "--out", str(tmp_path / "ev.json"), "--params", str(ROOT / "params.yaml"),
            "--thresholds", str(thresholds), "--models", str(tmp_path / "no_model.pt"),
            "--viewer-dir", str(tmp_path / "viewer")]
    assert detect.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: video id 'xxxx") and "over the 255-byte limit: rename the exam folder" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["thresholds.json", "x" * 250]
