"""The image model, its checkpoints and devices.

Under exact CPU numerics (`base.exact_cpu`, vce/core/exact.py) importing this package also turns
off torch's oneDNN kernels: their blocking follows the CPU's cache sizes, so they are the one
CPU path an instruction-set setting cannot pin (docs/reproducibility.md).
"""

from vce.core.exact import configure_torch

configure_torch()
