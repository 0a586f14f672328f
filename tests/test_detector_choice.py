"""The finding decoder's detector (thresholded runs or the AR HMM) is chosen on held-out tuning
videos: each half scored by the decoding and gate that win on the other half
(`vce.post.engine.findings._detector_family`), so a detector that only fits the videos it is
scored on loses to one that carries over."""

import json

import numpy as np
import pandas as pd
import pytest
from scipy.special import expit
from sklearn.metrics import roc_auc_score
from test_engine import _engine_params, _labels, _table

from vce.core.errors import DataError
from vce.core.labels import LABEL_INDEX
from vce.post.anatomy import clipped_logits
from vce.post.arhmm import fit_ar_model
from vce.post.engine import Engine, engine_submission, fit_engine, tuning_timeline
from vce.post.engine.findings import _detector_family, _held_out_value, ar_models, rank_auc, screened
from vce.post.engine.policies import RunsPolicy
from vce.post.engine.quantile_runs import video_quantile_mask
from vce.post.engine.regions import label_truth
from vce.post.events import labels_to_submission
from vce.post.timeline import build_timeline


def _policy(detector: str) -> RunsPolicy:
    return RunsPolicy(detector=detector, threshold=0.5 if detector == "threshold" else None, ratio=1.0,
                      median_window=1, min_length=1, regions=None, shares=None, gate=None, evidence="max")


def _tried(detector: str, per_video, evidence=None):
    per_video = np.asarray(per_video, float)
    evidence = np.ones(len(per_video)) if evidence is None else np.asarray(evidence, float)
    return (float(per_video.sum()), _policy(detector), per_video, {"max": evidence})


def test_a_detector_that_fits_each_half_alone_loses_to_one_that_carries_over():
    # Eight videos that all hold the label. The AR detector's two decodings each score 1 on one
    # half only: in-sample the best of them sums 4, but the one that wins on the odd videos scores
    # 0 on the even ones and back: 0 held out. The threshold decoding scores 0.4 everywhere.
    silent = np.zeros(8)
    tried = [_tried("threshold", [0.4] * 8), _tried("ar", [1, 0] * 4), _tried("ar", [0, 1] * 4)]
    assert max(t[0] for t in tried if t[1].detector == "ar") > tried[0][0]  # in-sample, AR wins
    choice = _detector_family(tried, silent, ["max"])
    assert choice["chosen"] == "threshold"
    assert choice["held_out"] == pytest.approx({"threshold": 3.2, "ar": 0.0})


def test_a_detector_that_carries_over_keeps_its_lead_and_pays_for_its_own_overfitting():
    # AR: 0.6 everywhere, or 0.5 / 0.7 alternating. Learned on the odd videos the second wins
    # (2.8 > 2.4) and scores 2.0 on the even ones; learned on the even ones the first (2.4 > 2.0)
    # and scores 2.4 on the odd: 4.4 held out, above the threshold decoding's 3.2.
    silent = np.zeros(8)
    tried = [_tried("threshold", [0.4] * 8), _tried("ar", [0.6] * 8), _tried("ar", [0.5, 0.7] * 4)]
    choice = _detector_family(tried, silent, ["max"])
    assert choice["chosen"] == "ar" and choice["held_out"]["ar"] == pytest.approx(4.4)
    # A decoding that fits one half alone drags its detector down: what a selection would pick.
    tried.append(_tried("ar", [0, 1.5] * 4))
    assert _detector_family(tried, silent, ["max"])["held_out"]["ar"] < 4.4


def test_a_tie_keeps_the_thresholded_runs_and_too_few_videos_or_one_detector_choose_nothing():
    silent = np.zeros(8)
    assert _detector_family([_tried("ar", [0.5] * 8), _tried("threshold", [0.5] * 8)], silent, ["max"])["chosen"] \
        == "threshold"
    assert _detector_family([_tried("ar", [1] * 3), _tried("threshold", [0] * 3)], np.zeros(3), ["max"]) is None
    assert _detector_family([_tried("ar", [1] * 8)], silent, ["max"]) is None


