"""What a user meets at the command line: `--help` (fast, torch-free, defaults shown), the headline
metrics (`dvc metrics show` in 100 columns, the empty-submission floor), output file modes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import PREPARE, ROOT, load_stage, stage_args, tiny_params

STAGES = sorted(p.stem for p in (ROOT / "stages").glob("*.py") if p.stem != "__init__")

# `python -m stages.<name> --help` for every stage, in one interpreter; heavy imports checked after each.
HELP_SCRIPT = """
import contextlib, io, json, runpy, sys
out = {}
for name in sys.argv[1:]:
    sys.argv, buf, code = [name, "--help"], io.StringIO(), "did not exit"
    with contextlib.redirect_stdout(buf):
        try:
            runpy.run_module("stages." + name, run_name="__main__", alter_sys=True)
        except SystemExit as exit:
            code = exit.code
    heavy = sorted({"torch", "numpy", "pandas", "pyarrow", "sklearn", "scipy"} & set(sys.modules))
    out[name] = {"code": code, "heavy": heavy, "help": buf.getvalue()}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def helps() -> dict:
    process = subprocess.run([sys.executable, "-c", HELP_SCRIPT, *STAGES], cwd=ROOT, capture_output=True,
                             text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert process.returncode == 0, process.stderr
    return json.loads(process.stdout)


@pytest.mark.parametrize("name", STAGES)
def test_help_exits_0_without_importing_torch_numpy_pandas_pyarrow_sklearn_or_scipy(helps, name):
    assert helps[name]["code"] == 0
    assert not helps[name]["heavy"], f"stages.{name} imports {helps[name]['heavy']} before parsing its arguments"


@pytest.mark.parametrize("name", STAGES)
def test_help_shows_every_option_with_its_default(helps, name):
    text = helps[name]["help"]
    blocks = re.split(r"\n(?=  -)", text.split("options:", 1)[1])
    options = [block for block in blocks if block.lstrip().startswith("--")]
    assert options, text
    for block in options:
        assert block.count("(default:") == 1, f"stages.{name}: {block.strip()!r} shows no (or two) default(s)"
    if "--params" in text:
        assert "(default: params.yaml)" in text


@pytest.mark.parametrize("name", STAGES)
def test_help_usage_is_the_command_a_user_types(helps, name):
    """Issue 48: `usage: events.py` named no command anyone can run."""
    assert helps[name]["help"].startswith(f"usage: python -m stages.{name} ")


OTHER_CLIS = ("vce.infer.detect", "vce.core.recipe", "vce.eval.score")


@pytest.mark.parametrize("module", OTHER_CLIS)
def test_the_other_clis_answer_help_at_once_as_python_m(module):
    """Issue 48, BUG 2: `python -m vce.infer.detect --help` took 7 s idle, 72 s under load (torch
    imported before argparse) and said `usage: detect.py`. Run as a user types it; nothing heavy
    is imported (numpy only by the scorer, which is numpy). Mutation killed: detect's imports
    back at its top."""
    import time

    code = (f"import runpy, sys\nsys.argv = [{module!r}, '--help']\n"
            f"try:\n    runpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n"
            "except SystemExit as exit:\n    assert exit.code == 0\n"
            "print(sorted({'torch', 'numpy', 'pandas', 'pyarrow', 'sklearn', 'scipy'} & set(sys.modules)))")
    began = time.perf_counter()
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    seconds = time.perf_counter() - began
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith(f"usage: python -m {module} "), run.stdout[:200]
    assert run.stdout.strip().splitlines()[-1] == ("['numpy']" if module == "vce.eval.score" else "[]")
    assert seconds < 30, seconds  # about a second idle; the bound only catches a heavy import under load


def test_train_help_names_the_state_dir_default(helps):
    assert re.search(r"--state-dir STATE_DIR\s+resumable checkpoints \(None:\s+models/train_state/fold_<fold>\)",
                     helps["train"]["help"])


# --- what dvc.yaml runs is what a stage run by hand runs ------------------------------------------

def dvc_stages() -> dict:
    return yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]


