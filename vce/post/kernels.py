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


LANES = 64  # blocks of `chain_posterior` stepped together: the innermost loops run over them (SIMD)


@njit(cache=True, inline="always")
def _lay_lanes(lik, reset, first_block, block, here, restart):
    """here[r, code, lane] = lik[code, position], restart[r, lane] = reset[position] of position
    r of block first_block + lane, for the blocks that exist (the other lanes keep stale values:
    they are computed, never read)."""
    for lane in range(min(here.shape[2], len(reset) // block - first_block)):
        start = (first_block + lane) * block
        for r in range(block):
            for code in range(4):
                here[r, code, lane] = lik[code, start + r]
            restart[r, lane] = reset[start + r]


@njit(cache=True, inline="always")
def _dot_lanes(m, rows, weights, j, out):
    """out[lane] = sum_k m[rows[k], lane] * weights[k, j], as numpy's matmul gives it: a0 * b0,
    then `_fma` in order of k (0 with no rows)."""
    if len(rows) == 0:
        out[:] = 0.0
        return
    weight, source = weights[0, j], m[rows[0]]
    for lane in range(len(out)):
        out[lane] = source[lane] * weight
    for k in range(1, len(rows)):
        weight, source = weights[k, j], m[rows[k]]
        for lane in range(len(out)):
            out[lane] = _fma(source[lane], weight, out[lane])


@njit(cache=True, inline="always")
def _forward_lanes(m, out, here, restart, off, on, from_off, from_on, x, entered_off, entered_on):
    """out = m @ (each lane's transfer matrix at one position) for (n, lanes) `m`: trans[i, j] x
    here[2 x_i + x_j, lane], split by the state left (off rows, then on rows) as the numpy step
    of `chain_posterior` did; a reset sends every state's mass to phase 0 (their sum in order)."""
    n, lanes = m.shape
    for j in range(n):
        _dot_lanes(m, off, from_off, j, entered_off)
        _dot_lanes(m, on, from_on, j, entered_on)
        low, high = here[x[j]], here[2 + x[j]]
        for lane in range(lanes):
            out[j, lane] = entered_off[lane] * low[lane] + entered_on[lane] * high[lane]
    for lane in range(lanes):
        if restart[lane]:
            total = m[0, lane]
            for k in range(1, n):
                total += m[k, lane]
            for j in range(n):
                out[j, lane] = 0.0
            out[0, lane] = total


@njit(cache=True, inline="always")
def _divide_by_max(m, top):
    """m[:, lane] divided by its max over the first axis, in place; top[lane] that max."""
    top[:] = m[0]
    for j in range(1, m.shape[0]):
        for lane in range(m.shape[1]):
            if m[j, lane] > top[lane]:
                top[lane] = m[j, lane]
    for j in range(m.shape[0]):
        for lane in range(m.shape[1]):
            m[j, lane] = m[j, lane] / top[lane]


@njit(cache=True, inline="always")
def _dot_states(m, rows, weights, out):
    """out[rows[k], lane] = sum_j m[j, lane] * weights[k, j], as numpy's matmul m @ weights.T gives it (`_fma`)."""
    for k in range(len(rows)):
        target = out[rows[k]]
        weight, source = weights[k, 0], m[0]
        for lane in range(target.shape[0]):
            target[lane] = source[lane] * weight
        for j in range(1, m.shape[0]):
            weight, source = weights[k, j], m[j]
            for lane in range(target.shape[0]):
                target[lane] = _fma(source[lane], weight, target[lane])


@njit(cache=True)
def block_products(lik, reset, off, on, from_off, from_on, x, block, product, scale):
    """Step 1 of `chain_posterior`: each block's product of its `block` transfer matrices, row
    by row (row i: the state the block is entered from), each step's row divided by its max and
    the log of that max added to scale[b, i]. `lik` (4, blocks x block) the pair scores, `reset`
    (blocks x block,); `off`, `on` the phases of each state, `from_off`, `from_on` their rows of
    the transition matrix, `x` (n,) each phase's state; writes `product` (blocks, n, n) and
    `scale` (blocks, n). `LANES` blocks at a time, the rows of all of them stepped together."""
    n, blocks = len(x), product.shape[0]
    here, restart = np.ones((block, 4, LANES)), np.zeros((block, LANES), np.bool_)
    rows, out, total = np.empty((n, n, LANES)), np.empty((n, LANES)), np.empty((n, LANES))
    entered_off, entered_on, top = np.empty(LANES), np.empty(LANES), np.empty(LANES)
    for first_block in range(0, blocks, LANES):
        _lay_lanes(lik, reset, first_block, block, here, restart)
        rows[:] = 0.0
        for i in range(n):
            rows[i, i] = 1.0
        total[:] = 0.0
        for r in range(block):
            for i in range(n):
                _forward_lanes(rows[i], out, here[r], restart[r], off, on, from_off, from_on, x, entered_off,
                               entered_on)
                _divide_by_max(out, top)
                for lane in range(LANES):
                    total[i, lane] += np.log(top[lane])
                rows[i] = out
        for lane in range(min(LANES, blocks - first_block)):
            product[first_block + lane] = rows[:, :, lane]
            scale[first_block + lane] = total[:, lane]


@njit(cache=True)
def block_posteriors(lik, reset, off, on, from_off, from_on, x, block, into, out_of, posterior):
    """Step 3 of `chain_posterior`: inside each block, the forward messages from into[b], then
    backwards from out_of[b] the posterior P(on) at each position into `posterior` (blocks x block,),
    every message divided by its max, the sums in the order numpy's did them (arguments: `block_products`)."""
    n, blocks = len(x), into.shape[0]
    here, restart = np.ones((block, 4, LANES)), np.zeros((block, LANES), np.bool_)
    forward, alpha, beta = np.empty((block, n, LANES)), np.empty((n, LANES)), np.empty((n, LANES))
    out, low, high = np.empty((n, LANES)), np.empty((n, LANES)), np.empty((n, LANES))
    entered_off, entered_on, top = np.empty(LANES), np.empty(LANES), np.empty(LANES)
    joint_on, joint = np.empty(LANES), np.empty(LANES)
    for first_block in range(0, blocks, LANES):
        width = min(LANES, blocks - first_block)
        _lay_lanes(lik, reset, first_block, block, here, restart)
        alpha[:] = 1.0
        beta[:] = 1.0
        for lane in range(width):
            alpha[:, lane] = into[first_block + lane]
            beta[:, lane] = out_of[first_block + lane]
        for r in range(block):
            _forward_lanes(alpha, out, here[r], restart[r], off, on, from_off, from_on, x, entered_off, entered_on)
            _divide_by_max(out, top)
            alpha[:] = out
            forward[r] = out
        for r in range(block - 1, -1, -1):
            # The posterior: the forward times the backward message, its on phases' share (sums in order).
            joint_on[:] = 0.0
            for k in range(len(on)):
                for lane in range(LANES):
                    value = forward[r, on[k], lane] * beta[on[k], lane]
                    joint_on[lane] = value if k == 0 else joint_on[lane] + value
            for j in range(n):
                for lane in range(LANES):
                    value = forward[r, j, lane] * beta[j, lane]
                    joint[lane] = value if j == 0 else joint[lane] + value
            for lane in range(width):
                posterior[(first_block + lane) * block + r] = joint_on[lane] / joint[lane]
            # beta <- (transfer matrix at r) @ beta, split by the state left; a reset: beta[0] everywhere.
            pairs = here[r]
            for j in range(n):
                for lane in range(LANES):
                    low[j, lane] = beta[j, lane] * pairs[x[j], lane]
                    high[j, lane] = beta[j, lane] * pairs[2 + x[j], lane]
            _dot_states(low, off, from_off, out)
            _dot_states(high, on, from_on, out)
            for lane in range(LANES):
                if restart[r, lane]:
                    for j in range(n):
                        out[j, lane] = beta[0, lane]
            _divide_by_max(out, top)
            beta[:] = out


@njit(cache=True)
def majority_runs(active, observed, half):
    """(starts, ends) inclusive positions of the runs of the median-filtered (P,) bool `active`:
    a position is on when it is `observed` and more than half of the observed positions of its
    window (t - half .. t + half, clipped to the axis) are active, a tie keeping its own value.
    The window's counts slide one position a step (whole numbers: the same counts as numpy's
    prefix-sum differences in `vce.post.events.smooth_runs`)."""
    size = len(active)
    starts, ends = np.empty(size // 2 + 1, np.int64), np.empty(size // 2 + 1, np.int64)
    n_active = n_observed = 0
    for r in range(min(half, size)):  # the window of position 0 without its right end
        n_active += active[r]
        n_observed += observed[r]
    n_runs, inside = 0, False
    for t in range(size):
        if t + half < size:
            n_active += active[t + half]
            n_observed += observed[t + half]
        if t - half - 1 >= 0:
            n_active -= active[t - half - 1]
            n_observed -= observed[t - half - 1]
        twice = 2 * n_active
        on = observed[t] and (twice > n_observed or (twice == n_observed and active[t]))
        if on and not inside:
            starts[n_runs], inside = t, True
        elif inside and not on:
            ends[n_runs], inside = t - 1, False
            n_runs += 1
    if inside:
        ends[n_runs] = size - 1
        n_runs += 1
    return starts[:n_runs].copy(), ends[:n_runs].copy()


@njit(cache=True, inline="always")
def _maximum(a, b):
    """np.maximum of two floats: a NaN on either side wins."""
    return a if a >= b or a != a else b


@njit(cache=True)
def monotone_forward(scores, switch_penalty, low, high, best, enters):
    """The forward pass of `vce.post.anatomy.monotone_path`: writes D_k(t) into `best` (T, K)
    and the value of entering k at frame tau into `enters` (T, K), state by state as the numpy
    layout did (prefix sums in frame order, the window maximum of van Herk / Gil-Werman blocks
    with np.maximum's operands in its order). `low`, `high` (K,) int64 the duration bounds,
    1 <= low <= high, high <= T unless low > T (a state the video is too short for)."""
    n_frames, n_states = scores.shape
    prefix, below = np.empty(n_frames), np.full(n_frames, -np.inf)
    forward, backward = np.empty(n_frames), np.empty(n_frames)
    for k in range(n_states):
        # Trailing maximum of enters over `width` frames: from each block's start forwards, from
        # its end (or the last frame) backwards; a window spans two blocks at most. A window
        # as long as the video: the running maximum (one block, read forwards only). The
        # position inside a block is counted, not divided out (a division a frame costs more
        # than the rest of the step).
        whole = high[k] - low[k] + 1 >= n_frames
        width = min(high[k] - low[k] + 1, n_frames)
        at = 0  # t's position in its block
        for t in range(n_frames):
            prefix[t] = scores[0, k] if t == 0 else prefix[t - 1] + scores[t, k]
            enters[t, k] = 0.0 if t == 0 else below[t - 1] - switch_penalty - prefix[t - 1]
            forward[t] = enters[t, k] if at == 0 else _maximum(forward[t - 1], enters[t, k])
            at = 0 if at == width - 1 else at + 1
        if not whole:
            at = (n_frames - 1) % width
            for t in range(n_frames - 1, -1, -1):
                block_end = at == width - 1 or t == n_frames - 1
                backward[t] = enters[t, k] if block_end else _maximum(backward[t + 1], enters[t, k])
                at = width - 1 if at == 0 else at - 1
        for t in range(n_frames):
            reachable = -np.inf
            if t >= low[k] - 1:
                tau = t - low[k] + 1  # the latest entry frame; the window ends there
                reachable = forward[tau] if whole or tau < width - 1 else \
                    _maximum(backward[tau - width + 1], forward[tau])
            best[t, k] = prefix[t] + reachable
            below[t] = _maximum(below[t], best[t, k])


@njit(cache=True)
def innovation_pairs(logits, observed, a, rho, b, g, sigma, scores):
    """`vce.post.arhmm.innovation_scores` in one pass: writes into `scores` (4, P), row 2i + j,
    -z^2 / 2 with z = (x_t - a - rho x_{t-1} - b j - g i) / sigma where t and t - 1 are both
    observed (x_{-1} = x_0), else 0; the operations in the numpy expression's order."""
    for t in range(len(logits)):
        base = (logits[t] - a) - rho * logits[max(t - 1, 0)]
        both = t > 0 and observed[t] and observed[t - 1]
        for i in range(2):
            for j in range(2):
                z = ((base - b * j) - g * i) / sigma
                scores[2 * i + j, t] = (-0.5 * z) * z if both else 0.0
