"""The image model, its checkpoints and devices.

Under exact CPU numerics (`base.exact_cpu`, vce/core/exact.py) importing this package also turns
off torch's oneDNN kernels: their blocking follows the CPU's cache sizes, so they are the one
CPU path an instruction-set setting cannot pin (docs/reproducibility.md).
"""

import os

from vce.core.exact import MARKER


def configure_torch() -> None:
    """In a re-executed exact process: torch without oneDNN, one intra-op thread. Else nothing."""
    if os.environ.get(MARKER) != "1":
        return
    import torch

    torch.backends.mkldnn.enabled = False
    torch.set_num_threads(1)


configure_torch()