def test_the_other_halfs_gate_is_applied_to_the_scored_half():
    # Present in videos 0-3 (emitting there earns 1), absent in 4-7 (emitting costs the silence
    # credit 1). The evidence separates them, so the gate learned on one half admits exactly the
    # present videos of the other: every video earns 1.
    silent = np.array([0, 0, 0, 0, 1, 1, 1, 1], float)
    per_video = np.array([1, 1, 1, 1, 0, 0, 0, 0], float)
    evidence = np.array([0.9, 0.8, 0.9, 0.8, 0.2, 0.1, 0.2, 0.1])
    items = [(per_video, {"max": evidence})]
    even = np.arange(8) % 2 == 0
    assert _held_out_value(items, silent, ["max"], even) == pytest.approx(4.0)
    # Without a gate every video would be admitted: the absent ones lose their credit.
    flat = [(per_video, {"max": np.ones(8)})]
    assert _held_out_value(flat, silent, ["max"], even) == pytest.approx(2.0)  # the gate admits all: 1+1+0+0
    # No decoding applies on the other half (no run anywhere): the scored half stays silent.
    none = [(per_video, {"max": np.full(8, -np.inf)})]
    assert _held_out_value(none, silent, ["max"], even) == pytest.approx(silent[even].sum())


def test_rank_auc_is_the_roc_auc_with_ties_half_and_ignores_unlabelled_frames():
    rng = np.random.default_rng(0)
    scores = np.round(rng.normal(size=3000), 1)  # many ties
    truth = (rng.random(3000) < 0.1).astype(np.int8)
    truth[::7] = -1  # not counted
    keep = truth >= 0
    assert rank_auc(scores, truth) == pytest.approx(roc_auc_score(truth[keep], scores[keep]), abs=1e-12)
    assert rank_auc(scores, np.zeros(3000, np.int8)) == 0.5
    # Past the cap, every n-th frame of each side: within the sampling error.
    big = rng.normal(size=400_000) + 0.8 * (truth_big := (rng.random(400_000) < 0.3).astype(np.int8))
    exact = roc_auc_score(truth_big, big)
    assert rank_auc(big, truth_big, cap=20_000) == pytest.approx(exact, abs=0.01)
    assert rank_auc(big, truth_big, cap=20_000) != pytest.approx(exact, abs=1e-9)  # it did sample


def test_the_decoder_screen_reads_ranks_not_the_ar_models_own_separation():
    """Blood: a small step on a random walk. The AR(1) fit sees a large step in innovation units
    (its model holds exactly there), but blood's frames barely rank above the others, so the
    screen, which assumes no noise model, leaves blood to the threshold grid. Erosion: a clean
    step in white noise, decoded."""
    rng = np.random.default_rng(1)
    tables, labels = [], []
    for v in range(4):
        n = 1500
        truth = np.zeros(n, np.int8)
        truth[[a + d for a in range(60, n - 60, 120) for d in range(10)]] = 1
        blood = -2.0 + 1.0 * truth + np.cumsum(rng.normal(0, 0.3, n))
        erosion = -2.0 + 3.0 * truth + rng.normal(0, 1, n)
        regions = np.repeat(np.arange(5), [100, 100, 300, 700, 300])
        tables.append(_table(regions, f"v{v}", {"blood": expit(blood), "erosion": expit(erosion)}, seed=v))
        labels.append(_labels(regions, f"v{v}", {"blood": truth, "erosion": truth}))
    timeline = build_timeline(pd.concat(tables, ignore_index=True), max_reach=8)
    truth = label_truth(timeline, labels_to_submission(pd.concat(labels, ignore_index=True)))
    blood, erosion = LABEL_INDEX["blood"], LABEL_INDEX["erosion"]
    assert fit_ar_model(clipped_logits(timeline.probs[blood]), truth[blood])["separation"] > 2.0  # the old screen's bar
    assert rank_auc(clipped_logits(timeline.probs[blood]), truth[blood]) < 0.75
    params = _engine_params(ar_runs=True, decoder_min_auc=0.75)
    passed = screened(timeline, params, truth)
    assert blood not in passed and erosion in passed
    assert ar_models(timeline, params, truth, passed).keys() == {erosion}
    assert screened(timeline, _engine_params(ar_runs=True, decoder_min_auc=0.5), truth) >= {blood, erosion}


