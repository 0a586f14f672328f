"""Finding runs decoded by an autoregressive HMM: steps placed to the frame in correlated noise.

A frame model's errors persist from frame to frame (consecutive frames look alike), so a
label's logit l_t is modelled as an AR(1) process whose level steps while the label is on
(state x_t = 1), the model of a step in AR(1) noise (Hamilton's Markov-switching
autoregression, with the switch in the intercept):

    l_t = a + b x_t + g x_{t-1} + rho l_{t-1} + u_t,   u_t ~ N(0, sigma^2)

(a step of height s in AR(1) noise gives b = s, g = -rho s; both are fitted freely). A threshold
on l_t reads the level, which correlated noise moves far and slowly; the innovation u_t is
small and white, so the step stands out at the frame where it happens.

The on and off states are each made of length phases (`phase_chain`): geometric stretches
whose mixture is fitted to the tuning ground truth's run and gap lengths (`fit_phases`). One
switch rate per state would say that a gap lasts as long as the mean gap, hundreds of frames,
so a new run a few frames after the last one costs as much as a run in a long silence; the
ground truth's runs come in clusters, most gaps a few frames long. The most probable path
(Viterbi over the phases, on the scores of consecutive on/off pairs) gives the runs.

- `fit_ar_model`: least squares over consecutive observed, labelled tuning frames, and the phases.
- `ar_runs`: the decoded runs of one label on a timeline, trimmed to their observed frames.
- `chain_path`: that Viterbi, one video and one frame at a time, compiled (`vce.post.kernels`;
  `chain_paths`: several chains; `ar_decode_all` decodes several labels).
- `chain_posterior`: the same chain's forward-backward, P(on) at every position, blocked.
- `ar_posterior_runs`: the runs of that posterior above some levels that the path did not
  decode, the other answers where a boundary or a short gap is uncertain.

On `bench.simulate` (AR(1) noise) this decoder lifts the held-out mAP far above thresholded
runs; the engine still picks it per label only where it wins on the tuning videos.
"""

from __future__ import annotations

import json

import numpy as np
from scipy.special import expit, logit

from vce.post.anatomy import label_logits
from vce.post.kernels import block_posteriors, block_products, innovation_pairs, viterbi_path
from vce.post.runs import last_axis_max, runs_of

MIN_POSITIVE_FRAMES = 20  # fewer positive tuning frames (or fewer than 2 runs): no model
PHASE_LENGTHS = 10  # stretches per length phase at least (`fit_phases`)
EM_STEPS = 200  # EM iterations of `fit_phases`
BLOCK = 512  # positions per block of `chain_posterior`
# What a fitted model must hold for the decoder (`fit_ar_model`; `separation` is informative only).
AR_MODEL_KEYS = ("a", "b", "g", "rho", "sigma", "p01", "p10", "off_phases", "on_phases")


