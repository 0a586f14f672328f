"""The shape DVC tracks: every file a stage runs is one of its deps, and subpackages import downwards.

A stage's in-repo import closure is computed from the source (AST), not from a hand-written
list: `dvc repro` reruns a stage exactly when a file it executes changes.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
STAGES = sorted(p.stem for p in (ROOT / "stages").glob("[a-z]*.py"))

# What each subpackage may import (besides itself). Post-processing and scoring never need torch.
ALLOWED = {
    "core": set(),
    "demo": {"core"},
    "data": {"core"},
    "model": {"core"},
    "eval": {"core"},
    "post": {"core", "eval"},
    "train": {"core", "data", "model", "eval"},
    "infer": {"core", "data", "model", "train", "eval", "post", "viewer"},
    "viewer": {"core", "eval"},  # the HTML exam viewer: only the report stage and vce.infer.detect run it
}
TORCH_FREE = ("core", "demo", "eval", "post", "viewer")
TORCH_FREE_STAGES = ("thresholds", "events", "score", "report", "index", "split", "demo_data")


def _module_file(name: str) -> Path | None:
    path = ROOT / name.replace(".", "/")
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    if path.with_suffix(".py").is_file():
        return path.with_suffix(".py")
    return None


def imported_modules(path: Path):
    """Every module name `path` imports (absolute imports; the project uses no relative ones)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import (use vce.<package>.<module>)"
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def import_closure(path: Path) -> set[Path]:
    """`path` and every in-repo file it imports, directly or not (packages' __init__ included)."""
    seen, todo = set(), [path]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        for name in imported_modules(current):
            parts = name.split(".")
            if parts[0] not in ("vce", "stages"):
                continue
            for i in range(1, len(parts) + 1):
                found = _module_file(".".join(parts[:i]))
                if found is not None:
                    todo.append(found)
    return seen


def uncovered(files: set[Path], deps: list[str]) -> list[str]:
    """Files not equal to, nor inside, one of the dependency paths."""
    dep_paths = [(ROOT / dep).resolve() for dep in deps if "$" not in dep]
    missing = []
    for file in sorted(files):
        file = file.resolve()
        if not any(file == dep or dep in file.parents for dep in dep_paths):
            missing.append(str(file.relative_to(ROOT)))
    return missing


def stage_deps() -> dict[str, list[str]]:
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    return {name: spec.get("deps", []) for name, spec in stages.items()}


@pytest.mark.parametrize("stage", STAGES)
def test_stage_deps_cover_its_import_closure(stage):
    deps = stage_deps()
    assert stage in deps, f"stages/{stage}.py is not a stage of dvc.yaml"
    assert f"python -m stages.{stage}" in yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"][stage]["cmd"]
    missing = uncovered(import_closure(ROOT / "stages" / f"{stage}.py"), deps[stage])
    assert not missing, f"dvc.yaml stage {stage} runs {missing} but does not list them in deps"


def test_removing_one_dep_is_caught():
    """The check is not vacuous: drop any vce/ folder from train's deps and it reports the files."""
    deps = stage_deps()["train"]
    closure = import_closure(ROOT / "stages" / "train.py")
    for dep in [d for d in deps if d.startswith("vce/") and (ROOT / d).is_dir()]:
        missing = uncovered(closure, [d for d in deps if d != dep])
        assert missing and all(m.startswith(dep + "/") for m in missing), dep


def test_subpackages_import_only_downwards():
    offences = []
    for package, allowed in ALLOWED.items():
        for path in sorted((ROOT / "vce" / package).glob("*.py")):
            for name in imported_modules(path):
                parts = name.split(".")
                if parts[0] == "vce" and len(parts) > 1 and parts[1] in ALLOWED:
                    if parts[1] != package and parts[1] not in allowed:
                        offences.append(f"{path.relative_to(ROOT)} imports {name}")
                if package in TORCH_FREE and parts[0] in ("torch", "torchvision", "timm"):
                    offences.append(f"{path.relative_to(ROOT)} imports {name} (must stay torch-free)")
    assert not offences, "\n".join(sorted(set(offences)))
    assert {p.name for p in (ROOT / "vce").iterdir() if p.is_dir() and p.name != "__pycache__"} <= set(ALLOWED) | {
        "model"}, "a vce/ subpackage without a rule in ALLOWED"
    assert not [p.name for p in (ROOT / "vce").glob("*.py") if p.name != "__init__.py"], "modules belong in subpackages"


@pytest.mark.parametrize("stage", TORCH_FREE_STAGES)
def test_post_processing_stages_load_without_torch(stage):
    code = f"import sys, stages.{stage}; bad = [m for m in ('torch', 'torchvision') if m in sys.modules]; print(bad)"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", f"stages.{stage} imports {result.stdout.strip()}"


def test_stages_do_not_edit_sys_path_or_import_each_other():
    for path in (ROOT / "stages").glob("*.py"):
        text = path.read_text()
        assert "sys.path" not in text, path
        others = [n for n in imported_modules(path) if n.startswith("stages.")]
        assert not others, f"{path} imports {others}"
