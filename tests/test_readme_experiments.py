"""The README's experiment block, extracted from the README and run as written on a tiny demo.

A copy of the repository (its tracked and untracked, not ignored files: what a clone holds plus
this checkout's uncommitted work) gets tiny demo params through the same override DVC applies,
is committed, reproduced and committed again, as a user's clone after `dvc repro`. Then every
line of the README's experiment block runs in order: run, compare, apply, go back. Each command
must exit 0, the comparison must show the experiments, and at the end the workspace must be what
it was (`git status` clean, `dvc status` up to date but for the always-changed `index`, the
trained model in place).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT

# demo and training scaled to seconds, as tests/conftest.py's tiny_params, in `-S` form.
TINY = ["demo.n_videos=4", "demo.frames_per_video=240", "demo.n_test_videos=1", "demo.test_frames_per_video=120",
        "train.epochs=2", "train.batch_size=32", "train.samples_per_epoch=256", "train.num_workers=0",
        "predict.batch_size=64", "predict.num_workers=0"]


def readme_block(heading: str) -> list[str]:
    """The command lines of the first ```bash block under `heading` in README.md."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split(f"\n{heading}\n", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, f"no bash block under {heading!r}"
    return [line for line in block.group(1).splitlines() if line.strip() and not line.lstrip().startswith("#")]


def sh(cwd: Path, command: str, timeout: int = 900) -> str:
    env = {**os.environ, "CI": "1", "DVC_NO_ANALYTICS": "1", "GIT_AUTHOR_NAME": "ci", "GIT_AUTHOR_EMAIL": "ci@x",
           "GIT_COMMITTER_NAME": "ci", "GIT_COMMITTER_EMAIL": "ci@x"}
    run = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=timeout)
    assert run.returncode == 0, f"`{command}` exited {run.returncode}:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    return run.stdout + run.stderr


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """A committed copy of the repository with tiny params, after `dvc repro`, committed again."""
    from dvc.utils.hydra import apply_overrides

    repo = tmp_path_factory.mktemp("readme") / "repo"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, repo / name)
    apply_overrides(str(repo / "params.yaml"), TINY)
    sh(repo, "git init -q && git add -A && git commit -qm 'tiny demo'")
    sh(repo, "dvc repro -q", timeout=1800)
    sh(repo, "git add -A && git commit -qm 'dvc repro'")
    return repo


def test_the_readme_experiment_block_runs_as_written_and_leaves_the_workspace_as_it_was(clone):
    lines = readme_block("## Experiments")
    assert any(line.startswith("dvc exp run") for line in lines)
    way_back = next(line for line in lines if line.startswith("git checkout --"))
    assert way_back.split("#", 1)[0].rstrip().endswith("&& dvc repro"), way_back
    outputs = {line: sh(clone, line, timeout=1800) for line in lines}
    shown = next(out for line, out in outputs.items() if line.startswith("dvc exp show"))
    assert "epochs1" in shown and "frame-only" in shown, shown
    assert re.search(r"test\.json:map@0\.5", shown) and "train.epochs" in shown, shown
    diff = next(out for line, out in outputs.items() if line.startswith("dvc exp diff"))
    assert "train.epochs" in diff, diff
    # The way back takes the cached outputs from DVC's cache: no stage reruns (the run cache skips
    # every stage with a plain `cache: false` output, so `dvc repro` alone would retrain).
    assert not re.findall(r"^Running stage '(?!index)", outputs[way_back], re.M), outputs[way_back][-3000:]
    assert sh(clone, "git status --porcelain") == ""
    # `index` lists the frame trees on every run (always_changed); every other stage is up to date.
    status = sh(clone, "dvc status")
    assert status.split() in (["Data", "and", "pipelines", "are", "up", "to", "date."], ["index:", "always", "changed"]), status
    assert (clone / "models/folds/0/model.pt").is_file()
    # Issue 49: a committed dvc.lock written on another CPU names a model this machine's cache never
    # held ("dvc checkout" then failed and left no model). The way back restores this machine's run.
    lock = (clone / "dvc.lock").read_text()
    entry = lock.index("path: models/folds/0/model.pt")
    md5 = re.search(r"md5: ([0-9a-f]{32})", lock[entry:]).group(1)
    other = hashlib.md5(b"a model trained on another CPU").hexdigest()  # DVC refuses a non-md5-looking value
    (clone / "dvc.lock").write_text(lock.replace(md5, other))
    sh(clone, "git commit -qam 'a lock written on another machine'")
    (clone / "models/folds/0/model.pt").unlink()
    sh(clone, way_back)
    assert (clone / "models/folds/0/model.pt").is_file()
    status = sh(clone, "dvc status")
    assert "missing" not in status and "changed outs" not in status, status
