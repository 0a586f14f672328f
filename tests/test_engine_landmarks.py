"""Landmarks from the posterior of the boundary they mark (`vce.post.engine.landmarks`)."""

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from conftest import section_params

from vce.core.labels import LABEL_INDEX, LABELS, REGIONS
from vce.eval.score import score
from vce.post.engine import Engine, engine_submission, fit_engine, tuning_timeline
from vce.post.engine.gate import LabelObjective
from vce.post.engine.landmarks import (
    appended_events,
    boundary_candidates,
    boundary_policy,
    boundary_posteriors,
    fit_boundary,
    gain_z,
    learn_boundary_spans,
    significant,
)
from vce.post.engine.policies import BoundaryPolicy, RunsPolicy
from vce.post.engine.regions import region_truth
from vce.post.events import labels_to_submission
from vce.post.thresholds import ThresholdParams
from vce.post.timeline import build_timeline

STOMACH, SMALL_INTESTINE = REGIONS.index("stomach"), REGIONS.index("small intestine")
PYLORUS = LABEL_INDEX["pylorus"]


def _engine_params(**overrides):
    return section_params(ThresholdParams, "thresholds", engine=overrides).engine


def _video(video_id, first=0, before=60, after=60, pylorus=2, peak=0.02, rng=None):
    """One video's probabilities and ground truth: a stomach of `before` frames, then the small
    intestine; the pylorus (`pylorus` frames, 0: absent) on the stomach's last frames, its
    probability `peak` over the 21 frames around the boundary (0.02 elsewhere; `rng`: random
    there instead, no signal)."""
    regions = np.repeat([STOMACH, SMALL_INTESTINE], [before, after])
    t = np.arange(first, first + len(regions), dtype=np.int64)
    table = pd.DataFrame({"video_id": video_id, "t": t})
    for label in LABELS:
        table[label] = np.float32(0.02)
    for k, region in enumerate(REGIONS):
        table[region] = np.where(regions == k, 0.9, 0.02).astype(np.float32)
    near = np.abs(np.arange(len(regions)) - before) <= 10
    table.loc[near, "pylorus"] = np.float32(peak) if rng is None else rng.uniform(0.01, 0.9, near.sum()).astype(np.float32)
    truth = pd.DataFrame({"video_id": video_id, "t": t})
    for k, label in enumerate(LABELS):
        truth[label] = (regions == k).astype(np.uint8) if label in REGIONS else np.uint8(0)
    if pylorus:
        truth.loc[before - pylorus:before - 1, "pylorus"] = np.uint8(1)
    return table, labels_to_submission(truth)["videos"]


def _scores(timeline):
    """(P, 5) log region probabilities (0 unobserved) and their argmax path (-1 unobserved)."""
    scores = np.zeros((len(timeline.observed), 5))
    rows = np.flatnonzero(timeline.observed)
    scores[rows] = np.log(timeline.probs[[0, 1, 2, 3, 4]][:, rows].T)
    path = np.where(timeline.observed, scores.argmax(axis=1), -1)
    return scores, path


def _frames(videos):
    return pd.concat([t for t, _ in videos], ignore_index=True), {"videos": [v for _, vs in videos for v in vs]}


# ----------------------------------------------------------------------------- the posterior


@pytest.mark.parametrize("temperature", [0.3, 1.0])
def test_the_boundary_posterior_sums_each_crossings_evidence_in_the_window(temperature):
    rng = np.random.default_rng(3)
    frames, _ = _frames([_video("a", before=40, after=40)])
    timeline = build_timeline(frames, max_reach=1)
    scores, path = _scores(timeline)
    scores[timeline.observed] += rng.normal(0, 0.5, (timeline.observed.sum(), 5))
    (lo, posterior), = boundary_posteriors(timeline, scores, path, "pylorus", 6, temperature)
    c = int(timeline.video_first[0]) + 40
    assert lo == c - 6 and len(posterior) == 13  # [c - 6, c + 6]
    brute = np.array([sum(scores[t, STOMACH] for t in range(lo, b)) + sum(scores[t, SMALL_INTESTINE]
                                                                          for t in range(b, lo + 13))
                      for b in range(lo, lo + 13)])
    expected = np.exp(temperature * (brute - brute.max()))
    np.testing.assert_allclose(posterior, expected / expected.sum(), rtol=1e-9)
    # The window stays inside the two regions the path holds there: a third region cuts it.
    path[c - 3] = REGIONS.index("esophagus")
    (lo, posterior), = boundary_posteriors(timeline, scores, path, "pylorus", 6, temperature)
    assert lo == c - 2 and len(posterior) == 9


