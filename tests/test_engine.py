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
from vce.eval.score import check_submission, score
from vce.post.engine import (
    FROM_END,
    FROM_START,
    RUN,
    Engine,
    engine_submission,
    fit_engine,
    fit_gate,
    learn_anchors,
    learn_variants,
    region_candidates,
    tuning_timeline,
)
from vce.post.events import build_timeline, labels_to_submission
from vce.post.thresholds import ThresholdParams

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


def _videos(n_videos, seed=0, mouth_prob=0.8):
    """Videos with random region lengths; GT mouth ends 2 frames before the probabilities say
    (as if a z-line-like label cut it); polyp events (probability 0.9) in even videos."""
    rng = np.random.default_rng(seed)
    probs, gt = [], {"videos": []}
    for v in range(n_videos):
        lengths = rng.integers([8, 8, 30, 80, 40], [20, 20, 60, 160, 80])
        regions = np.repeat(np.arange(5), lengths)
        n = len(regions)
        polyp = np.zeros(n)
        if v % 2 == 0:
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
    assert [RUN, 0, -2] in engine.policies["mouth"]["variants"]  # the GT mouth ends 2 frames before the decoded run
    # Anchors: an event 3 frames long starting 2 frames before the boundary, in every video.
    from vce.post.anatomy import decode_regions
    from vce.post.engine import region_emissions

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
