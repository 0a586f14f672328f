import json

import numpy as np
import pandas as pd
import pytest
from conftest import repo_params, section_params
from hypothesis import given, settings
from hypothesis import strategies as st

from vce.core.errors import DataError
from vce.core.labels import LABELS, REGIONS
from vce.core.params import ParamsError, from_dict
from vce.eval.score import average_precisions, check_submission, score
from vce.post.engine import Engine, engine_submission, fit_engine, tuning_timeline
from vce.post.engine.candidates import hysteresis_runs, learn_compatibility, region_candidates, run_candidates
from vce.post.engine.fit import timeline_of_videos
from vce.post.engine.gate import LabelObjective, fit_gate
from vce.post.engine.regions import learn_durations, region_truth
from vce.post.engine.variants import FROM_END, FROM_START, RUN, learn_anchors, learn_variants
from vce.post.events import labels_to_submission
from vce.post.thresholds import ThresholdParams
from vce.post.timeline import build_timeline

# ----------------------------------------------------------------------------- the scorer property

spans = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 12)).map(lambda s: (s[0], s[0] + s[1])), max_size=6)


def _one_label(gt_spans, pred_spans, label="polyp"):
    gt = {"videos": [{"video_id": "v", "events": [{"start": 0, "end": 200, "label": ["colon"]}]
                      + [{"start": a, "end": b, "label": [label]} for a, b in gt_spans]}]}
    pred = {"videos": [{"video_id": "v", "events": [{"start": a, "end": b, "label": [label]} for a, b in pred_spans]}]}
    result = score(gt, pred)
    return result["per_label@0.5"][label], result["per_label@0.95"][label]


@settings(max_examples=300, deadline=None)
@given(gt_spans=spans.filter(bool), ranked=spans, appended=spans)
def test_appending_candidates_to_a_present_label_never_lowers_its_ap(gt_spans, ranked, appended):
    before = _one_label(gt_spans, ranked)
    after = _one_label(gt_spans, ranked + appended)
    assert after[0] >= before[0] - 1e-12 and after[1] >= before[1] - 1e-12


def test_but_one_event_of_an_absent_label_costs_its_whole_ap():
    assert _one_label([], []) == (1.0, 1.0)
    assert _one_label([], [(3, 5)]) == (0.0, 0.0)


@settings(max_examples=150, deadline=None)
@given(gt_spans=st.lists(spans, min_size=3, max_size=3), pred_spans=st.lists(spans, min_size=3, max_size=3),
       objective=st.sampled_from(["mean", "map@0.5", "map@0.95"]))
def test_label_objective_scores_each_video_as_the_scorer_does(gt_spans, pred_spans, objective):
    # Three videos; the third has no labelled event at all, so the scorer skips it (AP 0 here).
    label = "blood"
    gt = {"videos": [{"video_id": f"v{i}", "events": ([{"start": 0, "end": 90, "label": ["colon"]}] if i < 2 else [])
                      + [{"start": a, "end": b, "label": [label, "ulcer"] if a % 2 else [label]}
                         for a, b in (gt_spans[i] if i < 2 else [])]} for i in range(3)]}
    timeline = build_timeline(pd.DataFrame({"video_id": ["v0", "v1", "v2"], "t": [0, 0, 0],
                                            **{name: [0.5] * 3 for name in LABELS}}), "t")
    got = LabelObjective(timeline, gt, objective).per_video(label, pred_spans)
    pred = {"videos": [{"video_id": f"v{i}", "events": [{"start": a, "end": b, "label": [label]} for a, b in pred_spans[i]]}
                       for i in range(3)]}
    result = score(gt, pred)
    weights = {"mean": (0.5, 0.5), "map@0.5": (1.0, 0.0), "map@0.95": (0.0, 1.0)}[objective]
    want = [sum(w * score({"videos": [gt["videos"][i]]}, {"videos": [pred["videos"][i]]})[f"per_label@{t}"][label]
                for w, t in zip(weights, (0.5, 0.95))) for i in range(2)] + [0.0]
    assert np.allclose(got, want, atol=1e-12)
    assert result["per_video@0.5"].keys() == {"v0", "v1"}


