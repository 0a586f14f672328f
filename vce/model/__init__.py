"""The image model, its checkpoints and devices.

Under exact CPU numerics (`base.exact_cpu`, vce/core/exact.py) importing this package also turns
off torch's oneDNN kernels: their blocking follows the CPU's cache sizes, so they are the one
CPU path an instruction-set setting cannot pin (docs/reproducibility.md).
"""

import logging
import os
import platform
from importlib import metadata
from pathlib import Path

from vce.core.exact import MARKER, SETTINGS

LOG = logging.getLogger(__name__)


def configure_torch() -> None:
    """In a re-executed exact process: torch without oneDNN, one intra-op thread, and a warning
    when this CPU cannot run the pinned kernels. Else nothing."""
    if os.environ.get(MARKER) != "1":
        return
    import torch

    torch.backends.mkldnn.enabled = False
    torch.set_num_threads(1)
    installed = {name: _version(name) for name in PINNED_LIBRARIES}
    for caveat in numerics_caveats(torch.backends.cpu.get_cpu_capability(), platform.machine(), installed,
                                   lock_pins(Path("requirements.lock"))):
        LOG.warning("base.exact_cpu: %s: its results will differ from dvc.lock's (docs/reproducibility.md)", caveat)


PINNED_LIBRARIES = ("torch", "numpy", "scipy")  # the libraries whose kernels a training step runs


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def lock_pins(lock: Path) -> dict[str, str]:
    """`name==version` lines of requirements.lock (empty where there is none, e.g. outside the repository)."""
    try:
        lines = lock.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return {}
    return {name.strip().lower(): version.strip() for name, _, version in
            (line.partition("==") for line in lines if "==" in line and not line.startswith("#"))}


def numerics_caveats(capability: str, machine: str, installed: dict, pins: dict) -> list[str]:
    """Why this process cannot give the bytes dvc.lock records, one line each (nothing when it can):
    torch's kernels other than the pinned ones, a CPU that is not x86-64, a library version other
    than requirements.lock's pin. The vendor is pinned (MKL's COMPATIBLE branch), so it is no caveat."""
    pinned = SETTINGS["ATEN_CPU_CAPABILITY"].upper()
    caveats = []
    if capability != pinned:
        caveats.append(f"this CPU runs torch's {capability} kernels, not {pinned}")
    if machine.lower() not in ("x86_64", "amd64"):
        caveats.append(f"this is a {machine} CPU, not x86-64")
    for name, version in installed.items():
        wanted = pins.get(name)
        if wanted and version and version.split("+")[0] != wanted.split("+")[0]:
            caveats.append(f"{name} {version} is installed, requirements.lock pins {wanted}")
    return caveats


configure_torch()
