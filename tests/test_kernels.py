"""The compiled kernels (vce/post/kernels.py) give the bits of the numpy code they replaced
(tests/reference_kernels.py), on random cases of several shapes and on ties; the posterior to
its last bits (numpy's own vector loops round differently on AVX-512 machines)."""

from __future__ import annotations

import numpy as np
import pytest
import reference_kernels as reference

from vce.post.arhmm import chain_paths, chain_posterior, innovation_scores
from vce.post.kernels import majority_runs, monotone_forward


def _videos(rng, length, n_videos):
    cuts = np.sort(rng.choice(np.arange(1, length), min(n_videos - 1, length - 1), replace=False))
    return np.r_[0, cuts], np.r_[cuts - 1, length - 1]


@pytest.mark.parametrize("chunk", [3, 64, 2048])
@pytest.mark.parametrize("seed", range(4))
def test_the_compiled_viterbi_is_the_numpy_layouts_path_on_random_chains(monkeypatch, seed, chunk):
    monkeypatch.setattr(reference, "CHUNK", chunk)  # the reference over one chunk or many
    rng = np.random.default_rng(seed)
    for length in (1, 2, 5, 300, 3000):
        for n_videos in (1, 3, 7):
            first, last = _videos(rng, length, n_videos)
            chains, emissions = [], []
            for n_states in (2, 5, 3, 1 + seed % 5):
                off = rng.integers(1, n_states) if n_states > 1 else 1
                chains.append((rng.normal(size=(n_states, n_states)) * 2, np.arange(n_states) >= off))
                emissions.append(rng.normal(size=(4, length)) * 3)
            for got, want in zip(chain_paths(emissions, chains, first, last),
                                 reference.chain_paths(emissions, chains, first, last)):
                np.testing.assert_array_equal(got, want)