@settings(max_examples=100, deadline=None)
@given(gt_spans=st.lists(spans, min_size=3, max_size=3), pred_spans=st.lists(spans, min_size=3, max_size=3))
def test_label_objective_reads_candidate_arrays_as_it_reads_their_lists(gt_spans, pred_spans):
    """`Candidates.spans` (counts, starts, ends) score as the event lists they hold (video 2 unscored)."""
    label = "blood"
    gt = {"videos": [{"video_id": f"v{i}", "events": ([{"start": 0, "end": 90, "label": ["colon"]}] if i != 1 else [])
                      + [{"start": a, "end": b, "label": [label]} for a, b in (gt_spans[i] if i != 1 else [])]}
                     for i in range(3)]}
    timeline = build_timeline(pd.DataFrame({"video_id": ["v0", "v1", "v2"], "t": [0, 0, 0],
                                            **{name: [0.5] * 3 for name in LABELS}}), "t")
    objective = LabelObjective(timeline, gt, "mean")
    flat = [span for video in pred_spans for span in video]
    arrays = (np.array([len(v) for v in pred_spans]), np.array([a for a, _ in flat], np.int64),
              np.array([b for _, b in flat], np.int64))
    assert np.array_equal(objective.per_video(label, pred_spans, arrays), objective.per_video(label, pred_spans))


def test_label_objective_leaves_spans_the_arrays_cannot_hold_to_the_scorers_definition():
    gt = {"videos": [{"video_id": "v0", "events": [{"start": 0, "end": 90, "label": ["colon"]},
                                                    {"start": 3, "end": 7, "label": ["blood"]}]}]}
    timeline = build_timeline(pd.DataFrame({"video_id": ["v0"], "t": [0], **{name: [0.5] for name in LABELS}}), "t")
    objective = LabelObjective(timeline, gt, "mean")
    for spans in ([(7, 3), (3, 7)], [(3.0, 7.5), (3, 7)]):  # an end before its start; a float end
        pred = {"videos": [{"video_id": "v0", "events": [{"start": a, "end": b, "label": ["blood"]} for a, b in spans]}]}
        _, aps = average_precisions(gt, pred)
        want = 0.5 * (aps[0.5][0, LABELS.index("blood")] + aps[0.95][0, LABELS.index("blood")])
        assert objective.per_video("blood", [spans]) == pytest.approx([want])
        assert 0 < want < 1  # the odd span is a miss, the exact one a hit at rank 2


# ----------------------------------------------------------------------------- pieces


def test_fit_gate_admits_the_videos_worth_emitting():
    evidence = np.array([0.95, 0.9, 0.6, 0.5, -np.inf])
    emitted = np.array([0.8, 0.5, 0.0, 0.0, 0.0])  # AP if emitted
    silent = np.array([0.0, 0.0, 1.0, 1.0, 1.0])  # absent in the last three
    gate, total = fit_gate(evidence, emitted, silent)
    assert 0.6 < gate <= 0.9 and total == pytest.approx(0.8 + 0.5 + 3)
    gate, total = fit_gate(evidence, np.zeros(5), silent)  # emitting never helps: off
    assert gate == float("inf") and total == 3
    gate, total = fit_gate(evidence, np.ones(5), np.zeros(5))  # every video with evidence: no bound
    assert gate is None and total == 4
    gate, _ = fit_gate(np.array([1.0, 1.0, 0.5]), np.array([1.0, 0.0, 0.0]), np.array([0.0, 0.4, 0.0]))
    assert gate == 0.75  # ties go together: both videos at 1.0 are admitted (gain 1 - 0.4)


def _table(truth_regions, video_id, extra=None, mouth_prob=0.8, seed=0):
    """One video: region probabilities from a region index per frame (-1: none), others 0."""
    n = len(truth_regions)
    rng = np.random.default_rng(seed)
    table = pd.DataFrame({"video_id": video_id, "t": np.arange(n, dtype=np.int64)})
    for label in LABELS:
        table[label] = np.float32(0.02)
    for k, region in enumerate(REGIONS):
        on = mouth_prob if k == 0 else 0.8
        table[region] = (np.where(truth_regions == k, on, 0.1) + rng.random(n) * 0.1).astype(np.float32)
    if mouth_prob < 0.5:  # an under-confident mouth: the esophagus looks likelier there
        table.loc[truth_regions == 0, "esophagus"] = np.float32(0.45)
    for label, values in (extra or {}).items():
        table[label] = np.asarray(values, np.float32)
    return table