def test_a_bimodal_posterior_ranks_candidates_at_both_modes_in_probability_order():
    timeline = build_timeline(_frames([_video("a", first=100)])[0], max_reach=1)
    first = int(timeline.video_first[0])
    posterior = np.full(11, 0.01)
    posterior[2], posterior[8] = 0.5, 0.41  # two modes: at first + 50 + 2 and first + 50 + 8
    spans = [[-1, 1, 0.6], [-2, 2, 0.4]]
    c = boundary_candidates(timeline, [(first + 50, posterior)], "pylorus", spans, 0.0, 4)
    # (b, span) scored P(b) x weight: 0.30, 0.246, 0.20, 0.164; in the video's own time (100 + position).
    assert c.events == [[(151, 151), (157, 157), (150, 151), (156, 157)]]
    assert c.clinical == [[(151, 151)]]
    assert c.features["sharpness"][0] == 0.5 and c.features["top"][0] == pytest.approx(0.3)
    # Pairs that place the same event add up: [x, x] from (x + 1, offset -1) and (x, offset 0).
    flat = np.full(11, 1 / 11)
    c = boundary_candidates(timeline, [(first + 50, flat)], "pylorus", [[-1, 1, 0.5], [0, 1, 0.5]], 0.0, 3)
    assert c.features["top"][0] == pytest.approx(1 / 11)  # 0.5 / 11 twice
    assert len(c.events[0]) == 3 and all(s == e for s, e in c.events[0])


def test_the_landmarks_probability_reweights_the_ranking_only_when_asked():
    table, _ = _video("a", first=0)
    table.loc[table["t"] == 57, "pylorus"] = np.float32(0.95)  # its own frames say 57
    timeline = build_timeline(table, max_reach=1)
    first = int(timeline.video_first[0])
    posterior = np.zeros(11)
    posterior[[5, 8]] = 0.6, 0.4  # the regions say 55 more than 58
    plain = boundary_candidates(timeline, [(first + 50, posterior)], "pylorus", [[-1, 1, 1.0]], 0.0, 2)
    weighted = boundary_candidates(timeline, [(first + 50, posterior)], "pylorus", [[-1, 1, 1.0]], 1.0, 2)
    assert plain.events[0] == [(54, 54), (57, 57)] and weighted.events[0] == [(57, 57), (54, 54)]


def test_candidates_and_spans_use_each_videos_own_time_axis():
    videos = [_video("a", first=0, before=50), _video("b", first=700, before=80, pylorus=3)]
    frames, gt = _frames(videos)
    timeline = build_timeline(frames, max_reach=1)
    scores, path = _scores(timeline)
    truth = region_truth(timeline, gt)
    spans = learn_boundary_spans(timeline, truth, gt, "pylorus", 10)
    assert spans == [[-3, 3, 0.5], [-2, 2, 0.5]]  # equal weights: the earlier offset first
    posteriors = boundary_posteriors(timeline, scores, path, "pylorus", 10, 1.0)
    c = boundary_candidates(timeline, posteriors, "pylorus", spans, 0.0, 2)
    assert c.events == [[(47, 49), (48, 49)], [(777, 779), (778, 779)]]  # ties: the earlier start first
    # A video whose path never crosses into the small intestine has no candidate and no evidence.
    lone = build_timeline(_video("c", before=60, after=0, pylorus=0)[0], max_reach=1)
    c = boundary_candidates(lone, boundary_posteriors(lone, *_scores(lone), "pylorus", 10, 1.0), "pylorus", spans, 0.0, 2)
    assert c.events == [[]] and c.features["all"].tolist() == [-np.inf]


