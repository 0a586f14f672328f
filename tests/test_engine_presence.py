"""The score engine's per-finding calibration (`finding_calibration`) and joint presence model (`joint`)."""

import json

import numpy as np
import pandas as pd
import pytest
from test_engine import _engine_params, _labels, _table, _videos

from vce.core.errors import DataError
from vce.core.labels import LABELS
from vce.post.engine import Engine, engine_submission, fit_engine, presence_rates, tuning_timeline
from vce.post.engine.calibration import MIN_CALIBRATION_FRAMES, calibrated, fit_temperatures
from vce.post.engine.candidates import run_candidates
from vce.post.engine.findings import presence_weighting
from vce.post.engine.gate import _fit_weighted_logistic, fit_presence_model, presence_inputs, presence_score
from vce.post.engine.regions import label_truth
from vce.post.events import labels_to_submission
from vce.post.timeline import build_timeline

POLYP = LABELS.index("polyp")


def _one_video(polyp_probs, polyp_truth):
    """One small-intestine video with the given polyp probabilities and truth."""
    regions = np.full(len(polyp_probs), 3)
    table = _table(regions, "v", {"polyp": polyp_probs})
    gt = labels_to_submission(_labels(regions, "v", {"polyp": polyp_truth}))
    timeline = build_timeline(table, max_reach=1)
    return timeline, label_truth(timeline, gt)


# ----------------------------------------------------------------------------- finding calibration


def test_finding_temperature_is_the_posterior_under_an_even_prior():
    """Binormal scores z (negatives N(0, 1), positives N(d, 1)) read by a model with temperature
    T and offset c (p = sigmoid(T z + c)): under an even prior logit P(pos | z) = d z - d^2 / 2,
    so on the model's logit r the fit must be a = d / T, b = -d c / T - d^2 / 2, whatever the
    share of positives (here 1 in 21: an unweighted fit would sit log(1/20) = -3 lower)."""
    rng = np.random.default_rng(0)
    d, T, c = 2.0, 0.5, -1.0
    truth = np.repeat([0, 1], [60000, 3000])
    z = rng.standard_normal(len(truth)) + d * truth
    timeline, labels = _one_video(1 / (1 + np.exp(-(T * z + c))), truth)
    fitted = fit_temperatures(timeline, labels, n_frames=200000)[POLYP]
    assert fitted == pytest.approx([d / T, -d * c / T - d**2 / 2], abs=0.12)


def test_finding_temperature_is_kept_off_where_it_cannot_be_fitted():
    rng = np.random.default_rng(1)
    n = 2000
    few = np.zeros(n, int)
    few[:MIN_CALIBRATION_FRAMES - 1] = 1
    timeline, labels = _one_video(np.where(few == 1, 0.9, 0.1), few)
    temperatures = fit_temperatures(timeline, labels, n_frames=50000)
    assert temperatures[POLYP] is None  # too few positives
    assert all(temperatures[LABELS.index(region)] is None for region in ("mouth", "small intestine"))
    enough = np.zeros(n, int)
    enough[:MIN_CALIBRATION_FRAMES] = 1
    timeline, labels = _one_video(np.where(enough == 1, 0.9, 0.1), enough)
    assert fit_temperatures(timeline, labels, n_frames=50000)[POLYP] is not None
    inverted = (rng.random(n) < 0.2).astype(int)  # the scores rank positives below negatives
    timeline, labels = _one_video(np.where(inverted == 1, 0.2, 0.6) + rng.random(n) * 0.1, inverted)
    assert fit_temperatures(timeline, labels, n_frames=50000)[POLYP] is None


def test_calibrated_reads_each_label_through_its_temperature_only():
    rng = np.random.default_rng(2)
    timeline, _ = _one_video(rng.uniform(0.05, 0.95, 300), np.zeros(300, int))
    temperatures = [None] * len(LABELS)
    temperatures[POLYP] = [2.0, -1.0]
    out = calibrated(timeline, temperatures)
    p = timeline.probs[POLYP][timeline.observed]
    expected = 1 / (1 + np.exp(-(2.0 * np.log(p / (1 - p)) - 1.0)))
    assert out.probs[POLYP][timeline.observed] == pytest.approx(expected, rel=1e-6)
    others = [k for k in range(len(LABELS)) if k != POLYP]
    np.testing.assert_array_equal(out.probs[others], timeline.probs[others])