def fit_ar_model(logits: np.ndarray, truth: np.ndarray, off_phases: int = 1, on_phases: int = 1) -> dict | None:
    """The AR(1) switching model of one label, from (P,) logits and (P,) int8 truth (1 on, 0 off,
    -1 unobserved or unlabelled), or None with too few positive frames or runs.

    Returns a, b, g, rho, sigma (the module formula), the switch rates p01 (off -> on) and p10
    (on -> off) with add-one smoothing, `separation` = b / sigma (the step in innovation units:
    the signal the decoder has to work with), and the length phases of the off gaps and the on
    runs (`fit_phases`, `off_phases` and `on_phases` of them) that the decoder's chain is built of."""
    pairs = np.flatnonzero((truth[1:] >= 0) & (truth[:-1] >= 0)) + 1  # t: both t - 1 and t labelled
    on, before = truth[pairs].astype(np.float64), truth[pairs - 1].astype(np.float64)
    starts = int(((before == 0) & (on == 1)).sum())
    if on.sum() < MIN_POSITIVE_FRAMES or starts < 2:
        return None
    # Least squares through the normal equations: the (4, 4) Gram matrix of the design columns
    # [1, x_t, x_{t-1}, l_{t-1}] from dot products, not the (N, 4) design itself (N ~ 2 M frames).
    columns = (np.ones(len(pairs)), on, before, logits[pairs - 1])
    target = logits[pairs]
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):  # OpenBLAS's threaded dot costs ~3x the CPU here, and its bits vary with the threads
        gram = np.array([[np.dot(u, w) for w in columns] for u in columns])
        moments = np.array([np.dot(u, target) for u in columns])
    coef, *_ = np.linalg.lstsq(gram, moments, rcond=None)
    a, b, g, rho = (float(c) for c in coef)
    sigma = max(float(np.std(target - a - b * on - g * before - rho * columns[3])), 1e-3)
    ends = int(((before == 1) & (on == 0)).sum())
    p01 = (starts + 1) / (float((before == 0).sum()) + 2)
    p10 = (ends + 1) / (float((before == 1).sum()) + 2)
    off_lengths, on_lengths = state_lengths(truth)
    return {"a": a, "b": b, "g": g, "rho": rho, "sigma": sigma, "p01": p01, "p10": p10, "separation": b / sigma,
            "off_phases": fit_phases(off_lengths, off_phases, p01), "on_phases": fit_phases(on_lengths, on_phases, p10)}


