"""The numpy code each compiled kernel of `vce.post.kernels` replaced, kept verbatim as the
reference the kernels must match bit for bit (`tests/test_kernels.py`)."""

from __future__ import annotations

import numpy as np

CHUNK = 2048  # frames whose scores `chain_paths` lays out at once


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