def test_a_timid_finding_is_emitted_once_calibrated_and_the_engine_keeps_it_in_json():
    """Polyp frames read 0.2 (others 0.02): below every run threshold tried, so uncalibrated the
    engine leaves it silent; its temperature makes the threshold grid reach it (the
    autoregressive decoder, which reads logit steps at any level, is off here)."""
    frame_probs, gt = _videos(8, seed=4, polyp_every=2)
    frame_probs["polyp"] = np.where(frame_probs["polyp"] > 0.5, 0.2, 0.02).astype(np.float32)
    plain = _engine_params(min_gain_sqrt_videos=0.1, finding_calibration=False, ar_runs=False)
    engine = fit_engine(tuning_timeline(frame_probs, plain), gt, plain)
    assert engine.policies["polyp"].kind == "off" and engine.temperatures is None
    params = _engine_params(min_gain_sqrt_videos=0.1, finding_calibration=True, ar_runs=False)
    engine = fit_engine(tuning_timeline(frame_probs, params), gt, params)
    assert engine.policies["polyp"].kind == "runs" and engine.temperatures[POLYP][0] > 0
    submission, _ = engine_submission(frame_probs, engine)
    emitted = {v["video_id"] for v in submission["videos"] if any(e["label"] == ["polyp"] for e in v["events"])}
    assert emitted == {f"v{v}" for v in range(0, 8, 2)}
    saved = Engine.from_dict(json.loads(json.dumps(engine.to_dict())))
    assert engine_submission(frame_probs, saved)[0] == submission


# ----------------------------------------------------------------------------- the joint presence model


def test_presence_inputs_are_logits_and_log_counts_nan_without_a_run():
    features = {"max": np.array([0.9, -np.inf]), "top3": np.array([0.8, -np.inf]), "frames": np.array([6.0, -np.inf]),
                "count": np.array([2.0, -np.inf]), "peak": np.array([0.95, -np.inf]), "region": np.array([0.7, -np.inf])}
    x = presence_inputs(features)
    logit = lambda p: np.log(p / (1 - p))  # noqa: E731
    assert x[0] == pytest.approx([logit(0.9), logit(0.8), np.log(7), np.log(3), logit(0.95), 0.7])
    assert np.isnan(x[1]).all()
    model = {"mean": [0.0] * 6, "scale": [1.0] * 6, "coef": [1.0, 0, 0, 0, 0, 0], "intercept": 0.5}
    assert presence_score(x, model).tolist() == pytest.approx([logit(0.9) + 0.5, -np.inf])


def _presence_problem(n=20, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 6))
    gain = np.where(x[:, 0] + 0.5 * x[:, 2] + 0.3 * rng.standard_normal(n) > 0, rng.uniform(0.2, 1.0, n), -1.0)
    return x, gain


def test_presence_scores_are_cross_fitted_and_the_model_is_fitted_on_every_video():
    x, gain = _presence_problem()
    scores, model = fit_presence_model(x, gain, folds=5)
    assert model == _fit_weighted_logistic(x, gain)
    fold = np.arange(len(x)) % 5
    for f in range(5):
        held = fold == f
        expected = presence_score(x[held], _fit_weighted_logistic(x[~held], gain[~held]))
        assert scores[held] == pytest.approx(expected)
    assert not np.allclose(scores, presence_score(x, model))  # not the in-sample scores


def test_presence_model_weighs_videos_by_what_the_decision_is_worth():
    x, gain = _presence_problem(seed=1)
    _, model = fit_presence_model(x, gain)
    # A video where emitting changes nothing (gain 0) has no say, however odd its features.
    _, same = fit_presence_model(np.vstack([x, [[50.0, -50, 50, 0, 0, 0]]]), np.append(gain, 0.0))
    assert same == model
    # The weights are the gains: absent videos that cost three times as much move the model.
    _, costlier = fit_presence_model(x, np.where(gain < 0, 3 * gain, gain))
    assert costlier["intercept"] < model["intercept"] - 0.3
    # A video without a run (NaN row) is left out of the fit and scores -inf.
    scores, with_nan = fit_presence_model(np.vstack([x, [[np.nan] * 6]]), np.append(gain, 1.0))
    assert with_nan == model and scores[-1] == -np.inf
    assert fit_presence_model(x[:3], np.array([1.0, -1.0, -1.0])) is None  # 1 video on a side: nothing to learn


