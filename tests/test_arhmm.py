"""The autoregressive HMM decoder (vce/post/arhmm.py) and its place in the score engine."""

import json

import numpy as np
import pandas as pd
import pytest
from scipy.signal import lfilter
from test_engine import _engine_params, _labels, _table

import vce.post.arhmm as arhmm
from vce.core.errors import DataError
from vce.core.labels import LABELS, REGIONS
from vce.post.anatomy import clipped_logits as _logits
from vce.post.arhmm import (
    ar_posterior_runs,
    ar_run_strength,
    ar_runs,
    chain_path,
    chain_paths,
    chain_posterior,
    fit_ar_model,
    fit_phases,
    innovation_scores,
    phase_chain,
    state_lengths,
)
from vce.post.engine import Engine, engine_submission, fit_engine, tuning_timeline
from vce.post.engine.candidates import hysteresis_runs, run_candidates
from vce.post.engine.regions import label_truth
from vce.post.events import labels_to_submission
from vce.post.timeline import build_timeline

BLOOD = LABELS.index("blood")


def _viterbi_loop(emission, log_trans, on, first, last):
    """The textbook Viterbi, one video and one frame at a time (ties to the lower state)."""
    x = np.asarray(on, np.int64)
    path = np.zeros(emission.shape[1], np.int64)
    for a, b in zip(first, last):
        delta = np.full(len(on), -np.inf)
        delta[0] = 0.0
        back = []
        for t in range(a + 1, b + 1):
            options = delta[:, None] + log_trans + emission[2 * x[:, None] + x[None, :], t]
            back.append(options.argmax(axis=0))
            delta = options.max(axis=0)
        state = [int(delta.argmax())]
        for pointers in reversed(back):
            state.append(int(pointers[state[-1]]))
        path[a:b + 1] = x[state[::-1]]
    return path


@pytest.mark.parametrize("n_states", [2, 3, 5])
def test_the_chain_path_is_the_frame_by_frame_viterbi_path_of_every_video(n_states):
    rng = np.random.default_rng(n_states)
    on = np.arange(n_states) >= n_states // 2
    for length in (1, 2, 3, 9, 64, 300):
        for n_videos in (1, 2, 4):
            cuts = np.sort(rng.choice(np.arange(1, length), min(n_videos - 1, length - 1), replace=False))
            first, last = np.r_[0, cuts], np.r_[cuts - 1, length - 1]
            emission, log_trans = rng.normal(size=(4, length)) * 3, rng.normal(size=(n_states, n_states))
            np.testing.assert_array_equal(chain_path(emission, log_trans, on, first, last),
                                          _viterbi_loop(emission, log_trans, on, first, last))
    assert chain_path(np.zeros((4, 3)), np.zeros((2, 2)), np.array([False, True]), [], []).tolist() == [0, 0, 0]


