"""Finding runs decoded by an autoregressive two-state HMM: steps placed to the frame in correlated noise.

A frame model's errors persist from frame to frame (consecutive frames look alike), so a
label's logit l_t is modelled as an AR(1) process whose level steps while the label is on
(state x_t = 1), the model of a step in AR(1) noise (Hamilton's Markov-switching
autoregression, with the switch in the intercept):

    l_t = a + b x_t + g x_{t-1} + rho l_{t-1} + u_t,   u_t ~ N(0, sigma^2)

(a step of height s in AR(1) noise gives b = s, g = -rho s; both are fitted freely). A threshold
on l_t reads the level, which correlated noise moves far and slowly; the innovation u_t is
small and white, so the step stands out at the frame where it happens. The states follow a
Markov chain whose switch rates are the tuning ground truth's (each shifted by `bias` log-odds);
the most probable path (Viterbi on the scores of consecutive state pairs) gives the runs.

- `fit_ar_model`: least squares over consecutive observed, labelled tuning frames.
- `ar_runs`: the decoded runs of one label on a timeline, trimmed to their observed frames.
- `two_state_path`: that Viterbi in numpy — max-plus products of 2x2 matrices, scanned inside
  blocks and carried across them — O(P log B) work instead of a Python loop over P frames.

On `bench.simulate` (AR(1) noise) this decoder lifts the held-out mAP far above thresholded
runs; the engine still picks it per label only where it wins on the tuning videos.
"""

from __future__ import annotations

import numpy as np

from vce.post.anatomy import clipped_logits

MIN_POSITIVE_FRAMES = 20  # fewer positive tuning frames (or fewer than 2 runs): no model
BLOCK = 1024  # frames per scanned block of `two_state_path`


def fit_ar_model(logits: np.ndarray, truth: np.ndarray) -> dict | None:
    """The AR(1) switching model of one label, from (P,) logits and (P,) int8 truth (1 on, 0 off,
    -1 unobserved or unlabelled), or None with too few positive frames or runs.

    Returns a, b, g, rho, sigma (the module formula), the switch rates p01 (off -> on) and p10
    (on -> off) with add-one smoothing, and `separation` = b / sigma (the step in innovation
    units: the signal the decoder has to work with)."""
    pairs = np.flatnonzero((truth[1:] >= 0) & (truth[:-1] >= 0)) + 1  # t: both t - 1 and t labelled
    on, before = truth[pairs].astype(np.float64), truth[pairs - 1].astype(np.float64)
    starts = int(((before == 0) & (on == 1)).sum())
    if on.sum() < MIN_POSITIVE_FRAMES or starts < 2:
        return None
    design = np.stack([np.ones(len(pairs)), on, before, logits[pairs - 1]], axis=1)  # (N, 4)
    coef, *_ = np.linalg.lstsq(design, logits[pairs], rcond=None)
    sigma = max(float(np.std(logits[pairs] - design @ coef)), 1e-3)
    a, b, g, rho = (float(c) for c in coef)
    ends = int(((before == 1) & (on == 0)).sum())
    p01 = (starts + 1) / (float((before == 0).sum()) + 2)
    p10 = (ends + 1) / (float((before == 1).sum()) + 2)
    return {"a": a, "b": b, "g": g, "rho": rho, "sigma": sigma, "p01": p01, "p10": p10, "separation": b / sigma}


