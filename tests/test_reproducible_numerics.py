"""`base.exact_cpu`: the tiny model trains to the same bytes under other instruction sets and threads.

A second machine is simulated on this one by the settings that differ between CPUs: which
kernels ATen, MKL and numpy dispatch to, and how many threads split the work. With exact CPU
numerics on (the demo's default) both runs give identical weights; with it off the same two
settings give other weights, which is what a second machine got before (the control that shows
the test can fail).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, prepare_demo

from vce.core import exact

# Two "machines": the widest kernels this CPU offers with two threads, and SSE-only with one. The
# switch pins AVX2 over both, so the second stands for what a machine's environment may ask, not
# for a CPU without AVX2 (that one is warned: test_a_cpu_without_the_pinned_kernels_…).
WIDE = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "OMP_NUM_THREADS": "2",
        "MKL_NUM_THREADS": "2"}
NARROW = {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "OMP_NUM_THREADS": "1",
          "MKL_NUM_THREADS": "1", "NPY_DISABLE_CPU_FEATURES": "X86_V3 X86_V4"}
SETTINGS = tuple(exact.SETTINGS) + ("MKL_ENABLE_INSTRUCTIONS", exact.MARKER)


def clean_env(extra: dict) -> dict:
    """This process's environment without any numerics setting, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in SETTINGS}
    return {**env, "CI": "1", **extra}


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("exact")
    args = prepare_demo(tmp_path, train={"epochs": 1, "samples_per_epoch": 128, "mixup_alpha": 0.0})
    return tmp_path, args