def _labels(truth_regions, video_id, findings=None):
    n = len(truth_regions)
    labels = pd.DataFrame({"video_id": video_id, "t": np.arange(n, dtype=np.int64)})
    for label in LABELS:
        labels[label] = np.uint8(0)
    for k, region in enumerate(REGIONS):
        labels[region] = (truth_regions == k).astype(np.uint8)
    for label, values in (findings or {}).items():
        labels[label] = np.asarray(values, np.uint8)
    return labels


def test_region_candidates_rank_the_run_then_variants_then_cut_pieces():
    path_regions = np.repeat([0, 1, 2, 3, 4], [10, 10, 30, 40, 10])
    timeline = build_timeline(_table(path_regions, "v"), max_reach=1)
    path = np.full(len(timeline.observed), -1)
    path[timeline.observed] = path_regions
    cuts = {0: [60, 70, 80]}  # another label's event 60-69 and one starting at 80
    c = region_candidates(timeline, path, 3, [(RUN, 0, -2), (RUN, 1, 0)], cuts)  # small intestine: 50-89
    variants = [(RUN, 1, 0), (FROM_END, -2, 0), (FROM_START, 0, 4)]
    assert region_candidates(timeline, path, 3, variants, None).events[0] == [(50, 89), (51, 89), (87, 89), (50, 54)]
    # Pieces longest first, equal lengths in time order.
    assert c.events[0] == [(50, 89), (50, 87), (51, 89), (50, 59), (60, 69), (70, 79), (80, 89)]
    assert c.clinical == [[(50, 89)]] and c.evidence[0] == 40


def _videos(n_videos, seed=0, mouth_prob=0.8, polyp_every=2):
    """Videos with random region lengths; GT mouth ends 2 frames before the probabilities say
    (as if a z-line-like label cut it); polyp events (probability 0.9) in the small intestine of
    every `polyp_every`-th video."""
    rng = np.random.default_rng(seed)
    probs, gt = [], {"videos": []}
    for v in range(n_videos):
        lengths = rng.integers([8, 8, 30, 80, 40], [20, 20, 60, 160, 80])
        regions = np.repeat(np.arange(5), lengths)
        n = len(regions)
        polyp = np.zeros(n)
        if v % polyp_every == 0:
            start = int(lengths[:3].sum()) + 10
            polyp[start : start + 6] = 1
        probs.append(_table(regions, f"v{v}", {"polyp": np.where(polyp == 1, 0.9, 0.02)}, mouth_prob, seed + v))
        truth = regions.copy()
        truth[lengths[0] - 2 : lengths[0]] = -1  # GT mouth stops 2 frames early; those frames unlabelled
        gt["videos"] += labels_to_submission(_labels(truth, f"v{v}", {"polyp": polyp}))["videos"]
    return pd.concat(probs, ignore_index=True), gt


def _engine_params(**overrides):
    return section_params(ThresholdParams, "thresholds", engine=overrides).engine


def test_learned_variants_and_anchors_follow_the_ground_truth():
    frame_probs, gt = _videos(6)
    params = _engine_params()
    timeline = tuning_timeline(frame_probs, params)
    engine = fit_engine(timeline, gt, params)
    assert [RUN, 0, -2] in engine.policies["mouth"].variants  # the GT mouth ends 2 frames before the decoded run
    # Anchors: an event 3 frames long starting 2 frames before the boundary, in every video.
    from vce.post.anatomy import decode_regions
    from vce.post.engine.regions import region_emissions

    path = decode_regions(timeline, region_emissions(timeline, engine.coef, engine.intercept), engine.switch_penalty)
    landmark_gt = {"videos": [{"video_id": v["video_id"], "events": v["events"] + [
        {"start": e["start"] - 2, "end": e["start"], "label": ["pylorus"]}
        for e in v["events"] if e["label"] == ["small intestine"]][:1]} for v in gt["videos"]]}
    assert learn_anchors(timeline, path, landmark_gt, "pylorus", 3)[0] == [-2, 3]
    assert learn_variants(timeline, path, gt, 0, 0, 100) == []