def pair_scores(logits: np.ndarray, observed: np.ndarray, model: dict, bias: float) -> np.ndarray:
    """(4, P) log score of each (x_{t-1}, x_t) pair at t, rows 00, 01, 10, 11: the Gaussian
    innovation's log density (up to a shared constant; 0 unless t and t - 1 are both observed)
    plus the log switch probability (shifted by `bias` log-odds for both switches)."""
    prev = np.empty_like(logits)
    prev[0], prev[1:] = logits[0], logits[:-1]
    both = observed.copy()
    both[0] = False
    both[1:] &= observed[:-1]
    p01 = 1 / (1 + np.exp(-(np.log(model["p01"] / (1 - model["p01"])) + bias)))
    p10 = 1 / (1 + np.exp(-(np.log(model["p10"] / (1 - model["p10"])) + bias)))
    log_switch = np.log([[1 - p01, p01], [p10, 1 - p10]])
    scores = np.empty((4, len(logits)))
    base = logits - model["a"] - model["rho"] * prev
    for i in (0, 1):
        for j in (0, 1):
            z = (base - model["b"] * j - model["g"] * i) / model["sigma"]
            scores[2 * i + j] = np.where(both, -0.5 * z * z, 0.0) + log_switch[i, j]
    return scores


def _scan_blocks(m: np.ndarray) -> np.ndarray:
    """Inclusive max-plus prefix products inside each block: m (4, nb, B) -> (4, nb, B)
    (Hillis-Steele doubling, ping-ponging between two buffers)."""
    m, out = m.copy(), np.empty_like(m)
    scratch = np.empty(m.shape[1:])
    width = m.shape[2]
    step = 1
    while step < width:
        out[:, :, :step] = m[:, :, :step]
        tmp = scratch[:, step:]
        for row, (i, j) in enumerate(((0, 0), (0, 1), (1, 0), (1, 1))):
            # (p x q)[i, j] = max(p[i, 0] + q[0, j], p[i, 1] + q[1, j])
            target = out[row, :, step:]
            np.add(m[2 * i, :, :-step], m[j, :, step:], out=target)
            np.add(m[2 * i + 1, :, :-step], m[2 + j, :, step:], out=tmp)
            np.maximum(target, tmp, out=target)
        m, out = out, m
        step *= 2
    return m