@pytest.mark.parametrize("name", sorted(dvc_stages()))
def test_dvc_yaml_passes_no_paths_so_the_defaults_are_what_the_pipeline_runs(name):
    # Only selectors may follow the module (which fold, which part): every path is the stage's default.
    words = dvc_stages()[name]["cmd"].split()
    assert words[:2] == ["python", "-m"] and words[2].startswith("stages.")
    flags = words[3::2]
    assert set(flags) <= {"--fold", "--part"}, f"{name}: dvc.yaml passes {flags}"


@pytest.mark.parametrize("fold", [0, 2])
def test_a_folds_default_paths_are_the_outputs_dvc_yaml_declares_for_it(fold):
    stages = dvc_stages()
    train = load_stage("train").parse_args(["--fold", str(fold)])
    labelled = load_stage("predict").parse_args(["--part", "labelled", "--fold", str(fold)])
    test = load_stage("predict").parse_args(["--part", "test", "--fold", str(fold)])

    def declared(stage: str) -> set[str]:
        outs = {next(iter(o)) if isinstance(o, dict) else o for o in stages[stage]["outs"]}
        return {o.replace("${item.fold}", str(fold)) for o in outs}

    assert {train.model_out, train.metrics, train.live_dir} == declared("train")
    assert train.state_dir == f"models/train_state/fold_{fold}"
    assert {labelled.out_dir, labelled.report} == declared("predict")
    assert {test.out_dir, test.report} == declared("predict_test")
    assert labelled.model == test.model == f"models/folds/{fold}/model.pt"
    assert f"models/folds/{fold}/model.pt" in {d.replace("${item.fold}", str(fold)) for d in stages["predict"]["deps"]}


# --- headline metrics ----------------------------------------------------------------------------

def test_empty_submission_floor_is_one_per_absent_label():
    from stages.score import empty_submission, headline
    from vce.eval.score import score

    gt = {"videos": [{"video_id": "a", "events": [{"start": 0, "end": 9, "label": ["colon"]}]}]}
    empty = score(gt, empty_submission(gt))
    assert empty["map@0.5"] == empty["map@0.95"] == pytest.approx(16 / 17)  # every absent label scores 1
    perfect = score(gt, gt)
    values = headline(perfect, empty, frame_map=0.5)
    assert values == {"map@0.5": 1.0, "map@0.95": 1.0, "empty@0.5": empty["map@0.5"],
                      "empty@0.95": empty["map@0.95"], "frame_map": 0.5}
    assert "frame_map" not in headline(perfect, empty)


def declared_metrics() -> list[str]:
    return yaml.safe_load((ROOT / "dvc.yaml").read_text())["metrics"]


def test_only_the_headline_is_declared_and_the_score_stage_writes_it():
    stage = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]["score"]
    outs = [next(iter(out)) if isinstance(out, dict) else out for out in stage["outs"]]
    assert declared_metrics() == ["metrics/headline/val.json", "metrics/headline/test.json"]
    assert set(declared_metrics()) <= set(outs)


def test_dvc_metrics_show_fits_in_100_columns(tmp_path):
    """The real `dvc metrics show` on headline files with full-precision numbers."""
    from stages.score import headline
    from vce.core.io import write_json

    value = {"map@0.5": 1 / 3, "map@0.95": 2 / 7}
    val, test = declared_metrics()
    write_json(tmp_path / val, headline(value, value, frame_map=1 / 9))
    write_json(tmp_path / test, headline(value, value))
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"metrics": declared_metrics()}))
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    subprocess.run(["dvc", "init", "--no-scm", "-q"], cwd=tmp_path, check=True, env=env)
    shown = subprocess.run(["dvc", "metrics", "show"], cwd=tmp_path, check=True, env=env,
                           capture_output=True, text=True).stdout
    lines = shown.rstrip("\n").splitlines()
    assert len(lines) == 3, shown  # header + one row per set
    assert max(len(line) for line in lines) <= 100, shown
    assert lines[0].split() == ["Path", "empty@0.5", "empty@0.95", "frame_map", "map@0.5", "map@0.95"]
    assert "0.33333" in lines[1] and "0.11111" in lines[1]


# --- output files ----------------------------------------------------------------------------------