def test_engine_end_to_end_beats_empty_and_writes_two_lists():
    frame_probs, gt = _videos(8, seed=1, mouth_prob=0.35)
    tune_ids = {f"v{v}" for v in range(6)}
    tune = frame_probs[frame_probs["video_id"].isin(tune_ids)]
    test = frame_probs[~frame_probs["video_id"].isin(tune_ids)]
    gt_tune = {"videos": [v for v in gt["videos"] if v["video_id"] in tune_ids]}
    gt_test = {"videos": [v for v in gt["videos"] if v["video_id"] not in tune_ids]}
    params = _engine_params()
    engine = fit_engine(tuning_timeline(tune, params), gt_tune, params)
    # An under-confident mouth (0.35 next to esophagus 0.45) is still decoded: calibration.
    submission, clinical = engine_submission(test, engine)
    check_submission(submission, gt_test)
    check_submission(clinical, gt_test)
    empty = {"videos": [{"video_id": v["video_id"], "events": []} for v in gt_test["videos"]]}
    ours, floor = score(gt_test, submission), score(gt_test, empty)
    assert ours["map@0.5"] > floor["map@0.5"] and ours["map@0.95"] > floor["map@0.95"]
    # The decoded mouth matches at 0.5; at 0.95 only its learned variant (end - 2), ranked second.
    assert ours["per_label@0.5"]["mouth"] == 1.0 and ours["per_label@0.95"]["mouth"] == 0.5
    assert ours["per_label@0.95"]["polyp"] == 1.0
    # Clinical: one event per decoded region run and per polyp run, in time order; the
    # submission holds them too, among the ranked candidates.
    for sub_video, clinical_video in zip(submission["videos"], clinical["videos"]):
        counts = {}
        for event in clinical_video["events"]:
            counts[event["label"][0]] = counts.get(event["label"][0], 0) + 1
        assert all(counts[region] == 1 for region in REGIONS)
        assert [e["start"] for e in clinical_video["events"]] == sorted(e["start"] for e in clinical_video["events"])
        assert all(event in sub_video["events"] for event in clinical_video["events"])
        assert len(sub_video["events"]) > len(clinical_video["events"])
        mouths = [e for e in sub_video["events"] if e["label"] == ["mouth"]]
        clinical_mouth = next(e for e in clinical_video["events"] if e["label"] == ["mouth"])
        assert mouths[0] == clinical_mouth and mouths[1]["end"] == clinical_mouth["end"] - 2
    # The fitted engine survives thresholds.json: same submission after a JSON round trip.
    again = Engine.from_dict(json.loads(json.dumps(engine.to_dict())))
    assert engine_submission(test, again) == (submission, clinical)


def test_engine_params_name_the_key():
    for key, value, message in (("median_windows", [2], "thresholds.engine.median_windows"),
                                ("thresholds", [1.5], "thresholds.engine.thresholds"),
                                ("objective", "auc", "thresholds.engine.objective")):
        values = repo_params()["thresholds"]
        values["engine"][key] = value
        with pytest.raises(ParamsError, match=message):
            from_dict(ThresholdParams, values, "thresholds")


def test_engine_from_dict_names_the_file():
    with pytest.raises(DataError, match="models/thresholds.json:engine"):
        Engine.from_dict({"coef": []}, "models/thresholds.json:engine")


def test_no_frames_and_invalid_frames_give_valid_empty_lists():
    frame_probs, gt = _videos(1)  # one tuning video, as a demo's validation split may be
    params = _engine_params()
    engine = fit_engine(tuning_timeline(frame_probs, params), gt, params)
    assert engine_submission(frame_probs.iloc[:0], engine) == ({"videos": []}, {"videos": []})
    invalid = frame_probs.assign(valid=False)
    nothing = {"videos": [{"video_id": "v0", "events": []}]}
    assert engine_submission(invalid, engine) == (nothing, nothing)