def state_lengths(truth: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(off lengths, on lengths): the frames of each stretch of one state in (P,) int8 truth,
    a stretch ending where the state changes or the truth stops (-1: unobserved, unlabelled)."""
    labelled = truth >= 0
    change = np.flatnonzero(np.diff(truth) != 0) + 1
    edges = np.concatenate([[0], change, [len(truth)]])
    value = truth[edges[:-1]]
    lengths = np.diff(edges)
    return lengths[(value == 0) & labelled[edges[:-1]]], lengths[value == 1]


def fit_phases(lengths: np.ndarray, n: int, rate: float) -> list:
    """[[weight, exit rate], ...]: `n` geometric phases whose mixture fits the stretch `lengths`
    (maximum likelihood, by EM from the lengths' quantiles); one phase is [[1, rate]], the
    add-one switch rate. Fewer than `PHASE_LENGTHS` lengths per phase: fewer phases."""
    n = max(1, min(n, len(lengths) // PHASE_LENGTHS))
    if n == 1:
        return [[1.0, float(rate)]]
    lengths = np.asarray(lengths, np.float64)
    exit_rate = np.clip(1 / np.quantile(lengths, np.linspace(0.1, 0.9, n)), 1e-9, 1 - 1e-9)  # (n,) short to long
    weight = np.full(n, 1 / n)
    for _ in range(EM_STEPS):
        # E: each length's responsibility per phase; M: the weighted geometric fits.
        log_p = np.log(weight)[:, None] + np.log(exit_rate)[:, None] + (lengths - 1) * np.log1p(-exit_rate)[:, None]
        share = np.exp(log_p - log_p.max(axis=0))
        share /= share.sum(axis=0)
        weight = share.sum(axis=1) / len(lengths)
        exit_rate = np.clip(share.sum(axis=1) / (share @ lengths), 1e-9, 1 - 1e-9)
    return [[float(w), float(p)] for w, p in zip(weight, exit_rate)]


def innovation_scores(logits: np.ndarray, observed: np.ndarray, model: dict) -> np.ndarray:
    """(4, P) the Gaussian innovation's log density of each (x_{t-1}, x_t) pair at t, rows 00,
    01, 10, 11 (up to a shared constant; 0 unless t and t - 1 are both observed); compiled
    (`vce.post.kernels.innovation_pairs`: numpy's temporaries of every row cost ~0.3 s a decoding)."""
    scores = np.empty((4, len(logits)))
    innovation_pairs(np.asarray(logits, np.float64), np.asarray(observed, bool), float(model["a"]),
                     float(model["rho"]), float(model["b"]), float(model["g"]), float(model["sigma"]), scores)
    return scores


def phase_chain(model: dict, bias: float) -> tuple[np.ndarray, np.ndarray]:
    """(log transition matrix (n, n), on (n,) bool) of the model's phase chain: its off phases
    (longest first: state 0, where every video starts), then its on phases (`fit_phases`).

    A phase (weight w, exit rate p) lasts a geometric number of frames of mean 1 / p; leaving
    it enters a phase of the other state, picked by weight. So a gap is short or long as its
    phase is, the way a label's ground truth holds clusters of runs a few frames apart and long
    silences between them — which one geometric length (one switch rate) cannot say. Each exit
    rate is shifted by `bias` log-odds. One phase each is the two-state chain of p01 and p10."""
    off = sorted(model["off_phases"], key=lambda phase: phase[1])
    on = model["on_phases"]
    phases = [(w, _shifted(p, bias), False) for w, p in off] + [(w, _shifted(p, bias), True) for w, p in on]
    log_trans = np.full((len(phases), len(phases)), -np.inf)
    for i, (_, exit_rate, state) in enumerate(phases):
        log_trans[i, i] = np.log1p(-exit_rate)
        for j, (weight, _, other) in enumerate(phases):
            if other != state:
                log_trans[i, j] = np.log(exit_rate * weight)
    return log_trans, np.array([state for _, _, state in phases])


def _shifted(rate: float, bias: float) -> float:
    return float(expit(logit(rate) + bias))


def chain_path(emission: np.ndarray, log_trans: np.ndarray, on: np.ndarray, first, last) -> np.ndarray:
    """(P,) int8 on/off of the most probable path of a phase chain through each video's positions
    [first[v], last[v]], every video starting in state 0 (ties go to the lower state: off).

    `emission` (4, P): the score of each (x_{t-1}, x_t) on/off pair at t, rows 00, 01, 10, 11
    (`innovation_scores`); `log_trans` (n, n) and `on` (n,): `phase_chain`. One chain of
    `chain_paths`, which decodes several."""
    return chain_paths([emission], [(log_trans, on)], first, last)[0]


def chain_paths(emissions: list, chains: list, first, last) -> list[np.ndarray]:
    """`chain_path` of several chains on the same videos: per chain i, the path of
    `emissions[i]` (4, P) under `chains[i]` = (log_trans, on).

    The textbook Viterbi recursion, one video and one frame at a time, compiled
    (`vce.post.kernels.viterbi_path`: the sums and ties of the numpy layout it replaced)."""
    lengths = np.asarray(last, np.int64) - np.asarray(first, np.int64) + 1
    starts = np.asarray(first, np.int64)
    paths = []
    for emission, (log_trans, on) in zip(emissions, chains):
        path = np.zeros(emission.shape[1], np.int8)
        if len(lengths):
            viterbi_path(np.ascontiguousarray(emission, np.float64), np.ascontiguousarray(log_trans, np.float64),
                         np.asarray(on, np.int8), starts, lengths, path)
        paths.append(path)
    return paths


def chain_posterior(emission: np.ndarray, log_trans: np.ndarray, on: np.ndarray, first, last,
                    block: int = BLOCK, compiled: bool | None = None) -> np.ndarray:
    """(P,) the posterior probability that the label is on at each position, for the phase
    chain of `chain_path` (same arguments, the same videos [first[v], last[v]] each starting in
    state 0): forward-backward, summed over the paths where `chain_path` takes the best one.

    Scaled forward-backward, blocked: the product of each `block` positions' transfer matrices
    (transition x pair emission), every block on its own; one pass over the blocks in order
    (forwards, then backwards) for the messages at the block edges; then the positions inside
    every block. A video's start is a reset (every state goes to state 0 there), so videos never
    see each other. Each pair's emission is floored 300 nats below the position's best pair: no
    path is impossible, so no message underflows to zero.

    Steps 1 and 3 run compiled (`vce.post.kernels`) where that gives numpy's bits: numpy laid
    them out over all blocks at once, and its matrix products are BLAS's dgemm, which the
    kernels' fused multiply-adds repeat; with one phase in a state, one block or over 7 phases
    numpy reached BLAS's matrix-vector kernels or its pairwise sums, rounded otherwise, and the
    numpy steps run (`compiled`: None as said, False the numpy steps, True the kernels)."""
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
    # The transfer matrix at t is trans[i, j] * lik[2 x_i + x_j, t]: split by the state left,
    # m @ M_t = (m[.., off] @ trans[off]) * lik[x_j, t] + (m[.., on] @ trans[on]) * lik[2 + x_j, t].
    trans = np.exp(log_trans)
    if compiled is None:
        compiled = blocks > 1 and 2 <= x.sum() <= n - 2 and n <= 7
    steps = _CompiledSteps(lik, reset, trans, x, block) if compiled else _NumpySteps(lik, reset, trans, x, block)
    # 1. Each block's product, row-scaled (a row is the state the block is entered from):
    #    scale[b, i] the log of what was divided out of row i.
    product, scale = steps.products()
    # 2. The messages at the block edges: forward into each block, backward out of it.
    into, out_of = np.zeros((blocks, n)), np.zeros((blocks, n))
    message = np.zeros(n)
    message[0] = 1.0
    with np.errstate(divide="ignore"):
        for b in range(blocks):
            into[b] = message
            weight = np.log(message) + scale[b]
            message = _normalised(np.exp(weight - weight.max()) @ product[b])
        message = np.ones(n)
        for b in range(blocks - 1, -1, -1):
            out_of[b] = message
            weight = np.log(product[b] @ message) + scale[b]
            message = np.exp(weight - weight.max())
    # 3. Inside the blocks: forward, then backward with the posterior.
    return steps.posterior(into, out_of)[:size]


def _normalised(m: np.ndarray) -> np.ndarray:
    """Messages divided by their largest entry (last axis; one message: its max, the same value)."""
    return m / m.max() if m.ndim == 1 else m / last_axis_max(m)[..., None]


class _CompiledSteps:
    """Steps 1 and 3 of `chain_posterior`, block by block (`vce.post.kernels`)."""

    def __init__(self, lik, reset, trans, x, block):
        self.blocks, self.n = lik.shape[1] // block, len(x)
        self.chain = (lik, reset, np.flatnonzero(~x), np.flatnonzero(x), trans[~x], trans[x], x.astype(np.int64), block)

    def products(self) -> tuple[np.ndarray, np.ndarray]:
        product, scale = np.empty((self.blocks, self.n, self.n)), np.empty((self.blocks, self.n))
        block_products(*self.chain, product, scale)
        return product, scale

    def posterior(self, into: np.ndarray, out_of: np.ndarray) -> np.ndarray:
        posterior = np.empty(self.blocks * self.chain[-1])
        block_posteriors(*self.chain, into, out_of, posterior)
        return posterior


class _NumpySteps:
    """Steps 1 and 3 of `chain_posterior`, every block at once, one numpy step per offset in the block."""

    def __init__(self, lik, reset, trans, x, block):
        self.blocks, self.block, self.n, self.x = lik.shape[1] // block, block, len(x), x
        self.from_off, self.from_on = trans[~x], trans[x]
        self.rows = np.flatnonzero(~x), np.flatnonzero(x)
        self.code = x.astype(np.int64), 2 + x.astype(np.int64)  # the pair row entered from off / from on, per state
        # Laid out by offset inside the block: offset r reads one contiguous (blocks, 4) slab.
        self.laid = _by_offset(lik, self.blocks, block)  # (block, blocks, 4)
        self.resets = reset.reshape(self.blocks, block).T.copy()  # (block, blocks)

    def step(self, m: np.ndarray, r: int) -> np.ndarray:  # m (blocks, [n,] n) times every block's transfer at offset r
        x, n = self.x, self.n
        shape = (self.blocks,) + (1,) * (m.ndim - 2) + (n,)
        flat = m.reshape(-1, n)  # one matrix product per state left, over every block's rows
        out = (flat[:, ~x] @ self.from_off).reshape(m.shape)
        out *= self.laid[r][:, self.code[0]].reshape(shape)
        entered_on = (flat[:, x] @ self.from_on).reshape(m.shape)
        entered_on *= self.laid[r][:, self.code[1]].reshape(shape)
        out += entered_on
        restart = self.resets[r]
        if restart.any():
            out[restart] = 0.0
            out[restart, ..., 0] = m[restart].sum(axis=-1)
        return out

    def back(self, m: np.ndarray, r: int) -> np.ndarray:  # every block's transfer at offset r times m (blocks, n)
        here = self.laid[r]
        lo, hi = m * here[:, self.code[0]], m * here[:, self.code[1]]
        out = np.empty_like(m)
        out[:, self.rows[0]] = lo @ self.from_off.T
        out[:, self.rows[1]] = hi @ self.from_on.T
        out[self.resets[r]] = m[self.resets[r], :1]
        return out

    def products(self) -> tuple[np.ndarray, np.ndarray]:
        product = np.broadcast_to(np.eye(self.n), (self.blocks, self.n, self.n)).copy()
        scale = np.zeros((self.blocks, self.n))
        for r in range(self.block):
            product = self.step(product, r)
            top = last_axis_max(product)
            scale += np.log(top)
            product /= top[:, :, None]
        return product, scale

    def posterior(self, into: np.ndarray, out_of: np.ndarray) -> np.ndarray:
        forward = np.empty((self.block, self.blocks, self.n))
        alpha = into
        for r in range(self.block):
            alpha = _normalised(self.step(alpha, r))
            forward[r] = alpha
        posterior = np.empty((self.block, self.blocks))
        beta = out_of
        for r in range(self.block - 1, -1, -1):
            joint = forward[r] * beta
            posterior[r] = joint[:, self.x].sum(axis=1) / joint.sum(axis=1)
            beta = _normalised(self.back(beta, r))
        return posterior.T.reshape(-1)


def _by_offset(lik: np.ndarray, blocks: int, block: int) -> np.ndarray:
    """(block, blocks, 4) of (4, blocks x block) `lik`: [r, b] the pair scores of position
    b x block + r. Copied a few blocks at a time: a whole transposed copy misses the cache on every write."""
    blocked = lik.reshape(4, blocks, block)
    out = np.empty((block, blocks, 4))
    for b in range(0, blocks, 64):
        out[:, b:b + 64] = blocked[:, b:b + 64].transpose(2, 1, 0)
    return out


def ar_runs(timeline, k: int, model: dict, bias: float) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) dense positions of label k's decoded runs on `timeline` (each video decoded
    on its own, from off at the position before its first frame, so no run spans two; trimmed
    to their first and last observed frame; a run of unobserved positions only is dropped).
    Kept in the timeline's cache: the engine asks again for the runs it picked."""
    return _cached(timeline, k, model, bias)[:2]


def ar_run_strength(timeline, k: int, model: dict, bias: float) -> np.ndarray:
    """(R,) each of `ar_runs`' runs' log-likelihood ratio against the label being off there,
    per frame, of the innovations alone: entering at its start, staying on through it, leaving
    after its end — how clearly the logits say the run is there, frame for frame. The length
    prior is left out: amortised over a run, its switch costs would rank every short run last,
    and short runs are the ones the decoder places to the frame most often."""
    return _cached(timeline, k, model, bias)[2]


def ar_posterior_runs(timeline, k: int, model: dict, bias: float, levels) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(starts, ends, strength) of label k's runs where the chain's posterior (`chain_posterior`)
    that it is on exceeds each of `levels`, other than the decoded runs (`ar_runs`) and each
    other; trimmed as those, with `ar_run_strength`'s strength.

    The most probable path is one answer per run; where a boundary or a short gap is uncertain,
    the runs of the posterior at several levels are its other answers: a merge the path did not
    make, a gap it did, an end a few frames away (appended after a present label's decoded runs,
    they cannot lower its AP)."""
    key = ("ar-posterior", k, float(bias), tuple(float(level) for level in levels), json.dumps(model, sort_keys=True))
    if key not in timeline.prob_cums:
        scores, log_trans, on, first, last = _chain(timeline, label_logits(timeline, k), model, bias)
        posterior = chain_posterior(scores, log_trans, on, first, last)
        decoded = set(zip(*(a.tolist() for a in ar_runs(timeline, k, model, bias))))
        found: dict = {}
        for level in levels:
            for start, end in zip(*(a.tolist() for a in _observed_runs(posterior > level, timeline))):
                if (start, end) not in decoded:
                    found.setdefault((start, end), None)
        spans = np.array(list(found), np.int64).reshape(-1, 2)
        starts, ends = spans[:, 0].copy(), spans[:, 1].copy()
        timeline.prob_cums[key] = starts, ends, _strength(scores, starts, ends)
    return timeline.prob_cums[key]


def ar_decode_all(timeline, decodings) -> None:
    """Decode every (k, model, bias) of `decodings` that the timeline's cache lacks (`chain_paths`),
    into the cache `ar_runs` and `ar_run_strength` read."""
    for k, model, bias in decodings:
        key = _key(k, model, bias)
        if key not in timeline.prob_cums:
            scores, log_trans, on, first, last = _chain(timeline, label_logits(timeline, k), model, bias)
            path = chain_path(scores, log_trans, on, first, last)
            starts, ends = _observed_runs(path.astype(bool), timeline)
            timeline.prob_cums[key] = starts, ends, _strength(scores, starts, ends)


def _key(k: int, model: dict, bias: float) -> tuple:
    return ("ar", k, float(bias), json.dumps(model, sort_keys=True))


def _cached(timeline, k: int, model: dict, bias: float) -> tuple:
    """Both, decoded once per (label, model, bias) on the logits of the timeline's probabilities."""
    ar_decode_all(timeline, [(k, model, bias)])
    return timeline.prob_cums[_key(k, model, bias)]


def _chain(timeline, logits: np.ndarray, model: dict, bias: float) -> tuple:
    """What `chain_path` and `chain_posterior` read: the (4, P) `innovation_scores`, the
    `phase_chain`, and each video's positions: from the (unobserved) position before its first
    frame, off there, to the next one's."""
    first = np.asarray(timeline.video_first, np.int64) - 1
    last = np.append(first[1:] - 1, len(timeline.observed) - 1)
    log_trans, on = phase_chain(model, bias)
    return innovation_scores(logits, timeline.observed, model), log_trans, on, first, last


def _observed_runs(on: np.ndarray, timeline) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the runs of (P,) bool `on`, trimmed to their first and last observed
    position of `timeline`; runs of unobserved positions only are dropped."""
    starts, ends = runs_of(on)
    next_seen, last_seen = _seen_bounds(timeline)
    starts, ends = next_seen[starts], last_seen[ends]
    keep = starts <= ends
    return starts[keep], ends[keep]


def _seen_bounds(timeline) -> tuple[np.ndarray, np.ndarray]:
    """(P,) the first observed position at or after each position (P if none) and the last one
    at or before it (-1 if none), cached on `timeline` (every decoding trims its runs by them)."""
    if "seen_bounds" not in timeline.prob_cums:
        observed = timeline.observed
        positions = np.arange(len(observed))
        next_seen = np.minimum.accumulate(np.where(observed, positions, len(observed))[::-1])[::-1]
        last_seen = np.maximum.accumulate(np.where(observed, positions, -1))
        timeline.prob_cums["seen_bounds"] = next_seen, last_seen
    return timeline.prob_cums["seen_bounds"]


def _strength(scores: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """`ar_run_strength` of runs (starts, ends) from the (4, P) `innovation_scores`."""
    stay = np.concatenate([[0.0], np.cumsum(scores[3] - scores[0])])  # on -> on against off -> off
    after = np.minimum(ends + 1, scores.shape[1] - 1)
    ratio = (scores[1, starts] - scores[0, starts]) + (stay[ends + 1] - stay[starts + 1]) + \
        (scores[2, after] - scores[0, after])
    return ratio / (ends - starts + 1)
