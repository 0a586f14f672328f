"""Exact CPU numerics: the same bytes on any x86-64 CPU with AVX2 and any core count (`base.exact_cpu`).

Float results on a CPU depend on the instruction set each library picks at run time (AVX2 or
AVX-512 kernels sum in other orders, their exp/log differ in the last bit) and on how many
threads split a reduction. A tiny model trained for eight epochs turns one-ulp differences into
other weights, so a second machine would get another demo model and another `dvc.lock`.

With `base.exact_cpu: true` a stage started from the command line re-executes itself once,
before numpy or torch is imported, with every library pinned to one code path and one thread:

- ATen (torch's CPU kernels): `ATEN_CPU_CAPABILITY=avx2` (AVX2 kernels even on an AVX-512 CPU);
- MKL (torch's matmul, convolution's GEMM and ATen's VML exp/log): conditional numerical
  reproducibility on its vendor-neutral branch, `MKL_CBWR=COMPATIBLE` (SSE4.2 at most). MKL picks
  its code by CPU vendor: on its AVX2 branch an AMD CPU ran other kernels than an Intel one (8 of
  the 26 ops of ../shared/numerics_probe.py differ under qemu's EPYC model, none under its Haswell
  model; docs/reproducibility.md);
- AdamW runs fused (`fused=True` in every optimiser): the unfused step's `sqrt` goes through MKL's
  VML, which is not correctly rounded and differs by vendor on every MKL branch;
- oneDNN (torch's convolutions): off (`vce.model.configure_torch`, when `vce.model` is imported; capped at
  SSE4.1 besides), since its blocking follows the CPU's cache sizes;
- numpy's own SIMD loops: `NPY_DISABLE_CPU_FEATURES` lists every dispatched feature;
- OpenBLAS (numpy and scipy): one generic core type, `OPENBLAS_CORETYPE=Prescott`;
- one thread everywhere (`OMP_NUM_THREADS`, `MKL_NUM_THREADS`, `OPENBLAS_NUM_THREADS`).

AVX2 rather than the baseline (SSE2) kernels: training runs 2.2x faster (0.22 against 0.48 s per
demo step, docs/reproducibility.md) and every x86-64 CPU since 2015 has it. A CPU without it runs
other kernels: `vce.model.configure_torch` then warns that the bytes will differ from `dvc.lock`'s.

The switch is the demo's (CPU, tiny model): a real run sets it false and keeps every fast path.
It does not touch GPU kernels. What it costs is in docs/reproducibility.md.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import yaml

MARKER = "VCE_EXACT_CPU"  # set in the re-executed process: never re-execute twice

# numpy 2.x groups (X86_V3 …) and the older single-feature names: unknown names are ignored.
NUMPY_DISPATCHED = ("X86_V3 X86_V4 AVX512_ICL AVX512_SPR AVX512_SKX AVX512_CLX AVX512_CNL AVX512F AVX512CD "
                    "AVX512_KNL AVX512_KNM AVX2 FMA3 F16C AVX")

SETTINGS = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "COMPATIBLE",
    "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
    "ONEDNN_MAX_CPU_ISA": "SSE41",
    "DNNL_MAX_CPU_ISA": "SSE41",
    "NPY_DISABLE_CPU_FEATURES": NUMPY_DISPATCHED,
    "OPENBLAS_CORETYPE": "Prescott",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
}


def exact_env(environ: dict[str, str]) -> dict[str, str]:
    """`environ` with every library pinned to one code path and one thread, and the marker."""
    return {**environ, **SETTINGS, MARKER: "1"}


def wanted(params_path: str | Path) -> bool:
    """Whether `params_path` asks for exact CPU numerics (`base.exact_cpu: true`).

    Read leniently: a params file that is missing or broken answers False here, and the stage
    then reports it with its usual one-line error."""
    try:
        base = (yaml.safe_load(Path(params_path).read_text(encoding="utf-8")) or {}).get("base") or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError, AttributeError):
        return False
    return base.get("exact_cpu") is True


def params_argument(argv: list[str]) -> str:
    """The `--params` value of a stage's command line (its default `params.yaml`)."""
    for i, arg in enumerate(argv):
        if arg == "--params" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--params="):
            return arg.split("=", 1)[1]
    return "params.yaml"


def pinned(environ: dict[str, str]) -> bool:
    """Whether `environ` already pins every library as `exact_env` does (the re-executed process).
    The settings themselves are checked, not only the marker: a marker leaked into a user's
    shell (`export VCE_EXACT_CPU=1`) must not turn the pinning off."""
    return environ.get(MARKER) == "1" and all(environ.get(key) == value for key, value in SETTINGS.items())


def reexec_if_wanted(argv: list[str] | None = None) -> None:
    """Re-execute this command under `exact_env` when its params ask for it (never returns then).

    A no-op when already pinned and for `--help`. The libraries read these settings once, when
    they load; a fresh interpreter loads them again under the pins, so one already imported here
    (a start-up hook importing numpy, a module importing it at its top) costs only its import
    time, never exactness. Stages still import them inside `main` (`--help` stays fast:
    tests/test_stages_cli.py)."""
    argv = sys.argv[1:] if argv is None else argv
    if pinned(dict(os.environ)) or {"-h", "--help"} & set(argv):
        return
    if not wanted(params_argument(argv)):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], exact_env(dict(os.environ)))