# ----------------------------------------------------------------------------- new rules


def _one_video(values, label="polyp"):
    table = pd.DataFrame({"video_id": "v", "t": np.arange(len(values), dtype=np.int64)})
    for name in LABELS:
        table[name] = np.float32(0.02)
    table[label] = np.asarray(values, np.float32)
    return build_timeline(table, max_reach=1)


def test_hysteresis_extends_a_run_through_a_low_stretch_but_not_below_low():
    probs = [0.1, 0.9, 0.6, 0.6, 0.9, 0.3, 0.9, 0.1, 0.6, 0.6, 0.1]
    timeline = _one_video(probs)
    k = LABELS.index("polyp")
    starts, ends = hysteresis_runs(timeline, k, 0.8, 0.5, 1)  # high 0.8, low 0.4
    # 1-4 bridged by 0.6 >= low; 0.3 < low splits; 8-9 never reaches high: dropped.
    assert list(zip(timeline.time[starts].tolist(), timeline.time[ends].tolist())) == [(1, 4), (6, 6)]
    starts, ends = hysteresis_runs(timeline, k, 0.8, 1.0, 1)  # ratio 1: plain threshold
    assert timeline.time[starts].tolist() == [1, 4, 6] and timeline.time[ends].tolist() == [1, 4, 6]


def test_compatibility_gate_drops_a_finding_outside_its_regions():
    gt = {"videos": [{"video_id": "a", "events": [
        {"start": 0, "end": 9, "label": ["stomach"]},
        {"start": 10, "end": 13, "label": ["small intestine", "polyp"]},
        {"start": 14, "end": 99, "label": ["small intestine"]},
        {"start": 100, "end": 100, "label": ["colon", "polyp"]}]}]}
    assert learn_compatibility(gt, "polyp", 0.0) == [3, 4]  # every region it co-occurs with
    assert learn_compatibility(gt, "polyp", 0.25) == [3]  # colon holds 1 of its 5 frames
    assert learn_compatibility(gt, "ulcer", 0.0) is None  # no ground truth: no gate
    values = np.full(40, 0.02)
    values[[5, 6, 25, 26]] = 0.9  # a polyp-looking run in the stomach and one in the small intestine
    timeline = _one_video(values)
    path = np.full(len(timeline.observed), -1)
    path[timeline.observed] = np.repeat([2, 3], 20)
    k = LABELS.index("polyp")
    gated = run_candidates(timeline, k, 0.5, 1, 1, 10, path=path, regions=[3])
    assert gated.events == [[(25, 26)]]
    assert sorted(run_candidates(timeline, k, 0.5, 1, 1, 10, path=path, regions=None).events[0]) == [(5, 6), (25, 26)]


def test_the_emission_bar_scales_with_the_square_root_of_the_tuning_videos():
    # Two tuning videos (a demo's validation split), polyp exactly predicted in both: AP 1 + 1.
    frame_probs, gt = _videos(2, seed=3, polyp_every=1)
    for bar, kind in ((0.158, "runs"), (1.41, "runs"), (1.42, "off")):  # the gain of 2 against bar x sqrt(2)
        params = _engine_params(min_gain_sqrt_videos=bar)
        engine = fit_engine(tuning_timeline(frame_probs, params), gt, params)
        assert engine.policies["polyp"].kind == kind, bar


def test_learned_durations_are_quantiles_of_the_training_runs():
    frame_probs, gt = _videos(4, seed=5)
    timeline = tuning_timeline(frame_probs, _engine_params())
    truth = region_truth(timeline, gt)
    assert learn_durations(timeline, truth, 0.0, 0.0) is None
    low, high = learn_durations(timeline, truth, 0.5, 2.0)
    spans = [[(e["start"], e["end"]) for e in video["events"] if region in e["label"]]
             for region in REGIONS for video in gt["videos"]]
    lengths = np.array([max(e for _, e in s) - min(a for a, _ in s) + 1 for s in spans]).reshape(5, 4)
    assert low == [int(np.floor(np.quantile(x, 0.5))) for x in lengths]
    assert high == [2 * max(x) for x in lengths]
    # The fitted engine decodes under the prior it learned (kept through thresholds.json).
    params = _engine_params(min_duration_quantile=0.5, max_duration_factor=2.0)
    engine = fit_engine(timeline, gt, params)
    assert engine.durations == [low, high]
    assert Engine.from_dict(json.loads(json.dumps(engine.to_dict()))).durations == [low, high]


