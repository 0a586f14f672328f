"""The numpy code each compiled kernel of `vce.post.kernels` replaced, kept verbatim as the
reference the kernels must match bit for bit (`tests/test_kernels.py`)."""

from __future__ import annotations

import numpy as np

from vce.post.runs import last_axis_max, runs_of

CHUNK = 2048  # frames whose scores `chain_paths` lays out at once
BLOCK = 512  # positions per block of `chain_posterior`


def chain_paths(emissions: list, chains: list, first, last) -> list[np.ndarray]:
    """`chain_path` of several chains on the same videos: per chain i, the path of
    `emissions[i]` (4, P) under `chains[i]` = (log_trans, on), each as `chain_path` alone gives it.

    The textbook Viterbi recursion, one frame at a time but every (video, chain) at once (longest
    video first, so the rows still running are a prefix), the scores of a chunk of frames laid
    out together. A chain of fewer phases is padded with unreachable ones (-inf transitions,
    after its own, so they never win a max nor an argmax tie) and computes exactly the sums it
    computes alone. Each step holds only the sum and the max; the back pointers of a chunk are
    the argmax of the same sums, recomputed for the whole chunk in one pass."""
    n_chains = len(chains)
    size = emissions[0].shape[1] if n_chains else 0
    paths = [np.zeros(size, np.int8) for _ in range(n_chains)]
    lengths = np.asarray(last, np.int64) - np.asarray(first, np.int64) + 1
    if len(lengths) == 0 or n_chains == 0:
        return paths
    n = max(len(on) for _, on in chains)
    x = np.zeros((n_chains, n), np.int64)  # padded phases: off (their pair row is never reached)
    trans = np.full((n_chains, n, n), -np.inf)
    for c, (log_trans, on) in enumerate(chains):
        x[c, :len(on)] = np.asarray(on, np.int64)
        trans[c, :len(on), :len(on)] = log_trans
    pair = 2 * x[:, :, None] + x[:, None, :]  # (C, n, n) emission row of a state pair
    order = np.argsort(-lengths, kind="stable")
    starts, lengths = np.asarray(first, np.int64)[order], lengths[order]
    n_videos, longest = len(lengths), int(lengths[0])
    running = n_chains * np.searchsorted(-lengths, -np.arange(longest), side="left")  # rows longer than t
    rows = n_videos * n_chains  # row v * C + c: video order[v], chain c
    chunk_size = max(1, CHUNK * 80 // max(rows, 80))  # frames laid out at once: CHUNK for up to 80 rows
    # 1. Forward: delta[j, r], the best score of a path of row r in state j at t; back[t, j, r]
    #    its state at t - 1. Rows last (R contiguous): the max over the previous state is then
    #    a reduction over the leading axis, several times cheaper than over a middle one of 5.
    delta = np.full((n, rows), -np.inf)
    delta[0] = 0.0
    back = np.zeros((longest, n, rows), np.int8)
    running = running.tolist()
    for chunk in range(1, longest, chunk_size):
        stop, width = min(chunk + chunk_size, longest), running[chunk]
        positions = np.minimum(starts[None, :width // n_chains] + np.arange(chunk, stop)[:, None], size - 1)
        scores = np.empty((stop - chunk, n, n, width))  # (L, n_i, n_j, R)
        for c in range(n_chains):
            laid = emissions[c][:, positions][pair[c]] + trans[c][:, :, None, None]  # (n, n, L, V)
            scores[..., c::n_chains] = laid.transpose(2, 0, 1, 3)
        # history[i]: delta at t - 1 for t = chunk + i (zeros where a row has ended: never read).
        history = np.zeros((stop - chunk + 1, n, width))
        history[0] = delta[:, :width]
        # Every row of the chunk at every step: a row that has ended computes sums that are never
        # read (its delta is taken at its last step), cheaper than slicing the rows still running.
        options = np.empty((n, n, width))
        for i in range(stop - chunk):
            np.add(history[i][:, None], scores[i], out=options)
            np.maximum.reduce(options, axis=0, out=history[i + 1])  # np.max without its wrapper
        ends = np.minimum(np.repeat(lengths[:width // n_chains], n_chains), stop) - chunk  # each row's last step
        delta[:, :width] = history[ends, :, np.arange(width)].T
        # The same sums for the whole chunk: their argmax is each step's back pointer.
        for t in range(chunk, stop, 64):
            end, w = min(t + 64, stop), running[t]
            sums = history[t - chunk:end - chunk, :, None, :w] + scores[t - chunk:end - chunk, ..., :w]
            back[t:end, :, :w] = sums.argmax(axis=1)
    # 2. Backward from each row's best last state.
    state = delta.argmax(axis=0)
    states = np.empty((longest, rows), np.int8)
    index = np.arange(rows)
    for t in range(longest - 1, -1, -1):
        w = running[t]
        states[t, :w] = state[:w]
        if t:
            state[:w] = back[t, state[:w], index[:w]]
    for v in range(n_videos):
        for c in range(n_chains):
            paths[c][starts[v]:starts[v] + lengths[v]] = x[c][states[:lengths[v], v * n_chains + c]]
    return paths


def chain_posterior(emission: np.ndarray, log_trans: np.ndarray, on: np.ndarray, first, last,
                    block: int = BLOCK) -> np.ndarray:
    """(P,) the posterior probability that the label is on at each position, for the phase
    chain of `chain_path` (same arguments, the same videos [first[v], last[v]] each starting in
    state 0): forward-backward, summed over the paths where `chain_path` takes the best one.

    Scaled forward-backward, blocked so that numpy works on all positions at once: the product
    of each `block` positions' transfer matrices (transition x pair emission), every block in
    parallel; one pass over the blocks in order (forwards, then backwards) for the messages at
    the block edges; then the positions inside every block, in parallel again. A video's start
    is a reset (every state goes to state 0 there), so videos never see each other. Each
    pair's emission is floored 300 nats below the position's best pair: no path is impossible,
    so no message underflows to zero."""
    n, x = len(on), np.asarray(on, bool)
    size = emission.shape[1]
    if size == 0 or len(first) == 0:  # no video (an empty test set): no position is ever on
        return np.zeros(size)
    blocks = -(-size // block)
    lik = np.ones((4, blocks * block))
    lik[:, :size] = np.exp(np.maximum(emission - emission.max(axis=0), -300.0))
    reset = np.ones(blocks * block, bool)
    reset[:size] = False
    reset[np.asarray(first, np.int64)] = True
    reset[:int(np.min(first)) + 1] = True  # positions before every video
    trans = np.exp(log_trans)
    # The transfer matrix at t is trans[i, j] * lik[2 x_i + x_j, t]: split by the state left,
    # m @ M_t = (m[.., off] @ trans[off]) * lik[x_j, t] + (m[.., on] @ trans[on]) * lik[2 + x_j, t].
    from_off, from_on = trans[~x], trans[x]
    rows = np.flatnonzero(~x), np.flatnonzero(x)
    code = x.astype(np.int64), 2 + x.astype(np.int64)  # the pair row entered from off / from on, per state
    # Laid out by offset inside the block: offset r reads one contiguous (blocks, 4) slab.
    laid, resets = _by_offset(lik, blocks, block), reset.reshape(blocks, block).T.copy()  # (block, blocks, 4), (block, blocks)

    def step(m: np.ndarray, r: int) -> np.ndarray:  # m (blocks, [n,] n) times every block's transfer at offset r
        shape = (blocks,) + (1,) * (m.ndim - 2) + (n,)
        flat = m.reshape(-1, n)  # one matrix product per state left, over every block's rows
        out = (flat[:, ~x] @ from_off).reshape(m.shape)
        out *= laid[r][:, code[0]].reshape(shape)
        entered_on = (flat[:, x] @ from_on).reshape(m.shape)
        entered_on *= laid[r][:, code[1]].reshape(shape)
        out += entered_on
        restart = resets[r]
        if restart.any():
            out[restart] = 0.0
            out[restart, ..., 0] = m[restart].sum(axis=-1)
        return out

    def back(m: np.ndarray, r: int) -> np.ndarray:  # every block's transfer at offset r times m (blocks, n)
        here = laid[r]
        lo, hi = m * here[:, code[0]], m * here[:, code[1]]
        out = np.empty_like(m)
        out[:, rows[0]] = lo @ from_off.T
        out[:, rows[1]] = hi @ from_on.T
        out[resets[r]] = m[resets[r], :1]
        return out

    def normalised(m: np.ndarray) -> np.ndarray:
        return m / last_axis_max(m)[..., None]

    # 1. Each block's product, row-scaled (a row is the state the block is entered from):
    #    scale[b, i] the log of what was divided out of row i.
    product = np.broadcast_to(np.eye(n), (blocks, n, n)).copy()
    scale = np.zeros((blocks, n))
    for r in range(block):
        product = step(product, r)
        top = last_axis_max(product)
        scale += np.log(top)
        product /= top[:, :, None]
    # 2. The messages at the block edges: forward into each block, backward out of it.
    into, out_of = np.zeros((blocks, n)), np.zeros((blocks, n))
    message = np.zeros(n)
    message[0] = 1.0
    with np.errstate(divide="ignore"):
        for b in range(blocks):
            into[b] = message
            weight = np.log(message) + scale[b]
            message = normalised(np.exp(weight - weight.max()) @ product[b])
        message = np.ones(n)
        for b in range(blocks - 1, -1, -1):
            out_of[b] = message
            weight = np.log(product[b] @ message) + scale[b]
            message = np.exp(weight - weight.max())
    # 3. Inside the blocks, in parallel: forward, then backward with the posterior.
    forward = np.empty((block, blocks, n))
    alpha = into
    for r in range(block):
        alpha = normalised(step(alpha, r))
        forward[r] = alpha
    posterior = np.empty((block, blocks))
    beta = out_of
    for r in range(block - 1, -1, -1):
        joint = forward[r] * beta
        posterior[r] = joint[:, x].sum(axis=1) / joint.sum(axis=1)
        beta = normalised(back(beta, r))
    return posterior.T.reshape(-1)[:size]


def _by_offset(lik: np.ndarray, blocks: int, block: int) -> np.ndarray:
    """(block, blocks, 4) of (4, blocks x block) `lik`: [r, b] the pair scores of position
    b x block + r. Copied a few blocks at a time: a whole transposed copy misses the cache on every write."""
    blocked = lik.reshape(4, blocks, block)
    out = np.empty((block, blocks, 4))
    for b in range(0, blocks, 64):
        out[:, b:b + 64] = blocked[:, b:b + 64].transpose(2, 1, 0)
    return out


def majority_runs(active: np.ndarray, observed: np.ndarray, half: int) -> tuple[np.ndarray, np.ndarray]:
    """Step 2 of `vce.post.events.smooth_runs` (half > 0) and the runs of its mask, from prefix sums."""
    observed_cum = np.concatenate([[0], np.cumsum(observed, dtype=np.int64)])
    size = len(active)
    active_cum = np.concatenate([[0], np.cumsum(active, dtype=np.int32)])
    width = 2 * half + 1
    active_count = np.zeros(size, dtype=np.int32)
    observed_count = np.zeros(size, dtype=np.int32)
    if size >= width:
        active_count[half : size - half] = active_cum[width:] - active_cum[: size - width + 1]
        observed_count[half : size - half] = (
            observed_cum[width:] - observed_cum[: size - width + 1]
        )
    # The first and last `half` positions (separators on a timeline built with enough reach;
    # everything on one shorter than the window, e.g. an empty test set): the window clipped.
    edges = np.unique(np.r_[0:min(half, size), max(size - half, 0):size])
    hi, lo = np.minimum(edges + half + 1, size), np.maximum(edges - half, 0)
    active_count[edges] = active_cum[hi] - active_cum[lo]
    observed_count[edges] = observed_cum[hi] - observed_cum[lo]
    twice = 2 * active_count
    active = observed & ((twice > observed_count) | ((twice == observed_count) & active))
    return runs_of(active)


def _trailing_max(x: np.ndarray, width: int) -> np.ndarray:
    """out[t] = max(x[max(0, t - width + 1) : t + 1]) in O(T) (van Herk / Gil-Werman blocks)."""
    n = len(x)
    if width >= n:
        return np.maximum.accumulate(x)
    blocks = -(-n // width)
    padded = np.full(blocks * width, -np.inf)
    padded[:n] = x
    grid = padded.reshape(blocks, width)
    forward = np.maximum.accumulate(grid, axis=1).ravel()  # max from the block start to t
    backward = np.maximum.accumulate(grid[:, ::-1], axis=1)[:, ::-1].ravel()  # max from t to the block end
    out = forward[:n].copy()
    t = np.arange(width - 1, n)
    out[width - 1 :] = np.maximum(backward[t - width + 1], forward[t])
    return out


def monotone_forward(scores: np.ndarray, switch_penalty: float, low: np.ndarray, high: np.ndarray):
    """(best, enters) (T, K) of `vce.post.anatomy.monotone_path`'s forward pass, in numpy."""
    n_frames, n_states = scores.shape
    prefix = np.cumsum(scores, axis=0)  # (T, K): S_k(t)
    best = np.empty((n_frames, n_states))  # D_k(t)
    enters = np.empty((n_frames, n_states))  # value of entering k at frame tau (for the backtrack)
    below_best = np.full(n_frames, -np.inf)  # M_{k-1}(t) = max_{j<k} D_j(t)
    for k in range(n_states):
        # Value of entering k at frame tau (tau = 0: the path starts in k, no penalty).
        enter = enters[:, k]
        enter[0] = 0.0
        enter[1:] = below_best[:-1] - switch_penalty - prefix[:-1, k]
        # In k at t: entered at tau in [t - high + 1, t - low + 1].
        reachable = np.full(n_frames, -np.inf)
        if low[k] <= n_frames:
            window = _trailing_max(enter, int(high[k] - low[k] + 1))
            reachable[low[k] - 1 :] = window[: n_frames - low[k] + 1]
        best[:, k] = prefix[:, k] + reachable
        below_best = np.maximum(below_best, best[:, k])
    return best, enters


def innovation_scores(logits: np.ndarray, observed: np.ndarray, model: dict) -> np.ndarray:
    """(4, P) the Gaussian innovation's log density of each (x_{t-1}, x_t) pair at t, rows 00,
    01, 10, 11 (up to a shared constant; 0 unless t and t - 1 are both observed)."""
    prev = np.empty_like(logits)
    prev[0], prev[1:] = logits[0], logits[:-1]
    both = observed.copy()
    both[0] = False
    both[1:] &= observed[:-1]
    scores = np.empty((4, len(logits)))
    base = logits - model["a"] - model["rho"] * prev
    for i in (0, 1):
        for j in (0, 1):
            z = (base - model["b"] * j - model["g"] * i) / model["sigma"]
            scores[2 * i + j] = np.where(both, -0.5 * z * z, 0.0)
    return scores
