"""Reproducible across machines: requirements.lock pins every package requirements.txt needs (and
the tests run on exactly it); the prompts stage writes the same bytes whatever the CPU kernels."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from importlib import metadata

import yaml
from conftest import ROOT, load_stage, tiny_params
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def lines(name: str) -> list[str]:
    text = (ROOT / name).read_text()
    return [line.split("#")[0].strip() for line in text.splitlines() if line.split("#")[0].strip()]


def locked() -> dict[str, str]:
    pins = {}
    for line in lines("requirements.lock"):
        if line == "-e .":  # the project's own package, editable
            continue
        req = Requirement(line)
        spec = list(req.specifier)
        assert len(spec) == 1 and spec[0].operator == "==", f"requirements.lock: {line!r} is not name==version"
        pins[canonicalize_name(req.name)] = spec[0].version
    return pins


def test_every_direct_requirement_is_locked_within_its_range():
    pins = locked()
    for line in lines("requirements.txt"):
        req = Requirement(line)
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is in requirements.txt but not in requirements.lock (re-lock: see its header)"
        assert req.specifier.contains(pins[name], prereleases=True), \
            f"requirements.lock pins {req.name}=={pins[name]}, outside requirements.txt's {req.specifier}"
    assert pins["torch"] == "2.14.1" and pins["torchvision"] == "0.29.1"


def test_the_set_up_installs_the_package_editable_so_it_imports_from_any_folder(tmp_path):
    assert lines("requirements.lock")[-1] == "-e ."
    found = subprocess.run([sys.executable, "-c", "import vce; print(vce.__file__)"], cwd=tmp_path,
                           capture_output=True, text=True, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert found.returncode == 0, f"import vce outside the repository failed: {found.stderr.strip()[-200:]}"
    assert found.stdout.strip() == str(ROOT / "vce" / "__init__.py")  # this checkout's files, not a copy


def test_every_installed_dependency_matches_the_lock():
    """What the set-up installed is what is locked, transitive dependencies included."""
    pins = locked()
    seen, todo = set(), [Requirement(line) for line in lines("requirements.txt")]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen:
            continue
        seen.add(name)
        assert name in pins, f"{req.name} (needed by the set-up) is not pinned in requirements.lock"
        version = metadata.version(req.name)
        assert version == pins[name], f"{req.name} {version} installed, requirements.lock pins {pins[name]}"
        for spec in metadata.requires(req.name) or []:
            dep = Requirement(spec)
            if dep.marker is None or dep.marker.evaluate({"extra": ""}) or any(
                    dep.marker.evaluate({"extra": extra}) for extra in req.extras):
                todo.append(dep)


def test_prompt_embeddings_are_the_same_bytes_whatever_the_cpu_kernels(tmp_path):
    """ATEN_CPU_CAPABILITY=default runs torch's scalar kernels, as a CPU without AVX would (the
    committed dvc.lock came from a machine whose file differed from this one's)."""
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(tiny_params(tmp_path)))
    argv = ["--params", str(tmp_path / "params.yaml"), "--out"]
    assert load_stage("prompts").main([*argv, str(tmp_path / "native.pt")]) == 0  # this CPU's fastest kernels
    subprocess.run([sys.executable, "-m", "stages.prompts", *argv, str(tmp_path / "scalar.pt")], cwd=ROOT,
                   check=True, capture_output=True,
                   env={**os.environ, "OMP_NUM_THREADS": "1", "ATEN_CPU_CAPABILITY": "default"})
    native, scalar = (hashlib.md5((tmp_path / name).read_bytes()).hexdigest() for name in ("native.pt", "scalar.pt"))
    assert native == scalar


def test_bytecode_python_writes_beside_the_stage_sources_is_not_a_dvc_dependency():
    """A user's Python (no PYTHONDONTWRITEBYTECODE) writes vce/**/__pycache__/*.pyc when a stage
    imports the package; DVC must not count them, or every stage reads as changed after the
    first run and dvc.lock records machine-specific hashes (.dvcignore)."""
    from dvc.repo import Repo

    ignore = Repo(str(ROOT)).dvcignore
    for folder in ("vce", "vce/post", "vce/post/engine", "stages"):
        cache = ROOT / folder / "__pycache__"
        assert ignore.is_ignored_dir(str(cache)), f"{cache} is not in .dvcignore: DVC would hash its bytecode"
        assert ignore.is_ignored_file(str(cache / "x.cpython-311.pyc"))
        assert ignore.is_ignored_file(str(ROOT / folder / "x.pyc"))
    assert not ignore.is_ignored_file(str(ROOT / "vce" / "post" / "arhmm.py"))  # the sources still count