def test_stage_outputs_have_the_mode_open_gives(tmp_path):
    """Not mkstemp's private 0600: the mode of a file the user writes (0666 less the umask)."""
    params = tiny_params(tmp_path)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    args = stage_args(tmp_path)
    for name in PREPARE:
        assert load_stage(name).main(args[name]) == 0
    assert_normal_modes(tmp_path)
    assert any(tmp_path.rglob("*.parquet")) and (tmp_path / "models/prompt_embeddings.pt").is_file()


def assert_normal_modes(folder: Path) -> None:
    umask = os.umask(0o022)
    os.umask(umask)
    wrong = [f"{p}: {oct(p.stat().st_mode & 0o777)}" for p in folder.rglob("*")
             if p.is_file() and p.stat().st_mode & 0o777 != 0o666 & ~umask]
    assert not wrong, wrong


# --- events: an experiment that emits nothing says so -----------------------------------------------

def write_probs_and_index(folder: Path, n: int = 40) -> None:
    import numpy as np
    import pandas as pd

    from vce.core.contracts import write_probs
    from vce.core.labels import LABELS

    frames = pd.DataFrame({"video_id": "v1", "frame": np.arange(n, dtype=np.int64) * 5,
                           "index": np.arange(n, dtype=np.int64), "path": [f"v1/{i}.png" for i in range(n)],
                           "event_unit": "index", "capsule": "", "split": "val"})
    for label in LABELS:
        frames[label] = np.uint8(0)
    frames["colon"] = np.uint8(1)
    frames.to_parquet(folder / "frames.parquet", index=False)
    probs = frames[["video_id", "frame"]].copy()
    for label in LABELS:
        probs[label] = np.float32(0.6 if label == "colon" else 0.01)
    probs["valid"] = True
    write_probs(folder / "val.parquet", probs)
    write_probs(folder / "test.parquet", probs.iloc[:0])
    frames.iloc[:0].drop(columns=list(LABELS)).to_parquet(folder / "test_frames.parquet", index=False)


@pytest.mark.parametrize("colon_threshold,warned", [(1.01, True), (0.5, False)])
def test_events_warns_when_nothing_is_emitted(tmp_path, capsys, colon_threshold, warned):
    from vce.core.labels import LABELS

    params = tiny_params(tmp_path)
    params["post"]["probs"] = "frame"
    params["events"]["presence"] = "none"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    write_probs_and_index(tmp_path)
    thresholds = {label: 1.01 for label in LABELS} | {"colon": colon_threshold}
    (tmp_path / "thresholds.json").write_text(json.dumps({"method": "f1", "probs": "frame", "thresholds": thresholds,
                                                          "events": None}))
    argv = ["--params", str(tmp_path / "params.yaml"), "--thresholds", str(tmp_path / "thresholds.json"),
            "--val-probs", str(tmp_path / "val.parquet"), "--test-probs", str(tmp_path / "test.parquet"),
            "--frames", str(tmp_path / "frames.parquet"), "--test-frames", str(tmp_path / "test_frames.parquet"),
            "--held-out", "", "--out-dir", str(tmp_path / "events")]
    assert load_stage("events").main(argv) == 0
    err = capsys.readouterr().err
    assert ("warning: val: no event at all in 1 video(s)" in err) is warned, err
    assert "warning: submission" not in err  # no test videos: nothing to warn about
    events = json.loads((tmp_path / "events/val.json").read_text())["videos"][0]["events"]
    assert (len(events) == 0) is warned


def test_the_report_viewer_follows_plots_dir():
    """Issue 48, WEAK: `report --plots-dir X` still wrote the viewer into plots/viewer. Mutation
    killed: a fixed default."""
    report = load_stage("report")
    assert report.parse_args(["--plots-dir", "elsewhere"]).viewer_dir == "elsewhere/viewer"
    assert report.parse_args(["--plots-dir", "x", "--viewer-dir", "v"]).viewer_dir == "v"
    outs = {next(iter(o)) if isinstance(o, dict) else o for o in dvc_stages()["report"]["outs"]}
    assert report.parse_args([]).viewer_dir in outs  # what dvc.yaml declares
