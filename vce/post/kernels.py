"""Compiled loops (numba, CPU) of the decoders' frame-by-frame recursions.

A recursion over the frames of a video cannot be laid out in numpy without one Python step per
frame (134 k at Galar size). Each kernel here does the arithmetic of the numpy code it replaced,
in the same order (the same sums, the same max and its tie-breaking), so it gives the same bits;
`tests/test_kernels.py` holds each to that numpy code (`tests/reference_kernels.py`) on random
cases. `cache=True` keeps the compiled code beside this file (`__pycache__`), so only the first
call on a machine compiles (a few seconds).
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def viterbi_path(emission, trans, on, starts, lengths, path):
    """The most probable path of one phase chain through each video's positions
    starts[v] .. starts[v] + lengths[v] - 1, from phase 0 at its first position: writes each
    position's state (`on` (n,) int8 of its phase) into `path` (P,) int8.

    `emission` (4, P) the pair scores (`innovation_scores`, rows 00, 01, 10, 11), `trans` (n, n)
    the log transitions. Step t: delta_j = max_i delta_i + (emission + transition), the first i
    on a tie (numpy's argmax), the sums `vce.post.arhmm.chain_paths` laid out in numpy."""
    n = len(on)
    back = np.zeros((max(lengths.max(), 1) if len(lengths) else 1, n), np.int8)
    delta = np.empty(n)
    new = np.empty(n)
    for v in range(len(starts)):
        start, length = starts[v], lengths[v]
        delta[:] = -np.inf
        delta[0] = 0.0
        for t in range(1, length):
            position = start + t
            for j in range(n):
                best, arg = -np.inf, 0
                for i in range(n):
                    option = delta[i] + (emission[2 * on[i] + on[j], position] + trans[i, j])
                    if option > best:
                        best, arg = option, i
                new[j] = best
                back[t, j] = arg
            delta[:] = new
        state = 0
        for j in range(1, n):
            if delta[j] > delta[state]:
                state = j
        for t in range(length - 1, -1, -1):
            path[start + t] = on[state]
            if t:
                state = back[t, state]