def test_joint_presence_separates_what_no_single_feature_can():
    """Polyp truly in every third video (6 frames at 0.9). The absent videos hold either 6 frames
    at 0.99 (as long as a true one, stronger) or 1 frame at 0.9 (as strong, shorter): no single
    feature's gate admits the present videos only, a model over strength and length does."""
    frame_probs, gt = _videos(15, seed=5, polyp_every=3)
    for v in range(15):
        rows = np.flatnonzero(frame_probs["video_id"].to_numpy() == f"v{v}")
        middle = rows[len(rows) // 2]
        if v % 3 == 1:
            frame_probs.loc[middle:middle + 5, "polyp"] = np.float32(0.99)
        elif v % 3 == 2:
            frame_probs.loc[middle, "polyp"] = np.float32(0.9)
    timeline = tuning_timeline(frame_probs, _engine_params())
    c = run_candidates(timeline, POLYP, 0.5, 1, 1, 10)
    assert set(np.round(c.features["max"], 2)) == {0.9, 0.99} and set(c.features["frames"]) == {1, 6}
    knobs = {"min_gain_sqrt_videos": 0.1, "min_lengths": [1], "median_windows": [1], "thresholds": [0.5]}
    single = _engine_params(presence_features=["max", "top3", "frames", "count", "peak", "region"], **knobs)
    assert fit_engine(timeline, gt, single).policies["polyp"].kind == "off"
    params = _engine_params(presence_features=["max", "frames", "joint"], **knobs)
    engine = fit_engine(timeline, gt, params)
    assert engine.policies["polyp"].evidence == "joint"
    submission, _ = engine_submission(frame_probs, engine)
    emitted = {v["video_id"] for v in submission["videos"] if any(e["label"] == ["polyp"] for e in v["events"])}
    assert emitted == {f"v{v}" for v in range(0, 15, 3)}
    saved = Engine.from_dict(json.loads(json.dumps(engine.to_dict())))
    assert engine_submission(frame_probs, saved)[0] == submission


def test_joint_alone_without_enough_videos_leaves_the_label_silent():
    frame_probs, gt = _videos(2, seed=6, polyp_every=2)  # 1 present, 1 absent video: no model
    params = _engine_params(presence_features=["joint"], min_gain_sqrt_videos=0.0)
    engine = fit_engine(tuning_timeline(frame_probs, params), gt, params)
    assert engine.policies["polyp"].kind == "off"
    assert isinstance(pd.DataFrame(engine_submission(frame_probs, engine)[0]["videos"]), pd.DataFrame)


def test_label_truth_marks_on_off_and_unknown_and_refuses_unknown_labels():
    table = pd.concat([_table(np.full(10, 3), "a"), _table(np.full(5, 3), "b")], ignore_index=True)
    timeline = build_timeline(table, max_reach=1)
    gt = {"videos": [{"video_id": "a", "events": [{"start": 0, "end": 9, "label": ["small intestine"]},
                                                  {"start": 2, "end": 4, "label": ["polyp", "small intestine"]}]}]}
    truth = label_truth(timeline, gt)
    a = timeline.observed & (np.arange(len(timeline.observed)) < timeline.video_first[1])
    b = timeline.observed & ~a
    assert truth[POLYP, a].tolist() == [0, 0, 1, 1, 1, 0, 0, 0, 0, 0]
    assert (truth[LABELS.index("small intestine"), a] == 1).all()
    assert (truth[:, b] == -1).all()  # video b has no ground truth: neither on nor off
    assert (truth[:, ~timeline.observed] == -1).all()
    gt["videos"][0]["events"].append({"start": 5, "end": 6, "label": ["tumour"]})
    with pytest.raises(DataError, match="video a holds unknown label 'tumour'"):
        label_truth(timeline, gt)


def test_region_feature_is_the_run_frames_mean_share_of_their_decoded_region():
    """Two polyp runs in one video: 4 frames in the small intestine (share 0.8 of the training
    polyp frames), 2 in the colon (0.2): (4 x 0.8 + 2 x 0.2) / 6; no path or shares: 1."""
    regions = np.repeat([2, 3, 4], [20, 20, 20])
    polyp = np.full(60, 0.02)
    polyp[25:29] = 0.9
    polyp[45:47] = 0.9
    timeline = build_timeline(_table(regions, "v", {"polyp": polyp}), max_reach=1)
    path = np.full(len(timeline.observed), -1)
    path[timeline.observed] = regions
    shares = [0.0, 0.0, 0.0, 0.8, 0.2]
    c = run_candidates(timeline, POLYP, 0.5, 1, 1, 10, path=path, shares=shares)
    assert c.features["region"][0] == pytest.approx((4 * 0.8 + 2 * 0.2) / 6)
    path[np.flatnonzero(timeline.observed)[40:]] = -1  # the colon run outside every decoded region: share 0
    c = run_candidates(timeline, POLYP, 0.5, 1, 1, 10, path=path, shares=shares)
    assert c.features["region"][0] == pytest.approx(4 * 0.8 / 6)
    assert run_candidates(timeline, POLYP, 0.5, 1, 1, 10).features["region"][0] == 1.0
    from vce.post.engine.candidates import region_shares

    gt = {"videos": [{"video_id": "v", "events": [{"start": 0, "end": 7, "label": ["small intestine", "polyp"]},
                                                  {"start": 8, "end": 9, "label": ["colon", "polyp"]},
                                                  {"start": 10, "end": 30, "label": ["colon"]}]}]}
    assert region_shares(gt, "polyp") == pytest.approx([0, 0, 0, 0.8, 0.2])
    assert region_shares(gt, "ulcer") is None


def test_an_engine_whose_run_policy_lacks_a_key_is_refused_by_name():
    frame_probs, gt = _videos(4, seed=7, polyp_every=2)
    params = _engine_params(min_gain_sqrt_videos=0.1)
    saved = fit_engine(tuning_timeline(frame_probs, params), gt, params).to_dict()
    assert saved["policies"]["polyp"]["kind"] == "runs"
    del saved["policies"]["polyp"]["shares"]
    with pytest.raises(DataError, match=r"'polyp' policy lacks \['shares'\].*rerun the thresholds stage"):
        Engine.from_dict(saved, "models/thresholds.json:engine")


def test_the_region_gate_admits_runs_in_the_findings_region_only():
    """Polyp truly in the small intestine of every other video; the others hold as strong and as
    long a run in the colon, where the training polyps never are: only the region context
    separates them, at fitting and when the engine is applied."""
    frame_probs, gt = _videos(8, seed=8, polyp_every=2)
    for v in range(1, 8, 2):
        rows = np.flatnonzero(frame_probs["video_id"].to_numpy() == f"v{v}")
        frame_probs.loc[rows[-15:-9], "polyp"] = np.float32(0.9)  # inside the colon (40-80 frames long)
    params = _engine_params(presence_features=["max", "frames", "region"], min_gain_sqrt_videos=0.1)
    engine = fit_engine(tuning_timeline(frame_probs, params), gt, params)
    assert engine.policies["polyp"].evidence == "region"
    assert engine.policies["polyp"].shares == pytest.approx([0, 0, 0, 1, 0])
    submission, _ = engine_submission(frame_probs, engine)
    emitted = {v["video_id"] for v in submission["videos"] if any(e["label"] == ["polyp"] for e in v["events"])}
    assert emitted == {f"v{v}" for v in range(0, 8, 2)}


def test_presence_weighting_reads_the_rate_only_where_no_tuning_video_lacks_the_label():
    assert presence_weighting(np.array([True, True]), 0.25) == (0.25, 1.5)
    assert presence_weighting(np.array([True, False]), 0.25) == (1.0, 0.0)  # the gate sees an absent video
    assert presence_weighting(np.array([True, True]), None) == (1.0, 0.0)
    assert presence_weighting(np.array([True, True]), 1.0) == (1.0, 0.0)


def test_presence_rates_are_shares_of_videos_holding_the_label():
    frames = pd.concat([_labels(np.full(4, 3), "a", {"polyp": [0, 1, 0, 0]}), _labels(np.full(3, 3), "b"),
                        _labels(np.full(2, 2), "c")], ignore_index=True)
    rates = presence_rates(frames)
    assert rates["polyp"] == pytest.approx(1 / 3) and rates["small intestine"] == pytest.approx(2 / 3)
    assert rates["stomach"] == pytest.approx(1 / 3) and rates["ulcer"] == 0.0 and set(rates) == set(LABELS)
    assert presence_rates(frames.iloc[:0]) == {}
    # Held-out test videos (split "test") never count; training and validation videos do.
    frames["split"] = np.repeat(["train", "val", "test"], [4, 3, 2])
    rates = presence_rates(frames)
    assert rates["polyp"] == pytest.approx(1 / 2) and rates["stomach"] == 0.0


def test_a_finding_every_tuning_video_holds_is_weighed_with_its_presence_rate():
    frame_probs, gt = _videos(2, polyp_every=1)  # both tuning videos hold a clear polyp
    params = _engine_params()
    timeline = tuning_timeline(frame_probs, params)
    assert fit_engine(timeline, gt, params).policies["polyp"].kind == "runs"
    # Rare over every labelled video: emitting it everywhere would cost the many videos without it.
    rare = fit_engine(timeline, gt, params, rates={"polyp": 0.25})
    assert rare.policies["polyp"].kind == "off" and rare.policies["polyp"].tuning_ap == 0.75
    common = fit_engine(timeline, gt, params, rates={"polyp": 0.9})
    assert common.policies["polyp"].kind == "runs" and common.policies["polyp"].tuning_ap == pytest.approx(0.9)
