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
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic


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


@intrinsic
def _fma(typingctx, a, b, c):
    """a * b + c rounded once (LLVM's fma): the step of OpenBLAS's dgemm kernels, whose dot
    products over a short axis are a0 * b0, then fma(a_k, b_k, sum) in order of k."""
    signature = types.float64(types.float64, types.float64, types.float64)

    def codegen(context, builder, sig, args):
        double = ir.DoubleType()
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(double, [double] * 3), "llvm.fma.f64")
        return builder.call(fma, args)

    return signature, codegen


@njit(cache=True)
def _dot(m, rows, weights, j):
    """sum_k m[rows[k]] * weights[k, j], as numpy's matmul gives it (`_fma`)."""
    if len(rows) == 0:
        return 0.0
    total = m[rows[0]] * weights[0, j]
    for k in range(1, len(rows)):
        total = _fma(m[rows[k]], weights[k, j], total)
    return total


@njit(cache=True)
def _forward_step(m, out, lik, reset, position, off, on, from_off, from_on, x):
    """out = m @ (transfer matrix at `position`): trans[i, j] * lik[2 x_i + x_j, position],
    split by the state left (off rows, then on rows) as `chain_posterior`'s numpy step; a
    reset sends every state's mass to phase 0 (their sum in order)."""
    n = len(m)
    if reset[position]:
        total = m[0]
        for k in range(1, n):
            total += m[k]
        out[:] = 0.0
        out[0] = total
        return
    for j in range(n):
        entered_off = _dot(m, off, from_off, j) * lik[x[j], position]
        entered_on = _dot(m, on, from_on, j) * lik[2 + x[j], position]
        out[j] = entered_off + entered_on


@njit(cache=True)
def _divide_by_max(m):
    """m / max(m) in place; returns the max."""
    top = m[0]
    for j in range(1, len(m)):
        if m[j] > top:
            top = m[j]
    for j in range(len(m)):
        m[j] = m[j] / top
    return top


@njit(cache=True)
def block_products(lik, reset, off, on, from_off, from_on, x, block, product, scale):
    """Step 1 of `chain_posterior`: each block's product of its `block` transfer matrices, row
    by row (row i: the state the block is entered from), each step's row divided by its max and
    the log of that max added to scale[b, i]. `lik` (4, blocks x block), `reset` (blocks x block,);
    writes `product` (blocks, n, n) and `scale` (blocks, n)."""
    n = len(x)
    row, out = np.empty(n), np.empty(n)
    for b in range(product.shape[0]):
        for i in range(n):
            row[:] = 0.0
            row[i] = 1.0
            total = 0.0
            for r in range(block):
                _forward_step(row, out, lik, reset, b * block + r, off, on, from_off, from_on, x)
                total += np.log(_divide_by_max(out))
                row[:] = out
            product[b, i] = row
            scale[b, i] = total


@njit(cache=True)
def block_posteriors(lik, reset, off, on, from_off, from_on, x, block, into, out_of, posterior):
    """Step 3 of `chain_posterior`: inside each block, the forward messages from into[b], then
    backwards from out_of[b] the posterior P(on) at each position into `posterior` (blocks x block,),
    every message divided by its max, the sums in the order numpy's did them."""
    n = len(x)
    forward = np.empty((block, n))
    alpha, beta, out = np.empty(n), np.empty(n), np.empty(n)
    low, high = np.empty(n), np.empty(n)
    for b in range(into.shape[0]):
        alpha[:] = into[b]
        for r in range(block):
            _forward_step(alpha, out, lik, reset, b * block + r, off, on, from_off, from_on, x)
            _divide_by_max(out)
            alpha[:] = out
            forward[r] = out
        beta[:] = out_of[b]
        for r in range(block - 1, -1, -1):
            position = b * block + r
            joint_on, joint = 0.0, 0.0
            for k in range(len(on)):
                value = forward[r, on[k]] * beta[on[k]]
                joint_on = value if k == 0 else joint_on + value
            for j in range(n):
                value = forward[r, j] * beta[j]
                joint = value if j == 0 else joint + value
            posterior[position] = joint_on / joint
            # beta <- (transfer matrix at position) @ beta, split by the state left.
            if reset[position]:
                out[:] = beta[0]
            else:
                for j in range(n):
                    low[j] = beta[j] * lik[x[j], position]
                    high[j] = beta[j] * lik[2 + x[j], position]
                for k in range(len(off)):
                    out[off[k]] = _dot_rows(low, from_off, k)
                for k in range(len(on)):
                    out[on[k]] = _dot_rows(high, from_on, k)
            _divide_by_max(out)
            beta[:] = out


@njit(cache=True)
def _dot_rows(m, weights, k):
    """sum_j m[j] * weights[k, j], as numpy's matmul m @ weights.T gives it (`_fma`)."""
    total = m[0] * weights[k, 0]
    for j in range(1, len(m)):
        total = _fma(m[j], weights[k, j], total)
    return total
