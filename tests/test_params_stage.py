"""The `params` stage: the whole params.yaml checked first, so a bad value anywhere stops the graph early."""

import json
import subprocess
import sys

import pytest
import yaml
from conftest import ROOT, load_stage, write_params

from vce.core.params import SECTIONS


def run_check(tmp_path, capsys, **sections):
    params = write_params(tmp_path / "params.yaml", **sections)
    out = tmp_path / "params_check.json"
    code = load_stage("params").main(["--params", str(params), "--out", str(out)])
    return code, out, capsys.readouterr().err


def test_the_repository_params_hold_and_the_output_does_not_move_with_valid_values(tmp_path, capsys):
    code, out, err = run_check(tmp_path, capsys)
    assert (code, err) == (0, "")
    first = out.read_bytes()
    assert json.loads(first)["sections"] == list(SECTIONS)
    code, out, _ = run_check(tmp_path, capsys, train={"epochs": 1}, events={"median_window": 3})
    assert code == 0 and out.read_bytes() == first  # downstream stages rerun only for what they read


@pytest.mark.parametrize("method", ["f1", "engine", "map"])
def test_thresholds_reads_events_only_under_map(tmp_path, capsys, method):
    """Issue 50: thresholds depends on this file, not on `events`; under f1 / engine an events sweep
    must leave it as it was (thresholds does not rerun), under map it must change (the search starts there)."""
    reads = tmp_path / "thresholds_reads.json"
    code, _, _ = run_check(tmp_path, capsys, thresholds={"method": method})
    first = reads.read_bytes()
    code2, _, _ = run_check(tmp_path, capsys, thresholds={"method": method}, events={"median_window": 3})
    assert code == code2 == 0
    assert json.loads(first)["method"] == method
    if method == "map":
        assert reads.read_bytes() != first and json.loads(reads.read_text())["events"]["median_window"] == 3
    else:
        assert reads.read_bytes() == first and json.loads(first)["events"] is None


def test_the_thresholds_stage_depends_on_what_it_reads_of_events_not_on_the_section():
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    assert "events" not in stages["thresholds"]["params"] and "metrics/thresholds_reads.json" in stages["thresholds"]["deps"]
    assert "events" in stages["events"]["params"]


@pytest.mark.parametrize(("sections", "message"), [
    ({"events": {"median_window": 4}}, "error: events.median_window = 4: must be an odd integer\n"),
    ({"report": {"curve_points": 0}}, "error: report.curve_points = 0: must be >= "),
    ({"split": {"folds": [0, 2]}}, "error: split.folds = [0, 2]: must be the fold ids 0..k-1 in order"),
    ({"post": {"probs": "temporal"}, "predict": {"embeddings": False}},
     "error: post.probs = 'temporal' needs predict.embeddings: true"),
    ({"post": {"probs": "temporal"}, "split": {"val_videos": ["3"]}},
     "error: post.probs = 'temporal' with one validation video (split.val_videos = ['3']): its temporal "
     "probabilities cannot be cross-fitted"),
    ({"model": {"source": "local-dir:/nowhere"}},
     "error: train.lr_backbone = 0.003 with the pretrained model.source 'local-dir:/nowhere'"),
    ({"train": {"samples_per_epoch": 10}}, "error: train.samples_per_epoch = 10: fewer than one batch"),
    ({"model": {"source": "timm:local-dir:/x", "fusion": "con"}}, "error: model.fusion = 'con': con needs a text tower"),
])
def test_a_bad_value_in_any_section_or_across_sections_is_one_line_naming_the_key(tmp_path, capsys, sections, message):
    code, out, err = run_check(tmp_path, capsys, **sections)
    assert code == 2 and not out.exists()
    assert err.startswith(message) and err.count("\n") == 1


def test_every_other_stage_depends_on_the_check_so_dvc_runs_it_first():
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    check = stages["params"]
    assert check["outs"] == [{"metrics/params_check.json": {"cache": False}},
                             {"metrics/thresholds_reads.json": {"cache": False}}]
    assert check["params"] == list(SECTIONS)  # any value change reruns the check
    lacking = [name for name, stage in stages.items() if name != "params"
               and "metrics/params_check.json" not in stage["deps"]]
    assert lacking == []


def test_help_imports_nothing_heavy():
    code = ("import sys, runpy; sys.argv = ['params', '--help']\n"
            "try:\n    runpy.run_module('stages.params', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('torch', 'numpy', 'pandas', 'pyarrow', 'sklearn', 'scipy') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.strip().splitlines()[-1] == "[]"