def train(tmp_path: Path, args, exact_cpu: bool, env: dict, name: str) -> bytes:
    """Train the tiny model as the pipeline does (`python -m stages.train`), return its state's bytes."""
    params = yaml.safe_load((tmp_path / "params.yaml").read_text())
    params["base"]["exact_cpu"] = exact_cpu
    params_path = tmp_path / f"params_{name}.yaml"
    params_path.write_text(yaml.safe_dump(params))
    out = tmp_path / name
    argv = list(args["train"])
    argv[argv.index("--params") + 1] = str(params_path)
    for flag, file in (("--model-out", "model.pt"), ("--state-dir", "state"), ("--metrics", "train.json"),
                       ("--live-dir", "live")):
        argv[argv.index(flag) + 1] = str(out / file)
    run = subprocess.run([sys.executable, "-m", "stages.train", *argv], cwd=ROOT, env=clean_env(env),
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    import torch

    state = torch.load(out / "model.pt", map_location="cpu", weights_only=True)["state_dict"]
    return b"".join(tensor.numpy().tobytes() for _, tensor in sorted(state.items()))


def test_exact_numerics_give_the_same_weights_under_other_kernels_and_threads(demo):
    tmp_path, args = demo
    assert train(tmp_path, args, True, WIDE, "exact_wide") == train(tmp_path, args, True, NARROW, "exact_narrow")


def test_without_exact_numerics_the_same_two_settings_differ(demo):
    # The control: if the two settings gave the same bytes anyway, the test above would prove nothing.
    tmp_path, args = demo
    assert train(tmp_path, args, False, WIDE, "fast_wide") != train(tmp_path, args, False, NARROW, "fast_narrow")


PROBE = textwrap.dedent("""
    import json, os, sys
    from vce.core import runner

    @runner.stage
    def main(argv=None):
        import torch

        import vce.model  # noqa: F401  (configures torch under exact numerics)
        from numpy._core._multiarray_umath import __cpu_features__ as features
        print(json.dumps({"aten": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
                          "marker": os.environ.get("VCE_EXACT_CPU"), "numpy_v3": features.get("X86_V3", False),
                          "onednn": torch.backends.mkldnn.enabled,
                          "argv": sys.argv[1:]}))

    main()
""")


def probe(tmp_path: Path, exact_cpu, *extra: str) -> dict:
    """What a stage started from the command line runs under, for a params file with `exact_cpu`."""
    import json

    params = tmp_path / "p.yaml"
    params.write_text(yaml.safe_dump({"base": {"seed": 1, "exact_cpu": exact_cpu}}))
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    run = subprocess.run([sys.executable, str(script), "--params", str(params), *extra], cwd=ROOT,
                         env=clean_env(WIDE), capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_a_stage_reexecutes_with_avx2_kernels_and_one_thread(tmp_path):
    seen = probe(tmp_path, True, "--x", "a b")
    assert seen == {"aten": "AVX2", "threads": 1, "marker": "1", "numpy_v3": False, "onednn": False, "argv": [
        "--params", str(tmp_path / "p.yaml"), "--x", "a b"]}


def test_without_the_switch_a_stage_keeps_the_machines_kernels(tmp_path):
    seen = probe(tmp_path, False)
    assert seen["marker"] is None and seen["threads"] == 2 and seen["onednn"]


def test_a_cpu_without_the_pinned_kernels_is_told_its_bytes_will_differ(monkeypatch, caplog):
    import torch

    import vce.model

    monkeypatch.setenv(exact.MARKER, "1")
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", True)
    threads = torch.get_num_threads()
    try:
        for capability, warned in (("DEFAULT", True), ("AVX512", True), ("AVX2", False)):
            monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda c=capability: c)
            caplog.clear()
            vce.model.configure_torch()
            assert torch.get_num_threads() == 1 and not torch.backends.mkldnn.enabled
            message = f"this CPU runs torch's {capability} kernels, not AVX2: its results will differ from dvc.lock's"
            assert (message in caplog.text) is warned, caplog.text
    finally:
        torch.set_num_threads(threads)


def test_what_the_pin_cannot_hold_is_named_in_one_line_each(tmp_path):
    """Issue 49: a stage says before the work why its bytes may differ from dvc.lock's."""
    from vce.model import lock_pins, numerics_caveats

    lock = tmp_path / "requirements.lock"
    lock.write_text("# comment==x\ntorch==2.14.1\nnumpy==2.4.6\n-e .\n")
    pins = lock_pins(lock)
    assert pins == {"torch": "2.14.1", "numpy": "2.4.6"}
    assert lock_pins(tmp_path / "missing.lock") == {}
    same = {"torch": "2.14.1+cu130", "numpy": "2.4.6", "scipy": "1.0"}
    assert numerics_caveats("AVX2", "x86_64", same, pins) == []
    assert numerics_caveats("AVX2", "aarch64", same, pins) == ["this is a aarch64 CPU, not x86-64"]
    assert numerics_caveats("AVX2", "x86_64", {**same, "numpy": "2.5.0"}, pins) == [
        "numpy 2.5.0 is installed, requirements.lock pins 2.4.6"]
    assert numerics_caveats("DEFAULT", "x86_64", same, {}) == ["this CPU runs torch's DEFAULT kernels, not AVX2"]


def test_only_true_switches_it_on_and_a_broken_params_file_is_left_to_the_stage(tmp_path):
    path = tmp_path / "p.yaml"
    for text, expected in (("base: {exact_cpu: true}", True), ("base: {exact_cpu: 'yes'}", False),
                           ("base: {seed: 1}", False), ("[unclosed", False), ("- a list", False)):
        path.write_text(text)
        assert exact.wanted(path) is expected, text
    assert exact.wanted(tmp_path / "missing.yaml") is False


def test_the_params_argument_is_found_in_either_spelling():
    assert exact.params_argument(["--fold", "0"]) == "params.yaml"
    assert exact.params_argument(["--params", "x.yaml"]) == "x.yaml"
    assert exact.params_argument(["--params=y.yaml", "--fold", "1"]) == "y.yaml"


def test_numpy_imported_before_main_or_a_leaked_marker_still_gives_a_pinned_run(tmp_path):
    """Issue 48, WEAK: a start-up hook importing numpy was a traceback blaming the stage; a
    `VCE_EXACT_CPU=1` leaked into the shell silently turned the re-execution off. Now the
    process re-executes pinned (a fresh interpreter loads numpy again under the pins).
    Mutations killed: trusting the marker alone (no re-execution), refusing loaded modules."""
    params = tmp_path / "p.yaml"
    params.write_text("base: {exact_cpu: true}")
    code = (f"import numpy, os\nfrom vce.core.exact import reexec_if_wanted\nreexec_if_wanted(['--params', {str(params)!r}])\n"
            "print(os.environ.get('ATEN_CPU_CAPABILITY'), os.environ.get('OMP_NUM_THREADS'))")
    for leaked in ({}, {exact.MARKER: "1"}):
        run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=clean_env(leaked), capture_output=True, text=True)
        assert (run.returncode, run.stdout, run.stderr) == (0, "avx2 1\n", ""), leaked