def test_the_compiled_viterbi_breaks_ties_and_unreachable_phases_as_numpy_does():
    """Rounded scores (many exact ties), -inf transitions (phases no path enters) and all-equal
    emissions: the same first-index choice at every max and at the last step."""
    rng = np.random.default_rng(11)
    length = 500
    first, last = _videos(rng, length, 4)
    chains, emissions = [], []
    for n_states in (2, 3, 5):
        log_trans = np.round(rng.normal(size=(n_states, n_states)))
        log_trans[rng.random((n_states, n_states)) < 0.3] = -np.inf
        chains.append((log_trans, np.arange(n_states) >= n_states // 2))
        emissions.append(np.round(rng.normal(size=(4, length))))
    chains.append((np.zeros((4, 4)), np.array([False, False, True, True])))
    emissions.append(np.zeros((4, length)))
    for got, want in zip(chain_paths(emissions, chains, first, last),
                         reference.chain_paths(emissions, chains, first, last)):
        np.testing.assert_array_equal(got, want)


POSTERIOR_ATOL = 1e-13  # posteriors in [0, 1]


@pytest.mark.parametrize("n_on", [1, 2, 3])
@pytest.mark.parametrize("n_off", [1, 2, 4])
@pytest.mark.parametrize("block", [1, 7, 64, 512])
def test_the_posterior_is_the_numpy_blocks_posterior_to_its_last_bits(n_off, n_on, block):
    """The compiled steps wherever they run by default (two phases a state at least, two blocks at
    least), the numpy steps elsewhere: both numpy's posterior, bit for bit on an AVX2 machine and
    within a few ulps (<= 1.2e-15 seen) on an AVX-512 one, where numpy's vector loops round
    otherwise; `POSTERIOR_ATOL` is far below any change to the recursion."""
    rng = np.random.default_rng(100 * n_off + 10 * n_on + block)
    on = np.arange(n_off + n_on) >= n_off
    # A chain shorter than one block is the same padded case at 7 and 64 positions a block as at
    # 512, where each costs 512 numpy steps: there only the chains of two and three blocks (one
    # interior) run. (Chains of 5,000 positions added nothing the 1,200 one lacks.)
    for length in (1, 2, 9, 700, 1200) if block < 512 else (700, 1200):
        for n_videos in (1, 4):
            first, last = _videos(rng, length, n_videos)
            first = first + 3 * (length > 9)  # positions before the first video: reset, never read
            first, last = first[first <= last], last[first <= last]
            log_trans = np.log(rng.dirichlet(np.ones(len(on)), len(on)))
            for spread in (1.0, 30.0):  # 30: pairs floored 300 nats below the best
                emission = rng.normal(size=(4, length)) * spread
                want = reference.chain_posterior(emission, log_trans, on, first, last, block=block)
                got = chain_posterior(emission, log_trans, on, first, last, block=block)
                np.testing.assert_allclose(got, want, rtol=0, atol=POSTERIOR_ATOL)
                if min(n_off, n_on) >= 2 and length > block:
                    got = chain_posterior(emission, log_trans, on, first, last, block=block, compiled=True)
                    np.testing.assert_allclose(got, want, rtol=0, atol=POSTERIOR_ATOL)


@pytest.mark.parametrize("half", [1, 2, 3, 7, 40])
@pytest.mark.parametrize("seed", range(3))
def test_the_compiled_majority_filter_gives_the_prefix_sums_runs(seed, half):
    """Random masks, sparse and in long stretches, with unobserved gaps; axes empty, of one
    frame, shorter than the window and longer: the same runs, the same int64 positions."""
    rng = np.random.default_rng(10 * seed + half)
    for size in (0, 1, 2, 5, 2 * half, 2 * half + 1, 300, 5000):
        for density in (0.1, 0.5, 0.9):
            stretches = np.repeat(rng.random(size) < density, rng.integers(1, 30, size))[:size]
            for active in (rng.random(size) < density, stretches):
                observed = rng.random(size) < 0.85
                observed[: min(size, 3)] = False  # a separator first, as on a timeline
                got, want = majority_runs(active, observed, half), reference.majority_runs(active, observed, half)
                for a, b in zip(got, want):
                    assert a.dtype == b.dtype == np.int64
                    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("seed", range(4))
def test_the_compiled_monotone_pass_is_the_numpy_layouts_bit_for_bit(seed):
    """Random and rounded (tied) scores, NaN and -inf among them, with and without a duration
    prior (windows of one frame, shorter than the video, as long as it and longer, states the
    video is too short for): the same D_k(t) and entry values."""
    rng = np.random.default_rng(seed)
    for n_frames in (1, 2, 5, 37, 300, 3000):
        for n_states in (1, 3, 5):
            for kind in ("normal", "rounded", "nan"):
                scores = rng.normal(size=(n_frames, n_states)) * 3
                if kind == "rounded":
                    scores = np.round(scores)
                if kind == "nan":
                    scores[rng.random(scores.shape) < 0.01] = np.nan
                    scores[rng.random(scores.shape) < 0.01] = -np.inf
                penalty = float(rng.choice([0.0, 2.5, 40.0]))
                low = np.ones(n_states, np.int64)
                high = np.full(n_states, n_frames, np.int64)
                priors = [(low, high), (rng.integers(1, max(n_frames // 3, 1) + 2, n_states),
                                        rng.integers(1, 2 * n_frames + 2, n_states))]
                for low, high in priors:
                    low = np.asarray(low, np.int64)
                    high = np.maximum(np.minimum(np.asarray(high, np.int64), n_frames), low)
                    best, enters = np.empty((n_frames, n_states)), np.empty((n_frames, n_states))
                    monotone_forward(scores, penalty, low, high, best, enters)
                    want_best, want_enters = reference.monotone_forward(scores, penalty, low, high)
                    np.testing.assert_array_equal(best, want_best)
                    np.testing.assert_array_equal(enters, want_enters)


@pytest.mark.parametrize("seed", range(4))
def test_the_compiled_innovation_scores_are_the_numpy_expressions_bits(seed):
    """Random logits (exact zeros among them) and models (negative steps, a zero slope),
    unobserved gaps, axes of 1, 2 and thousands of positions (an empty one: no scores, where
    the numpy code raised)."""
    assert innovation_scores(np.zeros(0), np.zeros(0, bool), {k: 1.0 for k in "a rho b g sigma".split()}).shape == (4, 0)
    rng = np.random.default_rng(seed)
    for size in (1, 2, 7, 4000):
        logits = rng.normal(size=size) * 4
        logits[rng.random(size) < 0.1] = 0.0
        observed = rng.random(size) < 0.9
        for model in ({"a": float(rng.normal()), "rho": float(rng.uniform(-1, 1)), "b": float(rng.normal() * 3),
                       "g": float(rng.normal() * 3), "sigma": float(rng.uniform(0.1, 3))},
                      {"a": 0.0, "rho": 0.0, "b": -2.5, "g": 0.0, "sigma": 1.0}):
            got = innovation_scores(logits, observed, model)
            want = reference.innovation_scores(logits, observed, model)
            assert got.shape == want.shape == (4, size)
            np.testing.assert_array_equal(got.view(np.int64), want.view(np.int64))  # the sign of zeros too
