"""Train on one machine, experiment on another (issue 50): the README's two blocks, run as written.

Clone A (the GPU machine) has its demo frames outside the repository, reproduces the tiny demo,
then runs the README's first block: a folder remote, commit, `dvc push`, `git push`. Clone B is
made by the README's second block with A's frames moved away: `git clone`, `dvc pull`,
`dvc exp run --pull --allow-missing -S events.median_window=5`, `dvc exp show`, `dvc metrics
diff`, `dvc plots diff`. It must exit 0, run only the stages after the changed key (with `params`
and the `index` that keeps the pulled index), and show the new score. Then, on A with its frames,
a changed label CSV reruns `index` and what follows.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from conftest import ROOT
from test_readme_experiments import TINY

HEADING = "## Train on one machine, experiment on another"
REMOTE, ORIGIN = "/srv/vce-dvc", "git@example.org:team/vce.git"  # the README's placeholders


def readme_blocks() -> list[str]:
    """The ```bash blocks under HEADING (up to the next `## ` heading)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split(f"\n{HEADING}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)```", section, re.S)


def sh(cwd: Path, script: str, timeout: int = 900) -> str:
    env = {**os.environ, "CI": "1", "DVC_NO_ANALYTICS": "1", "OMP_NUM_THREADS": "1", "GIT_AUTHOR_NAME": "ci",
           "GIT_AUTHOR_EMAIL": "ci@x", "GIT_COMMITTER_NAME": "ci", "GIT_COMMITTER_EMAIL": "ci@x"}
    env.pop("PYTHONPATH", None)  # each clone runs its own code (`python -m stages.…` from its root)
    run = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=timeout)
    output = run.stdout + run.stderr
    assert run.returncode == 0, f"`{script}` exited {run.returncode}:\n{output[-4000:]}"
    return output


def ran(output: str) -> set[str]:
    return set(re.findall(r"^Running stage '([^']+)'", output, re.M))


@pytest.fixture(scope="module")
def machines(tmp_path_factory):
    """(A, frames, outputs of B's block): A reproduced and pushed, B made by the README's block."""
    from dvc.utils.hydra import apply_overrides

    base = tmp_path_factory.mktemp("remote")
    a, frames = base / "A", base / "frames"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (a / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, a / name)
    # The tiny demo, its frames outside the repository; f1 thresholds, where the events knobs act.
    apply_overrides(str(a / "params.yaml"), [*TINY, f"data.root={frames}/galar", f"data.test_root={frames}/test",
                                             "score.test_gt=null", "thresholds.method=f1", "events.presence=none",
                                             "events.median_window=15"])
    sh(a, f"python -m stages.demo_data --out {frames} > /dev/null")
    sh(base, "git init -q --bare origin.git")
    sh(a, f"git init -q && git add -A && git commit -qm 'tiny demo' && git remote add origin {base}/origin.git"
          " && git push -q -u origin HEAD")
    sh(a, "dvc repro -q", timeout=1800)
    first, second = readme_blocks()
    sh(a, first.replace(REMOTE, str(base / "remote")))
    b = base / "B"
    b.mkdir()
    shutil.move(frames, base / "frames.away")  # machine B has no frames
    try:
        output = sh(b, second.replace(ORIGIN, str(base / "origin.git")), timeout=1800)
    finally:
        shutil.move(base / "frames.away", frames)
    return a, frames, b / "vce", output


def test_the_readme_blocks_hold_the_commands_the_issue_names():
    first, second = readme_blocks()
    assert REMOTE in first and "dvc remote add" in first and "dvc push" in first
    assert ORIGIN in second and "dvc pull" in second
    for command in ("dvc exp run --pull --allow-missing", "dvc exp show", "dvc metrics diff", "dvc plots diff"):
        assert command in second, command


def test_without_frames_only_the_stages_after_the_key_run_and_the_score_moves(machines):
    _, _, b, output = machines
    # params checks every section; index keeps the pulled index; thresholds (f1) reads no `events`.
    assert ran(output) == {"params", "index", "events", "score", "report"}, output[-4000:]
    assert "index: no frame tree on this machine" in output and "kept the index listed where they are" in output
    assert re.search(r"report: viewer: \d+ of \d+ thumbnails unavailable", output), output[-4000:]
    assert "median5" in output  # dvc exp show lists the experiment
    assert "metrics/headline/val.json" in output  # dvc metrics diff --md printed the change ...
    diff = json.loads(sh(b, "dvc metrics diff --json"))["metrics/headline/val.json"]  # ... which is real
    assert diff["map@0.5"]["old"] != diff["map@0.5"]["new"], diff
    assert (b / "dvc_plots" / "index.html").is_file()
    assert (b / "plots" / "viewer" / "index.html").is_file()


def test_a_changed_label_csv_reruns_the_index_and_what_follows_on_the_gpu_machine(machines):
    a, frames, _, _ = machines
    csv = frames / "galar" / "Labels" / "1.csv"
    table = pd.read_csv(csv)
    table.loc[10, "ulcer"] = 1 - table.loc[10, "ulcer"]
    table.to_csv(csv, index=False)
    output = sh(a, "dvc repro split")
    assert ran(output) >= {"index", "split"} and "indexed" in output
    status = sh(a, "dvc status")
    for stage in ("cache_frames", "train@0", "predict@0", "ensemble"):
        assert f"{stage}:" in status, status