# ----------------------------------------------------------------------------- the gate and the cross-fit


def _setting(videos, **overrides):
    frames, gt = _frames(videos)
    params = _engine_params(**overrides)
    timeline = build_timeline(frames, max_reach=1)
    scores, path = _scores(timeline)
    objective = LabelObjective(timeline, gt, params.objective)
    return timeline, objective, params, scores, path, region_truth(timeline, gt), gt


def _in_sample(timeline, objective, params, scores, path, truth, gt):
    """The best summed AP of the boundary candidates fitted and scored on the same videos."""
    from vce.post.engine.landmarks import _BoundaryFit

    everyone = np.ones(len(timeline.video_ids), bool)
    lists = _BoundaryFit(timeline, objective, params, scores, path, truth, gt, "pylorus").candidate_lists(everyone)[1]
    return fit_boundary(objective, "pylorus", lists, everyone, params.landmark_features)


def test_the_gate_stays_silent_where_presence_cannot_be_predicted():
    # Videos in pairs with the same probabilities, one holding the pylorus (exactly at the
    # boundary) and one not: no evidence tells them apart, so no gate beats silence. (Each pair
    # in one of the alternate halves the cross-fit learns on: a0 a1 b0 b1 a2 a3 b2 b3 ...)
    rng = np.random.default_rng(0)
    peaks = rng.uniform(0.05, 0.9, 8)
    videos = []
    for four in range(0, 8, 2):
        videos += [_video(f"v{pair:02d}{side}", before=60 + pair, pylorus=2 * (side == "a"), peak=float(peaks[pair]))
                   for side in "ab" for pair in (four, four + 1)]
    setting = _setting(videos)
    objective = setting[1]
    value, policy = boundary_policy(*setting, "pylorus")
    assert policy is None and value == objective.silent("pylorus").sum() == 8
    assert _in_sample(*setting)[1] is None  # not even in sample


def test_the_cross_fit_refuses_an_in_sample_only_win():
    # In the first half of the alternate videos the pylorus's probability is high where it is
    # present, in the other half where it is absent: fitted on all 16 a gate on it wins by 4
    # videos; learned on either half it is wrong on the other (or silent).
    videos = []
    for i in range(16):
        holds = i % 4 < 2
        peak = (0.7 if holds else 0.3) if i % 2 == 0 else (0.2 if holds else 0.6)
        videos.append(_video(f"v{i:02d}", before=60 + i, pylorus=2 * holds, peak=peak))
    setting = _setting(videos)
    timeline, objective, params = setting[:3]
    silence = objective.silent("pylorus").sum()
    margin = params.min_gain_sqrt_videos * np.sqrt(len(videos))
    assert _in_sample(*setting)[0] == silence + 4 > silence + margin
    value, _ = boundary_policy(*setting, "pylorus")
    assert value == silence - 4  # the first half's gate admits the other half's absent videos


def test_the_engine_emits_the_landmark_where_its_probability_says_where_it_is():
    # The pylorus is present in half of the videos; there its probability is high around the
    # boundary (peak 0.5), as wide as a run could not place it, and the boundary places it.
    # (Presence not aligned with the alternate halves the cross-fit learns on.)
    holds = [i % 4 in (1, 2) for i in range(12)]
    tune = [_video(f"v{i:02d}", before=60 + i, pylorus=2 * h, peak=0.5 if h else 0.02) for i, h in enumerate(holds)]
    test = [_video(f"w{i}", first=1000 * i, before=70 + i, pylorus=2 * (i % 2), peak=0.5 if i % 2 else 0.02)
            for i in range(4)]
    frames, gt = _frames(tune)
    test_frames, gt_test = _frames(test)
    params = _engine_params()
    engine = fit_engine(tuning_timeline(frames, params), gt, params)
    policy = engine.policies["pylorus"]
    assert policy.kind == "boundary" and policy.evidence in ("peak", "top")
    submission, clinical = engine_submission(test_frames, engine)
    assert score(gt_test, submission)["per_label@0.95"]["pylorus"] == 1.0
    pylorus = [[(e["start"], e["end"]) for e in v["events"] if e["label"] == ["pylorus"]] for v in submission["videos"]]
    assert [p[:1] for p in pylorus] == [[], [(1069, 1070)], [], [(3071, 3072)]]
    assert all(len(p) <= params.landmark_candidates for p in pylorus)
    assert sum(e["label"] == ["pylorus"] for e in clinical["videos"][1]["events"]) == 1
    # The policy survives thresholds.json.
    data = json.loads(json.dumps(engine.to_dict()))
    assert engine_submission(test_frames, Engine.from_dict(data)) == (submission, clinical)
    # Off: the landmark stays silent (no other policy places a 2-frame event inside a 21-frame plateau).
    off = _engine_params(landmark_candidates=0)
    assert fit_engine(tuning_timeline(frames, off), gt, off).policies["pylorus"].kind != "boundary"