def test_timeline_of_videos_is_the_timeline_of_those_videos():
    frame_probs, _ = _videos(3, seed=2)
    timeline = tuning_timeline(frame_probs, _engine_params())
    part = timeline_of_videos(timeline, [2, 0])
    direct = tuning_timeline(pd.concat([frame_probs[frame_probs.video_id == v] for v in ("v2", "v0")]), _engine_params())
    assert part.video_ids == direct.video_ids == ["v2", "v0"]
    assert part.video_first.tolist() == direct.video_first.tolist()
    assert (part.observed == direct.observed).all() and (part.time[part.observed] == direct.time[direct.observed]).all()
    assert np.array_equal(part.probs, direct.probs, equal_nan=True)


def test_cross_fitted_estimate_scores_each_half_with_the_other_halfs_engine():
    frame_probs, gt = _videos(4, seed=4)
    params = _engine_params(cross_fit=True)
    engine = fit_engine(tuning_timeline(frame_probs, params), gt, params)
    by_id = {v["video_id"]: v for v in gt["videos"]}
    inner = _engine_params()
    videos = []
    for fit_on, score_on in ((["v0", "v2"], ["v1", "v3"]), (["v1", "v3"], ["v0", "v2"])):
        part = frame_probs[frame_probs.video_id.isin(fit_on)]
        half = fit_engine(tuning_timeline(part, inner), {"videos": [by_id[v] for v in fit_on]}, inner)
        videos += engine_submission(frame_probs[frame_probs.video_id.isin(score_on)], half)[0]["videos"]
    expected = score({"videos": [by_id[v["video_id"]] for v in videos]}, {"videos": videos})
    empty = score({"videos": [by_id[v["video_id"]] for v in videos]}, {"videos": [{"video_id": v["video_id"], "events": []} for v in videos]})
    assert engine.report["cross_fitted"] == {"map@0.5": round(expected["map@0.5"], 4),
                                             "map@0.95": round(expected["map@0.95"], 4),
                                             "empty": round(empty["map@0.5"], 4)}
    assert "cross_fitted" not in fit_engine(tuning_timeline(frame_probs, inner), gt, inner).report


def test_region_prior_weight_is_added_to_the_calibrated_intercepts():
    from vce.post.engine.regions import fit_calibration, region_log_prior

    truth = np.repeat([0, 1, 2, 3, 4, -1], [1, 1, 2, 4, 0, 3])
    assert region_log_prior(truth).tolist() == pytest.approx(np.log([1 / 8, 1 / 8, 2 / 8, 4 / 8, 1e-6]).tolist())
    frame_probs, gt = _videos(4, seed=6)
    for weights in ([0.0], [-0.4]):
        params = _engine_params(prior_weights=weights)
        timeline = tuning_timeline(frame_probs, params)
        engine = fit_engine(timeline, gt, params)
        truth = region_truth(timeline, gt)
        _, intercept = fit_calibration(timeline, truth, params.calibration_frames)
        assert engine.report["prior_weight"] == weights[0]
        assert engine.intercept == pytest.approx((np.asarray(intercept) + weights[0] * region_log_prior(truth)).tolist())