def test_chains_of_different_phase_counts_decoded_together_each_get_their_own_viterbi_path():
    """`chain_paths` of chains of different phase counts: each path is the frame-by-frame Viterbi of its chain alone."""
    rng = np.random.default_rng(7)
    length = 400
    first, last = np.array([0, 50, 57, 300]), np.array([49, 56, 299, 399])
    chains, emissions = [], []
    for n_states in (2, 5, 3):
        chains.append((rng.normal(size=(n_states, n_states)), np.arange(n_states) >= n_states // 2))
        emissions.append(rng.normal(size=(4, length)) * 3)
    paths = chain_paths(emissions, chains, first, last)
    for path, emission, (log_trans, on) in zip(paths, emissions, chains):
        np.testing.assert_array_equal(path, _viterbi_loop(emission, log_trans, on, first, last))
        np.testing.assert_array_equal(path, chain_path(emission, log_trans, on, first, last))
    assert chain_paths([], [], first, last) == []


def _posterior_by_enumeration(emission, log_trans, on, first, last):
    """P(on) at each position by summing every path of every video (each from state 0)."""
    import itertools

    x = np.asarray(on, np.int64)
    out = np.zeros(emission.shape[1])
    for a, b in zip(first, last):
        total, mass = 0.0, np.zeros(b - a + 1)
        for tail in itertools.product(range(len(on)), repeat=b - a):
            states = (0,) + tail
            score = sum(log_trans[i, j] + emission[2 * x[i] + x[j], a + t + 1]
                        for t, (i, j) in enumerate(zip(states, states[1:])))
            weight = np.exp(score)
            total += weight
            mass += weight * x[list(states)]
        out[a:b + 1] = mass / total
    return out


@pytest.mark.parametrize("block", [1, 2, 3, 64])
def test_the_chain_posterior_is_the_sum_over_every_path_of_every_video(block):
    rng = np.random.default_rng(block)
    model = {"off_phases": [[0.6, 0.3], [0.4, 0.02]], "on_phases": [[0.7, 0.4], [0.3, 0.05]]}
    log_trans, on = phase_chain(model, 0.0)
    emission = rng.normal(0, 2, (4, 17))
    emission[:, 0] = 0.0
    first, last = np.array([1, 7, 8, 12]), np.array([6, 7, 11, 16])  # a video of one position (8 .. 11: 4)
    expected = _posterior_by_enumeration(emission, log_trans, on, first, last)
    got = chain_posterior(emission, log_trans, on, first, last, block=block)
    assert np.allclose(got[1:], expected[1:], atol=1e-12)
    assert (got[first] == 0).all()  # every video starts off


def test_the_chain_posterior_survives_scores_no_path_explains():
    """Scores thousands of nats apart (outlier frames): the floor keeps every message finite, and
    the posterior is the paths' own answer: on at 499 (nothing from off fits 500), off at 899
    (nothing from on fits 900), one switch on in 1..499 and one off in 500..899, anywhere alike."""
    model = {"off_phases": [[1.0, 1e-9]], "on_phases": [[1.0, 1e-9]]}
    log_trans, on = phase_chain(model, 0.0)
    emission = np.zeros((4, 2000))
    emission[[0, 1], 500] = -5000.0  # from off, nothing fits frame 500
    emission[[2, 3], 900] = -5000.0  # from on, nothing fits frame 900
    got = chain_posterior(emission, log_trans, on, [0], [1999], block=64)
    assert np.isfinite(got).all()
    contradiction = emission.copy()
    contradiction[[1, 3], 1500] = -5000.0  # nothing enters on at 1500 ...
    contradiction[[0, 1], 1501] = -5000.0  # ... and nothing leaves off at 1501: no path at all
    assert np.isfinite(chain_posterior(contradiction, log_trans, on, [0], [1999], block=64)).all()
    assert got[[250, 499, 700, 899, 1500]] == pytest.approx([0.5, 1.0, 0.5, 0.0, 0.0], abs=0.01)


def test_ties_go_to_the_off_state():
    """Every pair scoring the same: off everywhere (pointers and the last frame alike)."""
    two = (np.zeros((2, 2)), np.array([False, True]))
    np.testing.assert_array_equal(chain_path(np.zeros((4, 7)), *two, [0], [6]), np.zeros(7))
    scores = np.zeros((4, 5))
    scores[1, 2] = 1.0  # entering on at frame 2 pays 1; after it staying on and leaving tie: off again
    np.testing.assert_array_equal(chain_path(scores, *two, [0], [4]), [0, 0, 1, 0, 0])
    scores = np.zeros((4, 3))
    scores[1, 1], scores[1, 2], scores[3, 2] = 1.0, 2.0, 1.0  # on at 2: from off (0 + 2) ties from on (1 + 1)
    np.testing.assert_array_equal(chain_path(scores, *two, [0], [2]), [0, 0, 1])


def test_one_phase_each_is_the_two_state_chain_of_the_biased_switch_rates():
    model = {"p01": 0.01, "p10": 0.2, "off_phases": [[1.0, 0.01]], "on_phases": [[1.0, 0.2]]}
    log_trans, on = phase_chain(model, bias=1.0)
    p01, p10 = 1 / (1 + (1 - 0.01) / 0.01 * np.exp(-1.0)), 1 / (1 + (1 - 0.2) / 0.2 * np.exp(-1.0))
    np.testing.assert_allclose(np.exp(log_trans), [[1 - p01, p01], [p10, 1 - p10]])
    assert on.tolist() == [False, True]


def test_the_phase_chain_leaves_a_phase_for_the_other_states_phases_by_weight():
    model = {"off_phases": [[0.7, 0.2], [0.3, 0.001]], "on_phases": [[0.9, 0.5], [0.1, 0.01]]}
    log_trans, on = phase_chain(model, bias=0.0)
    assert on.tolist() == [False, False, True, True]
    # State 0 (where videos start) is the long off phase; every row is a distribution.
    np.testing.assert_allclose(np.exp(log_trans), [
        [1 - 0.001, 0.0, 0.001 * 0.9, 0.001 * 0.1],
        [0.0, 1 - 0.2, 0.2 * 0.9, 0.2 * 0.1],
        [0.5 * 0.3, 0.5 * 0.7, 1 - 0.5, 0.0],
        [0.01 * 0.3, 0.01 * 0.7, 0.0, 1 - 0.01]])


def test_stretch_lengths_end_where_the_state_changes_or_the_truth_stops():
    truth = np.array([0, 0, 1, 1, 1, 0, -1, 0, 0, 0, 1, -1, -1, 1, 1], np.int8)
    off, on = state_lengths(truth)
    assert off.tolist() == [2, 1, 3] and on.tolist() == [3, 1, 2]


@pytest.mark.parametrize("short, long", [(4, 400), (5, 40)])
def test_the_phases_recover_a_mixture_of_two_geometric_lengths(short, long):
    rng = np.random.default_rng(4)
    lengths = np.r_[rng.geometric(1 / short, 7000), rng.geometric(1 / long, 3000)]
    (w_short, p_short), (w_long, p_long) = fit_phases(lengths, 2, rate=0.5)
    assert w_short == pytest.approx(0.7, abs=0.02) and w_long == pytest.approx(0.3, abs=0.02)
    assert 1 / p_short == pytest.approx(short, rel=0.05) and 1 / p_long == pytest.approx(long, rel=0.05)
    assert fit_phases(lengths, 1, rate=0.5) == [[1.0, 0.5]]  # one phase: the add-one switch rate as given
    assert len(fit_phases(lengths[:25], 3, rate=0.5)) == 2  # 10 lengths per phase at least
    # A length far beyond every phase it starts from (log-likelihoods of -1e7): still a finite fit.
    phases = fit_phases(np.r_[np.ones(30), np.full(30, 2.0), [100_000.0]], 2, rate=0.5)
    assert len(phases) == 2 and np.isfinite(phases).all() and 1 / phases[1][1] > 1000
    # A phase of one-frame stretches only: its exit rate stays below 1 (a log of 0 would make it NaN).
    phases = fit_phases(np.r_[np.ones(40), np.full(40, 50.0)], 2, rate=0.5)
    assert np.isfinite(phases).all() and phases[0][1] == pytest.approx(1.0) and phases[0][1] < 1.0


def test_phases_place_clustered_runs_where_one_switch_rate_merges_them():
    """Runs in clusters (gaps of 2-5 frames inside, 1000 and more between): one switch rate
    prices a new run 3 frames after the last like one in a long silence, and merges them."""
    rng = np.random.default_rng(6)
    runs, at = [], 300
    while at < 190_000:
        for _ in range(int(rng.integers(3, 7))):
            length = int(rng.integers(3, 12))
            runs.append((at, at + length - 1))
            at += length + int(rng.integers(2, 6))
        at += int(rng.integers(1000, 3000))
    logits, truth = _step_series(rng, 200_000, runs, step=2.0, rho=0.8)
    frame_probs = pd.DataFrame({"video_id": "v", "t": np.arange(len(logits))})
    for label in LABELS:
        frame_probs[label] = np.float32(0.02)
    frame_probs["blood"] = (1 / (1 + np.exp(-logits))).astype(np.float64)
    timeline = build_timeline(frame_probs, max_reach=2)
    gt = {"videos": [{"video_id": "v", "events": [{"start": a, "end": b, "label": ["blood"]} for a, b in runs]}]}
    labels = label_truth(timeline, gt)[BLOOD]
    exact = {}
    for phases in ((1, 1), (2, 1)):
        model = fit_ar_model(_logits(timeline.probs[BLOOD]), labels, *phases)
        exact[phases] = _exact_runs(timeline, *ar_runs(timeline, BLOOD, model, 0.0), gt)
    assert exact[(2, 1)] >= exact[(1, 1)] + 0.2, exact  # measured: 0.47 and 0.72


def _step_series(rng, n, runs, step, rho, offset=-3.0):
    """(logits, truth): AR(1) noise of unit variance, `offset` + `step` inside the runs."""
    truth = np.zeros(n, np.int8)
    for a, b in runs:
        truth[a:b + 1] = 1
    noise = lfilter([np.sqrt(1 - rho**2)], [1.0, -rho], rng.standard_normal(n))
    return offset + step * truth + noise, truth


def test_the_model_recovers_the_step_the_correlation_and_the_innovation_of_ar1_noise():
    rng = np.random.default_rng(0)
    runs = [(a, a + 9) for a in range(500, 200_000, 400)]
    logits, truth = _step_series(rng, 200_000, runs, step=3.0, rho=0.9)
    model = fit_ar_model(logits, truth)
    assert model["rho"] == pytest.approx(0.9, abs=0.01)
    assert model["b"] == pytest.approx(3.0, abs=0.05)
    assert model["g"] == pytest.approx(-0.9 * 3.0, abs=0.05)  # a step in AR(1) noise: g = -rho b
    assert model["a"] == pytest.approx(-3.0 * (1 - 0.9), abs=0.02)
    assert model["sigma"] == pytest.approx(np.sqrt(1 - 0.81), rel=0.02)
    assert model["separation"] == pytest.approx(model["b"] / model["sigma"])


def test_switch_rates_are_counted_with_add_one_smoothing_and_too_little_truth_gives_no_model():
    truth = np.zeros(100, np.int8)
    truth[[10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49]] = 1  # 2 runs, 20 frames
    truth[60] = -1  # an unobserved frame: neither pair with it counts
    logits = np.random.default_rng(1).normal(size=100) + 2 * truth
    model = fit_ar_model(logits, truth)
    # Pairs (t-1, t) with both labelled: 99 - 2 = 97; from off: 97 - 20 = 77 (2 starts), from on: 20 (2 ends).
    assert model["p01"] == pytest.approx((2 + 1) / (77 + 2))
    assert model["p10"] == pytest.approx((2 + 1) / (20 + 2))
    assert fit_ar_model(logits, np.where(np.arange(100) == 99, 0, truth).astype(np.int8)) is not None
    fewer = truth.copy()
    fewer[49] = 0  # 19 positive frames
    assert fit_ar_model(logits, fewer) is None
    one_run = np.zeros(100, np.int8)
    one_run[10:40] = 1  # 30 frames but a single run
    assert fit_ar_model(logits, one_run) is None


def test_innovation_scores_are_the_gaussian_log_density_of_each_state_pair():
    model = {"a": 0.5, "b": 2.0, "g": -1.5, "rho": 0.8, "sigma": 0.5}
    logits = np.array([0.0, 1.0, 3.0, 0.0])
    observed = np.array([True, True, True, False])
    scores = innovation_scores(logits, observed, model)
    # t = 2: l = 3 after l = 1; mean a + b j + g i + rho * 1.
    for row, (i, j) in enumerate(((0, 0), (0, 1), (1, 0), (1, 1))):
        mean = 0.5 + 2.0 * j - 1.5 * i + 0.8 * 1.0
        assert scores[row, 2] == pytest.approx(-0.5 * ((3.0 - mean) / 0.5) ** 2)
    # t = 0 (no frame before) and t = 3 (unobserved): no evidence either way.
    np.testing.assert_array_equal(scores[:, [0, 3]], np.zeros((4, 2)))


def _ar_videos(n_videos, seed, rho=0.9, step=3.0):
    """Videos whose blood logits are AR(1) noise with a step inside 12 events each (4-20 frames)."""
    rng = np.random.default_rng(seed)
    tables, labels = [], []
    for v in range(n_videos):
        n = 1500
        starts = np.sort(rng.choice(np.arange(50, n - 50, 100), 12, replace=False))
        runs = [(int(a), int(a + rng.integers(3, 20))) for a in starts]
        logits, truth = _step_series(rng, n, runs, step, rho)
        regions = np.repeat(np.arange(5), [100, 100, 300, 700, 300])
        tables.append(_table(regions, f"v{v}", {"blood": 1 / (1 + np.exp(-logits))}, seed=seed + v))
        labels.append(_labels(regions, f"v{v}", {"blood": truth}))
    frame_probs = pd.concat(tables, ignore_index=True)
    return frame_probs, labels_to_submission(pd.concat(labels, ignore_index=True))


def _exact_runs(timeline, starts, ends, gt):
    true = {(str(v["video_id"]), e["start"], e["end"]) for v in gt["videos"] for e in v["events"] if "blood" in e["label"]}
    video = np.searchsorted(timeline.video_first, starts, side="right") - 1
    found = {(timeline.video_ids[v], int(timeline.time[a]), int(timeline.time[b])) for v, a, b in zip(video, starts, ends)}
    return len(true & found) / len(true)


def test_in_ar1_noise_the_decoder_places_runs_to_the_frame_where_no_threshold_does():
    frame_probs, gt = _ar_videos(4, seed=3, step=2.0)  # 48 events
    timeline = build_timeline(frame_probs, max_reach=8)
    truth = label_truth(timeline, gt)[BLOOD]
    logits = _logits(timeline.probs[BLOOD])
    model = fit_ar_model(logits, truth)
    decoded = _exact_runs(timeline, *ar_runs(timeline, BLOOD, model, 0.0), gt)
    best_threshold = max(_exact_runs(timeline, *hysteresis_runs(timeline, BLOOD, t, 1.0, w), gt)
                         for t in (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8) for w in (1, 3, 5))
    assert decoded >= 0.9 and best_threshold <= 0.35  # measured: 0.92 and 0.23


def test_runs_stop_at_the_video_and_at_their_last_observed_frame():
    """Blood on through the end of v0 and from the first frame of v1; a 3-frame gap of missing
    frames right after a run in v1: no run spans the two videos or ends inside the gap."""
    on = np.r_[np.full(20, -4.0), np.full(10, 3.0)]
    first = pd.DataFrame({"video_id": "v0", "t": np.arange(30)})
    second = pd.DataFrame({"video_id": "v1", "t": np.r_[np.arange(10), np.arange(13, 30)]})
    frame_probs = pd.concat([first, second], ignore_index=True)
    for label in LABELS:
        frame_probs[label] = np.float32(0.02)
    second_logits = np.r_[np.full(5, 3.0), np.full(22, -4.0)]  # on at t 0-4, off from 5; missing 10-12
    second_logits[9] = 3.0  # a one-frame rise right before the gap
    frame_probs["blood"] = (1 / (1 + np.exp(-np.r_[on, second_logits]))).astype(np.float32)
    timeline = build_timeline(frame_probs, max_reach=4)
    model = {"a": -0.4, "b": 7.0, "g": -6.3, "rho": 0.9, "sigma": 0.3, "p01": 0.05, "p10": 0.05,
             "off_phases": [[1.0, 0.05]], "on_phases": [[1.0, 0.05]]}
    starts, ends = ar_runs(timeline, BLOOD, model, 0.0)
    video = np.searchsorted(timeline.video_first, starts, side="right") - 1
    spans = [(int(v), int(timeline.time[a]), int(timeline.time[b])) for v, a, b in zip(video, starts, ends)]
    assert spans == [(0, 20, 29), (1, 0, 4), (1, 9, 9)]
    assert timeline.observed[starts].all() and timeline.observed[ends].all()


def test_a_run_at_the_end_of_a_video_stays_out_of_the_next_longer_one():
    """One separator position between the videos (max_reach 0); the shorter first video ends on,
    the longer second one starts off: each video's path is its own."""
    frame_probs = pd.concat([pd.DataFrame({"video_id": "v0", "t": np.arange(20)}),
                             pd.DataFrame({"video_id": "v1", "t": np.arange(40)})], ignore_index=True)
    for label in LABELS:
        frame_probs[label] = np.float32(0.02)
    logits = np.r_[np.full(15, -4.0), np.full(5, 3.0), np.full(40, -4.0)]
    frame_probs["blood"] = (1 / (1 + np.exp(-logits))).astype(np.float32)
    timeline = build_timeline(frame_probs, max_reach=0)
    model = {"a": -0.4, "b": 7.0, "g": -6.3, "rho": 0.9, "sigma": 0.3, "p01": 0.05, "p10": 0.05,
             "off_phases": [[1.0, 0.05]], "on_phases": [[1.0, 0.05]]}
    starts, ends = ar_runs(timeline, BLOOD, model, 0.0)
    video = np.searchsorted(timeline.video_first, starts, side="right") - 1
    assert [(int(v), int(timeline.time[a]), int(timeline.time[b])) for v, a, b in zip(video, starts, ends)] == [(0, 15, 19)]


def test_each_switch_bias_is_decoded_on_its_own():
    frame_probs, gt = _ar_videos(2, seed=5, step=1.5)
    timeline = build_timeline(frame_probs, max_reach=8)
    logits = _logits(timeline.probs[BLOOD])
    model = fit_ar_model(logits, label_truth(timeline, gt)[BLOOD])
    strict, loose = (len(ar_runs(timeline, BLOOD, model, bias)[0]) for bias in (-3.0, 3.0))
    assert loose > strict  # not the cached runs of the first bias


def test_the_engine_picks_the_decoder_keeps_it_in_json_and_refuses_older_policies():
    frame_probs, gt = _ar_videos(6, seed=7, step=1.5)  # a step the posterior is unsure of here and there
    params = _engine_params(ar_runs=True, decoder_min_auc=0.75, min_gain_sqrt_videos=0.0)
    engine = fit_engine(tuning_timeline(frame_probs, params), gt, params)
    policy = engine.policies["blood"]
    assert policy.kind == "runs" and policy.detector == "ar" and policy.ar_model["separation"] > 2.0
    assert (len(policy.ar_model["off_phases"]), len(policy.ar_model["on_phases"])) == (3, 2)  # params.yaml's
    assert policy.ar_levels == [0.1, 0.3, 0.5, 0.7, 0.9]  # params.yaml's
    submission, _ = engine_submission(frame_probs, engine)
    saved = Engine.from_dict(json.loads(json.dumps(engine.to_dict())))
    assert engine_submission(frame_probs, saved)[0] == submission
    # Its events are the decoded runs, then the posterior runs (none without levels).
    bare = Engine.from_dict(json.loads(json.dumps(engine.to_dict())))
    bare.policies["blood"].ar_levels = []
    blood = [[(e["start"], e["end"]) for e in v["events"] if e["label"] == ["blood"]]
             for sub in (submission, engine_submission(frame_probs, bare)[0]) for v in sub["videos"]]
    with_levels, without = blood[:6], blood[6:]
    assert all(a[:len(b)] == b for a, b in zip(with_levels, without))
    assert sum(len(a) - len(b) for a, b in zip(with_levels, without)) > 0
    # Below the AUC screen the label is not decoded at all; the threshold grid decides.
    single = _engine_params(ar_runs=True, decoder_min_auc=0.75, min_gain_sqrt_videos=0.0, ar_off_phases=1, ar_on_phases=1)
    model = fit_engine(tuning_timeline(frame_probs, single), gt, single).policies["blood"].ar_model
    assert model["off_phases"] == [[1.0, model["p01"]]] and model["on_phases"] == [[1.0, model["p10"]]]
    strict = _engine_params(ar_runs=True, decoder_min_auc=1.0, min_gain_sqrt_videos=0.0)
    assert getattr(fit_engine(tuning_timeline(frame_probs, strict), gt, strict).policies["blood"], "detector", None) != "ar"
    # An engine from before the decoder (no "detector"), or an ar policy without its model or its
    # posterior levels, is refused.
    for drop in ("detector", "ar_model", "ar_levels"):
        data = json.loads(json.dumps(engine.to_dict()))
        del data["policies"]["blood"][drop]
        with pytest.raises(DataError, match=rf"'blood' policy lacks \['{drop}'\].*rerun the thresholds stage"):
            Engine.from_dict(data)
    data = json.loads(json.dumps(engine.to_dict()))
    del data["policies"]["blood"]["ar_model"]["off_phases"]  # a model from before the length phases
    with pytest.raises(DataError, match=r"'blood' policy lacks \['ar_model.off_phases'\].*rerun the thresholds stage"):
        Engine.from_dict(data)


def test_a_silent_labels_decoded_runs_still_cut_the_regions():
    frame_probs, gt = _ar_videos(4, seed=11)
    params = _engine_params(ar_runs=True, decoder_min_auc=0.75, min_gain_sqrt_videos=10.0)  # every finding off
    engine = fit_engine(tuning_timeline(frame_probs, params), gt, params)
    shadow = engine.policies["blood"].shadow
    assert engine.policies["blood"].kind == "off" and shadow.detector == "ar" and shadow.ar_model is not None
    saved = Engine.from_dict(json.loads(json.dumps(engine.to_dict())))
    submission, _ = engine_submission(frame_probs, saved)
    inside = {(e["start"], e["end"]) for e in gt["videos"][0]["events"]
              if "blood" in e["label"] and "small intestine" in e["label"]}
    pieces = {(e["start"], e["end"]) for e in submission["videos"][0]["events"] if e["label"] == ["small intestine"]}
    assert len(inside) >= 4 and inside <= pieces  # the small intestine cut at each of its blood events


def test_an_older_shadow_spec_is_refused_by_name():
    frame_probs, gt = _ar_videos(2, seed=9)
    params = _engine_params(ar_runs=False, min_gain_sqrt_videos=10.0)  # every finding off, with shadow runs
    engine = fit_engine(tuning_timeline(frame_probs, params), gt, params)
    data = json.loads(json.dumps(engine.to_dict()))
    assert data["policies"]["blood"]["shadow"]["detector"] == "threshold"
    del data["policies"]["blood"]["shadow"]["detector"]
    with pytest.raises(DataError, match=r"'blood' policy lacks \['detector'\]"):
        Engine.from_dict(data)


def test_each_region_ranks_its_cut_pieces_in_the_order_that_scores_better_on_the_tuning_videos():
    """Blood cuts the regions; the engine fitted with both orders keeps, per region, the better
    tuning AP of the two single-order engines (ties: the first listed, longest)."""
    frame_probs, gt = _ar_videos(4, seed=11)
    fitted = {}
    for orders in (["longest"], ["shortest"], ["longest", "shortest"]):
        params = _engine_params(min_gain_sqrt_videos=1.5, cut_orders=orders)
        fitted[tuple(orders)] = fit_engine(tuning_timeline(frame_probs, params), gt, params).policies
    picked = set()
    for region in REGIONS:
        longest, shortest = (fitted[(order,)][region].tuning_ap for order in ("longest", "shortest"))
        both = fitted[("longest", "shortest")][region]
        assert both.tuning_ap == max(longest, shortest)
        assert both.cut_order == ("shortest" if shortest > longest else "longest")
        picked.add(both.cut_order)
    assert picked == {"longest", "shortest"}  # this data holds regions of each kind
    data = {"coef": [], "intercept": [], "switch_penalty": 0.0, "region_cuts": True, "top_k": 1,
            "policies": {label: policy.to_dict() for label, policy in fitted[("longest",)].items()}, "centres": None, "durations": None, "temperatures": None}
    data["policies"]["colon"] = {k: v for k, v in data["policies"]["colon"].items() if k != "cut_order"}
    with pytest.raises(DataError, match=r"'colon' policy lacks \['cut_order'\].*rerun the thresholds stage"):
        Engine.from_dict(data)


def test_run_strength_is_the_runs_log_likelihood_ratio_against_off_per_frame():
    rng = np.random.default_rng(2)
    logits, truth = _step_series(rng, 3000, [(a, a + 5) for a in range(100, 2900, 200)], step=3.0, rho=0.9)
    frame_probs = pd.DataFrame({"video_id": "v", "t": np.arange(3000)})
    for label in LABELS:
        frame_probs[label] = np.float32(0.02)
    frame_probs["blood"] = (1 / (1 + np.exp(-logits))).astype(np.float32)
    timeline = build_timeline(frame_probs, max_reach=2)
    observed_logits = _logits(timeline.probs[BLOOD])
    model = fit_ar_model(observed_logits, label_truth(timeline, {"videos": [{"video_id": "v", "events": [
        {"start": a, "end": a + 5, "label": ["blood"]} for a in range(100, 2900, 200)]}]})[BLOOD])
    starts, ends = ar_runs(timeline, BLOOD, model, 0.0)
    strength = ar_run_strength(timeline, BLOOD, model, 0.0)
    prev = np.r_[observed_logits[0], observed_logits[:-1]]

    def density(t, i, j):  # the innovation's log density of the pair (i, j) at t
        mean = model["a"] + model["b"] * j + model["g"] * i + model["rho"] * prev[t]
        return -0.5 * ((observed_logits[t] - mean) / model["sigma"]) ** 2

    for s, e, value in zip(starts, ends, strength):
        # The path with the run minus the all-off path, pair by pair over the run's frames, no switch prior.
        with_run = density(s, 0, 1) + sum(density(t, 1, 1) for t in range(s + 1, e + 1)) + density(e + 1, 1, 0)
        without = sum(density(t, 0, 0) for t in range(s, e + 2))
        assert value == pytest.approx((with_run - without) / (e - s + 1))
    assert len(starts) >= 10


def test_posterior_runs_are_the_runs_above_each_level_that_the_path_did_not_decode():
    frame_probs, gt = _ar_videos(3, seed=17, step=1.5)  # a weak step: uncertain ends
    timeline = build_timeline(frame_probs, max_reach=8)
    model = fit_ar_model(_logits(timeline.probs[BLOOD]), label_truth(timeline, gt)[BLOOD], 3, 2)
    levels = [0.2, 0.5, 0.8]
    starts, ends, strength = ar_posterior_runs(timeline, BLOOD, model, 0.0, levels)
    first = np.asarray(timeline.video_first) - 1
    last = np.append(first[1:] - 1, len(timeline.observed) - 1)
    log_trans, on = phase_chain(model, 0.0)
    scores = innovation_scores(_logits(timeline.probs[BLOOD]), timeline.observed, model)
    posterior = chain_posterior(scores, log_trans, on, first, last)
    decoded = set(zip(*(a.tolist() for a in ar_runs(timeline, BLOOD, model, 0.0))))
    expected = []
    for level in levels:
        above = np.r_[False, posterior > level, False]
        for a, b in zip(np.flatnonzero(~above[:-1] & above[1:]), np.flatnonzero(above[:-1] & ~above[1:]) - 1):
            if (a, b) not in decoded and (a, b) not in expected:
                expected.append((int(a), int(b)))
    assert list(zip(starts.tolist(), ends.tolist())) == expected and len(expected) >= 10
    assert len(decoded & set(expected)) == 0
    # ... with the decoded runs' strength: their log-likelihood ratio per frame.
    both = np.r_[ar_runs(timeline, BLOOD, model, 0.0)[0], starts], np.r_[ar_runs(timeline, BLOOD, model, 0.0)[1], ends]
    assert np.allclose(strength, arhmm._strength(scores, starts, ends))
    assert len(both[0]) == len(decoded) + len(expected)


def test_posterior_runs_follow_a_videos_decoded_runs_up_to_top_k_and_never_cut_or_gate():
    frame_probs, gt = _ar_videos(2, seed=19, step=1.5)
    timeline = build_timeline(frame_probs, max_reach=8)
    model = fit_ar_model(_logits(timeline.probs[BLOOD]), label_truth(timeline, gt)[BLOOD], 3, 2)
    runs, strength = ar_runs(timeline, BLOOD, model, 0.0), ar_run_strength(timeline, BLOOD, model, 0.0)
    alternatives = ar_posterior_runs(timeline, BLOOD, model, 0.0, [0.2, 0.5, 0.8])
    plain = run_candidates(timeline, BLOOD, None, 1, 1, 500, runs, strength=strength)
    more = run_candidates(timeline, BLOOD, None, 1, 1, 500, runs, strength=strength, alternatives=alternatives)
    video = np.searchsorted(timeline.video_first, alternatives[0], side="right") - 1
    for v in range(2):
        mine = video == v
        order = np.argsort(-alternatives[2][mine], kind="stable")
        spans = list(zip(timeline.time[alternatives[0][mine]].tolist(), timeline.time[alternatives[1][mine]].tolist()))
        assert more.events[v] == plain.events[v] + [spans[i] for i in order] and len(order) >= 3
    assert more.clinical == plain.clinical  # the clean list (and the region cuts) hold the decoded runs only
    assert np.array_equal(more.evidence, plain.evidence)
    for name in plain.features:
        assert np.array_equal(more.features[name], plain.features[name])
    capped = run_candidates(timeline, BLOOD, None, 1, 1, len(plain.events[0]) + 2, runs, strength=strength,
                            alternatives=alternatives)
    assert capped.events[0] == more.events[0][:len(plain.events[0]) + 2]
    longer = run_candidates(timeline, BLOOD, None, 1, 4, 500, runs, strength=strength, alternatives=alternatives)
    assert all(b - a + 1 >= 4 for a, b in longer.events[0])
    # A video without a decoded run gets none of them.
    none = run_candidates(timeline, BLOOD, None, 1, 1, 500, (runs[0][:0], runs[1][:0]), strength=strength[:0],
                          alternatives=alternatives)
    assert none.events == [[], []]


def test_decoded_runs_are_ranked_by_their_strength_not_their_mean_probability():
    frame_probs, gt = _ar_videos(2, seed=13)
    timeline = build_timeline(frame_probs, max_reach=8)
    logits = _logits(timeline.probs[BLOOD])
    model = fit_ar_model(logits, label_truth(timeline, gt)[BLOOD])
    runs = ar_runs(timeline, BLOOD, model, 0.0)
    strength = ar_run_strength(timeline, BLOOD, model, 0.0)
    ranked = run_candidates(timeline, BLOOD, None, 1, 1, 500, runs, strength=strength).events[0]
    by_probability = run_candidates(timeline, BLOOD, None, 1, 1, 500, runs).events[0]
    video = np.searchsorted(timeline.video_first, runs[0], side="right") - 1
    first = video == 0
    expected = np.argsort(-strength[first], kind="stable")
    spans = list(zip(timeline.time[runs[0][first]].tolist(), timeline.time[runs[1][first]].tolist()))
    assert ranked == [spans[i] for i in expected] and ranked != by_probability