def test_boundary_candidates_follow_a_landmarks_runs_only_where_they_are_emitted():
    events = [[(5, 9)], [], [(1, 2), (3, 4)]]
    extra = [[(5, 9), (7, 8)], [(1, 1)], [(3, 4), (0, 0), (6, 6)]]
    # Not twice, never in a video the runs' gate left silent, within top_k.
    assert appended_events(events, extra, 3) == [[(5, 9), (7, 8)], [], [(1, 2), (3, 4), (0, 0)]]
    runs = RunsPolicy(detector="threshold", threshold=0.5, ratio=1.0, median_window=1, min_length=1, regions=None,
                      shares=None, gate=0.4, evidence="max",
                      boundary=BoundaryPolicy(temperature=0.3, width=30, spans=[[-1, 1, 1.0]], prob_weight=0.0,
                                              candidates=30, evidence="all", gate=None))
    data = json.loads(json.dumps(runs.to_dict()))
    assert data["boundary"]["spans"] == [[-1, 1, 1.0]] and RunsPolicy.from_dict(data) == runs
    assert "boundary" not in replace(runs, boundary=None).to_dict()


def test_a_summed_gain_over_the_margin_made_of_a_few_coin_flips_is_not_significant():
    params = _engine_params()
    chance = np.array([1.0] * 6 + [-1.0] * 4 + [0.0] * 30)  # +2 over 40 videos: above the margin of 1.0
    assert chance.sum() > params.min_gain_sqrt_videos * np.sqrt(40)
    assert gain_z(chance) < params.landmark_min_z
    assert gain_z(np.array([1.0] * 12 + [-1.0] * 2 + [0.0] * 26)) > params.landmark_min_z
    assert gain_z(np.zeros(5)) == 0.0 and gain_z(np.ones(1)) == -np.inf


def test_a_gain_at_one_threshold_does_not_hide_a_loss_at_the_other():
    # A boundary a few frames off: matched at tIoU 0.5 in 18 of 20 videos holding the landmark,
    # at 0.95 in 1; absent in the other 20, emitted in 3 of them (each loses its silence credit):
    # +15 at 0.5, -2 at 0.95, their mean +6.5 (2.4 standard errors).
    silent = np.array([0.0] * 20 + [1.0] * 20)
    at_05 = np.array([1.0] * 18 + [0.0] * 2 + [0.0] * 3 + [1.0] * 17)
    at_095 = np.array([1.0] * 1 + [0.0] * 19 + [0.0] * 3 + [1.0] * 17)
    weights = {"mean": {0.5: 0.5, 0.95: 0.5}, "map@0.5": {0.5: 1.0, 0.95: 0.0}}
    assert gain_z(0.5 * at_05 + 0.5 * at_095 - silent) > 2.0  # the mean alone passes
    assert not significant({0.5: at_05, 0.95: at_095}, silent, weights["mean"], 1.0)
    assert significant({0.5: at_05, 0.95: at_095}, silent, weights["map@0.5"], 1.0)  # 0.95 not weighed
    assert significant({0.5: at_05, 0.95: at_05}, silent, weights["mean"], 1.0)
