"""The image model, its checkpoints and devices.

Under exact CPU numerics (`base.exact_cpu`, vce/core/exact.py) importing this package also turns
off torch's oneDNN kernels: their blocking follows the CPU's cache sizes, so they are the one
CPU path an instruction-set setting cannot pin (docs/reproducibility.md).
"""

import logging
import os

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
    pinned, running = SETTINGS["ATEN_CPU_CAPABILITY"].upper(), torch.backends.cpu.get_cpu_capability()
    if running != pinned:
        LOG.warning("base.exact_cpu: this CPU runs torch's %s kernels, not %s: its results will differ "
                    "from dvc.lock's (docs/reproducibility.md)", running, pinned)


configure_torch()