def test_shadow_cuts_append_pieces_cut_at_runs_of_labels_left_silent():
    path_regions = np.repeat([0, 1, 2, 3, 4], [10, 10, 30, 40, 10])
    timeline = build_timeline(_table(path_regions, "v"), max_reach=1)
    path = np.full(len(timeline.observed), -1)
    path[timeline.observed] = path_regions
    c = region_candidates(timeline, path, 3, [], {0: [60, 70, 80]}, {0: [75]})
    # The emitted labels' pieces first, then the new pieces of the cuts with the shadow time added.
    assert c.events[0] == [(50, 89), (50, 59), (60, 69), (70, 79), (80, 89), (70, 74), (75, 79)]
    assert region_candidates(timeline, path, 3, [], None, {0: [75]}).events[0] == [(50, 89), (50, 74), (75, 89)]
    # End to end: polyp left silent (the bar is too high on 2 videos) still cuts the small intestine.
    frame_probs, gt = _videos(2, seed=3, polyp_every=1)
    polyp = [e for e in gt["videos"][0]["events"] if "polyp" in e["label"]][0]
    for shadow, order in ((True, "shortest"), (True, "longest"), (False, "shortest")):
        params = _engine_params(min_gain_sqrt_videos=1.5, shadow_cuts=shadow, region_variants=0, cut_orders=[order])
        engine = fit_engine(tuning_timeline(frame_probs, params), gt, params)
        engine = Engine.from_dict(json.loads(json.dumps(engine.to_dict())))  # the order is kept in JSON
        assert engine.policies["polyp"].kind == "off" and (engine.policies["polyp"].shadow is not None) == shadow
        submission, _ = engine_submission(frame_probs, engine)
        assert not any(e["label"] == ["polyp"] for v in submission["videos"] for e in v["events"])
        intestine = [(e["start"], e["end"]) for e in submission["videos"][0]["events"] if e["label"] == ["small intestine"]]
        run = intestine[0]
        pieces = [(run[0], polyp["start"] - 1), (polyp["start"], polyp["end"]), (polyp["end"] + 1, run[1])]
        sign = 1 if order == "shortest" else -1
        expected = [run, *sorted(pieces, key=lambda p: sign * (p[1] - p[0]))]  # the run, then its pieces by length
        assert intestine == (expected if shadow else [run])