def _scaled_videos(n_videos: int, seed: int):
    """Videos whose blood logits are a step of 2.5 in white noise, read through a per-video
    (device) scale of 0.25 or 4 on the logit: a probability threshold that fits one scale
    misses the other; each video's own ranks see the same runs."""
    rng = np.random.default_rng(seed)
    tables, labels = [], []
    for v in range(n_videos):
        n = 2000
        truth = np.zeros(n, np.int8)
        for a in rng.choice(np.arange(80, n - 80, 160), 6, replace=False):
            truth[a:a + int(rng.integers(6, 14))] = 1
        scale = (0.25, 4.0)[v % 2]
        blood = scale * (-4.0 + 2.5 * truth + rng.normal(0, 0.5, n))
        regions = np.repeat(np.arange(5), [100, 100, 400, 1000, 400])
        tables.append(_table(regions, f"v{v}", {"blood": expit(blood)}, seed=seed + v))
        labels.append(_labels(regions, f"v{v}", {"blood": truth}))
    return pd.concat(tables, ignore_index=True), labels_to_submission(pd.concat(labels, ignore_index=True))


def test_the_video_quantile_mask_is_each_videos_own_top_share_whatever_its_scale():
    frame_probs, _ = _scaled_videos(2, seed=0)
    timeline = build_timeline(frame_probs, max_reach=8)
    k = LABEL_INDEX["blood"]
    mask = video_quantile_mask(timeline, k, 0.01)
    bounds = np.append(timeline.video_first, len(mask))
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        observed = timeline.observed[lo:hi]
        assert mask[lo:hi].sum() == 20  # 1 % of the video's 2,000 frames (no ties here)
        assert not (mask[lo:hi] & ~observed).any()
        top = np.argsort(-timeline.probs[k][lo:hi][observed])[:20]
        assert np.flatnonzero(mask[lo:hi][observed]).tolist() == sorted(top.tolist())
    # An increasing map of the scores (another device's calibration) leaves the mask as it is.
    moved = build_timeline(frame_probs.assign(blood=frame_probs["blood"] ** 3), max_reach=8)
    assert (video_quantile_mask(moved, k, 0.01) == mask).all()


def test_under_a_device_scale_the_engine_picks_the_rank_detector_on_held_out_videos_and_applies_it():
    frame_probs, gt = _scaled_videos(8, seed=3)
    params = _engine_params(ar_runs=True, decoder_min_auc=0.6, min_gain_sqrt_videos=0.0, rank_shares=[0.03])
    engine = fit_engine(tuning_timeline(frame_probs, params), gt, params)
    policy = engine.policies["blood"]
    assert policy.kind == "runs" and policy.detector == "rank" and policy.share == 0.03
    held_out = policy.detectors["held_out"]
    assert policy.detectors["chosen"] == "rank" and held_out["rank"] > max(held_out["threshold"], held_out["ar"])
    # Saved and read back, it emits the same events: the rank detector's runs.
    submission, _ = engine_submission(frame_probs, engine)
    saved = Engine.from_dict(json.loads(json.dumps(engine.to_dict())))
    assert engine_submission(frame_probs, saved)[0] == submission
    assert any(e["label"] == ["blood"] for v in submission["videos"] for e in v["events"])
    data = json.loads(json.dumps(engine.to_dict()))
    del data["policies"]["blood"]["share"]
    with pytest.raises(DataError, match=r"'blood' policy lacks \['share'\]"):
        Engine.from_dict(data)