def two_state_path(scores: np.ndarray, forced_off: np.ndarray | None = None) -> np.ndarray:
    """(P,) int8 most probable state path of a two-state chain whose pair scores are `scores`
    (4, P) (`pair_scores`; column 0 is ignored: the path starts off). `forced_off` (P,) bool:
    positions that must be off. Ties go to the off state."""
    n = scores.shape[1]
    if n == 0:
        return np.zeros(0, np.int8)
    m = scores.astype(np.float64, copy=True)
    m[:, 0] = [0.0, -np.inf, 0.0, -np.inf]  # enter frame 0 in the off state
    if forced_off is not None:
        m[1, forced_off] = -np.inf
        m[3, forced_off] = -np.inf
    # 1. Pad to whole blocks with max-plus identities (the state stays as it is).
    width = min(BLOCK, n)
    blocks = -(-n // width)
    padded = np.empty((4, blocks * width))
    padded[:, :n] = m
    padded[:, n:] = np.array([0.0, -np.inf, -np.inf, 0.0])[:, None]
    local = _scan_blocks(padded.reshape(4, blocks, width))  # (4, nb, B)
    # 2. delta_t(j) = max_i carry(i) + local_t(i, j), the carry being delta at the previous block's end.
    carry = np.zeros((blocks, 2))
    state = np.array([0.0, -np.inf])
    for k in range(blocks):
        carry[k] = state
        end = local[:, k, -1]
        state = np.array([max(state[0] + end[0], state[1] + end[2]), max(state[0] + end[1], state[1] + end[3])])
        state -= state.max()  # keep the numbers small; the argmaxes do not move
    delta_off = np.maximum(carry[:, :1] + local[0], carry[:, 1:] + local[2]).ravel()  # (nb * B,)
    delta_on = np.maximum(carry[:, :1] + local[1], carry[:, 1:] + local[3]).ravel()
    # 3. Back-pointers: the state at t - 1 given the state at t.
    back_off = np.zeros(blocks * width, np.int8)
    back_on = np.zeros(blocks * width, np.int8)
    back_off[1:] = delta_on[:-1] + padded[2, 1:] > delta_off[:-1] + padded[0, 1:]
    back_on[1:] = delta_on[:-1] + padded[3, 1:] > delta_off[:-1] + padded[1, 1:]
    # 4. Inside each block, compose the pointers from the block's last frame backwards: maps[t]
    #    gives the state at t for each state at the block's last frame (suffix scan of maps).
    take_off = back_off.reshape(blocks, width)[:, 1:]  # maps the state at t + 1 to the state at t
    take_on = back_on.reshape(blocks, width)[:, 1:]
    map_off = np.zeros((blocks, width), np.int8)  # state at t when the block ends off
    map_on = np.ones((blocks, width), np.int8)
    map_off[:, :-1], map_on[:, :-1] = take_off, take_on
    step = 1
    while step < width:
        head_off, head_on = map_off[:, :-step], map_on[:, :-step]
        tail_off, tail_on = map_off[:, step:], map_on[:, step:]
        map_off[:, :-step], map_on[:, :-step] = (np.where(tail_off == 1, head_on, head_off),
                                                 np.where(tail_on == 1, head_on, head_off))
        step *= 2
    # 5. Each block's last state, from the end backwards, then every frame from its block's maps.
    path = np.empty((blocks, width), np.int8)
    last = np.int8(delta_on[-1] > delta_off[-1])
    for k in range(blocks - 1, -1, -1):
        path[k] = map_on[k] if last else map_off[k]
        first = k * width
        last = back_on[first] if path[k, 0] else back_off[first]
    return path.ravel()[:n]


def ar_runs(timeline, k: int, model: dict, bias: float) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) dense positions of label k's decoded runs on `timeline` (off on the
    separator before each video, so no run spans two; trimmed to their first and last observed
    frame; a run of unobserved positions only is dropped). Kept in the timeline's cache: the
    engine asks again for the runs it picked."""
    return _cached(timeline, k, model, bias)[:2]


def ar_run_strength(timeline, k: int, model: dict, bias: float) -> np.ndarray:
    """(R,) each of `ar_runs`' runs' log-likelihood ratio against the label being off there,
    per frame: entering at its start, staying on through it, leaving after its end (the switch
    probabilities included) — how sure the model is of the run, frame for frame."""
    return _cached(timeline, k, model, bias)[2]


def _cached(timeline, k: int, model: dict, bias: float) -> tuple:
    """Both, decoded once per (label, model, bias) on the logits of the timeline's probabilities."""
    key = ("ar", k, float(bias), tuple(sorted(model.items())))
    if key not in timeline.prob_cums:
        timeline.prob_cums[key] = _decoded_runs(timeline, clipped_logits(timeline.probs[k]), model, bias)
    return timeline.prob_cums[key]


def _decoded_runs(timeline, logits: np.ndarray, model: dict, bias: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    observed = timeline.observed
    forced = np.zeros(len(observed), bool)
    forced[np.maximum(np.asarray(timeline.video_first) - 1, 0)] = True
    scores = pair_scores(logits, observed, model, bias)
    path = two_state_path(scores, forced)
    edges = np.diff((path == 1).view(np.int8), prepend=np.int8(0), append=np.int8(0))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1) - 1
    positions = np.arange(len(observed))
    next_seen = np.minimum.accumulate(np.where(observed, positions, len(observed))[::-1])[::-1]
    last_seen = np.maximum.accumulate(np.where(observed, positions, -1))
    starts, ends = next_seen[starts], last_seen[ends]
    keep = starts <= ends
    starts, ends = starts[keep], ends[keep]
    stay = np.concatenate([[0.0], np.cumsum(scores[3] - scores[0])])  # on -> on against off -> off
    after = np.minimum(ends + 1, len(observed) - 1)
    ratio = (scores[1, starts] - scores[0, starts]) + (stay[ends + 1] - stay[starts + 1]) + \
        (scores[2, after] - scores[0, after])
    return starts, ends, ratio / (ends - starts + 1)