def test_presence_gate_picks_the_video_feature_that_separates_present_from_absent():
    # Polyp truly in v0 and v2 (6 frames at 0.9); v1 and v3 hold a 1-frame blip at 0.99: the
    # strongest run's mean probability cannot tell them apart, its length can.
    frame_probs, gt = _videos(4, seed=7, polyp_every=2)
    for v in ("v1", "v3"):
        rows = np.flatnonzero(frame_probs["video_id"].to_numpy() == v)
        frame_probs.loc[rows[len(rows) // 2], "polyp"] = np.float32(0.99)
    timeline = tuning_timeline(frame_probs, _engine_params())
    c = run_candidates(timeline, LABELS.index("polyp"), 0.5, 1, 1, 10)
    assert c.features["max"].tolist() == pytest.approx([0.9, 0.99, 0.9, 0.99])
    assert c.features["frames"].tolist() == [6, 1, 6, 1] and c.features["count"].tolist() == [1, 1, 1, 1]
    assert c.features["peak"].tolist() == pytest.approx([0.9, 0.99, 0.9, 0.99])
    for features, kind in ((["max"], "off"), (["max", "frames"], "runs")):
        params = _engine_params(presence_features=features, min_gain_sqrt_videos=0.1, min_lengths=[1], median_windows=[1])
        engine = fit_engine(timeline, gt, params)
        assert engine.policies["polyp"].kind == kind
    assert engine.policies["polyp"].evidence == "frames"
    submission, _ = engine_submission(frame_probs, engine)
    emitted = {v["video_id"] for v in submission["videos"] if any(e["label"] == ["polyp"] for e in v["events"])}
    assert emitted == {"v0", "v2"}


def test_the_timeline_reach_covers_the_shadow_runs_windows():
    """A label left silent still decodes its shadow runs: their median window sets the reach too,
    or the window would see the next video's frames."""
    from vce.post.engine.apply import _reach

    frame_probs, gt = _videos(2, seed=3, polyp_every=1)
    params = _engine_params(min_gain_sqrt_videos=1.5, shadow_cuts=True, region_variants=0)
    engine = fit_engine(tuning_timeline(frame_probs, params), gt, params)
    engine.policies["polyp"].shadow.median_window = 31
    assert all(p.kind != "runs" or p.median_window < 31 for p in engine.policies.values())
    assert _reach(engine) == 15
    together, _ = engine_submission(frame_probs, engine)
    apart = [engine_submission(frame_probs[frame_probs.video_id == v], engine)[0]["videos"][0] for v in ("v0", "v1")]
    assert together["videos"] == apart


def test_region_calibration_samples_each_region_equally():
    """Up to n_frames / 5 frames of each region: with every region that large, the shares are
    equal and on uninformative scores the intercepts stay level (a uniform frame sample would put
    the mouth ~2.3 log units under the small intestine, its prior counted again at every frame)."""
    from vce.post.engine.regions import fit_calibration

    shares = [500, 500, 1000, 5000, 2000]
    regions = np.repeat(np.arange(5), shares)
    table = _table(regions, "v")
    rng = np.random.default_rng(5)
    for region in REGIONS:  # scores that say nothing about the region
        table[region] = rng.uniform(0.2, 0.8, len(table)).astype(np.float32)
    timeline = build_timeline(table, max_reach=1)
    truth = np.full(len(timeline.observed), -1)
    truth[timeline.observed] = regions
    _, intercept = fit_calibration(timeline, truth, n_frames=2000)
    assert np.ptp(intercept) < 1.0


def test_gc_paused_pauses_the_collector_and_restores_its_state():
    import gc

    from vce.post.engine.candidates import gc_paused

    seen = []
    inner = gc_paused(lambda: seen.append(gc.isenabled()))
    assert gc.isenabled()
    inner()
    assert seen == [False] and gc.isenabled()
    gc.disable()
    try:
        inner()
        assert not gc.isenabled()  # a caller's own pause is left as it was
    finally:
        gc.enable()


def test_label_objective_scores_ground_truth_with_integer_video_ids():
    """Issue 48, latent defect: truth whose `video_id` are ints (the scorer and its CLI accept
    them) left every video unscored (`np.isin` of str against int), every AP 0, no error.
    Mutation killed: keeping the truth's int ids."""
    timeline = build_timeline(pd.DataFrame({"video_id": ["1", "2"], "t": [0, 0], **{name: [0.5] * 2 for name in LABELS}}), "t")
    events = [{"start": 0, "end": 90, "label": ["colon"]}, {"start": 3, "end": 7, "label": ["blood"]}]
    as_str = {"videos": [{"video_id": v, "events": events} for v in ("1", "2")]}
    as_int = {"videos": [{"video_id": int(v), "events": events} for v in ("1", "2")]}
    pred = [[(3, 7)], [(3, 7)]]
    want = LabelObjective(timeline, as_str, "mean").per_video("blood", pred)
    assert np.array_equal(LabelObjective(timeline, as_int, "mean").per_video("blood", pred), want)
    assert want.tolist() == [1.0, 1.0]


def test_a_runs_region_is_that_of_its_middle_frame():
    """Issue 48, untested rule: `compatible` reads the decoded region at the run's middle frame,
    not its start or end (a run crossing a boundary belongs where most of it lies). Mutations
    killed: path[starts], path[ends]."""
    from vce.post.engine.candidates import compatible

    path = np.array([0, 0, 1, 1, 1, 2, 2])
    starts, ends = np.array([1, 0, 4]), np.array([5, 1, 6])  # middles 3, 0, 5
    assert compatible(starts, ends, path, [1]).tolist() == [True, False, False]
    assert compatible(starts, ends, path, [0, 2]).tolist() == [False, True, True]
    assert compatible(starts, ends, None, [1]).tolist() == [True, True, True]


def test_a_tie_between_cut_orders_keeps_the_first():
    """Issue 48, untested rule: the documented first-wins tie of `cut_orders` (a later order must
    score more than rounding better). Mutations killed: `>=`, no tolerance."""
    from vce.post.engine.fit import beats

    assert beats(0.5, None)
    assert not beats(0.5, 0.5) and not beats(0.5 + 1e-13, 0.5)
    assert beats(0.5 + 1e-9, 0.5) and not beats(0.4, 0.5)
