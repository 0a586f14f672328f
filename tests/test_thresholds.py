import json

import numpy as np
import pandas as pd
import pytest
from conftest import repo_params, section_params

from vce.core.labels import LABELS, NUM_LABELS
from vce.core.params import ParamsError, from_dict
from vce.eval.score import score
from vce.post.events import EventParams, labels_to_submission, probs_to_submission
from vce.post.thresholds import ThresholdParams, f1_thresholds, tune_on_map


def test_f1_threshold_on_a_constructed_case():
    # mouth: positives at 0.7 and 0.8, negatives at 0.2 and 0.75 -> F1 best firing at >= 0.76..0.8.
    y_true = np.zeros((4, NUM_LABELS), np.uint8)
    y_prob = np.zeros((4, NUM_LABELS))
    y_true[:2, 0] = 1
    y_prob[:, 0] = [0.7, 0.8, 0.2, 0.75]
    params = section_params(ThresholdParams, "thresholds", low_support=0.0)
    thresholds = f1_thresholds(y_true, y_prob, params)
    # >= 0.21 .. 0.70 fires 3 frames (F1 0.8); >= 0.76 .. 0.80 fires 1 (F1 0.667): lowest best wins.
    assert thresholds["mouth"] == pytest.approx(0.21)
    assert thresholds["blood"] == params.off_threshold  # no positives: never fires


def _mouth_threshold(positives, negatives, n=None, **params):
    """The F1 threshold of mouth for frames at the given probabilities (padding negatives at 0)."""
    n = n or len(positives) + len(negatives)
    y_true = np.zeros((n, NUM_LABELS), np.uint8)
    y_prob = np.zeros((n, NUM_LABELS))
    y_true[: len(positives), 0] = 1
    y_prob[: len(positives) + len(negatives), 0] = list(positives) + list(negatives)
    return f1_thresholds(y_true, y_prob, section_params(ThresholdParams, "thresholds", **params))["mouth"]


def test_f1_is_two_tp_over_fired_plus_positives():
    # Positives 0.9 x 2 and 0.2 x 3, negatives 0.5 x 3. F1 = 2 TP / (fired + positives): up to 0.20
    # 10 / 13, the best (the grid's lowest, 0.10, on the tie); 0.21-0.50: 4 / 10; above: 4 / 7.
    assert _mouth_threshold([0.9, 0.9, 0.2, 0.2, 0.2], [0.5] * 3, low_support=0.0) == pytest.approx(0.10)
    assert _mouth_threshold([0.9, 0.9, 0.2], [0.5] * 3, low_support=0.0) == pytest.approx(0.51)  # 4 / 5 beats 6 / 9


def test_f1_fires_at_a_probability_equal_to_the_threshold_and_the_grid_holds_its_stop():
    # Positives exactly at 0.6, negatives at 0.59: only >= 0.6 separates them.
    assert _mouth_threshold([0.6, 0.6], [0.59, 0.59], low_support=0.0) == pytest.approx(0.6)
    # The same at grid_stop (0.95): the grid ends there, inclusive.
    assert _mouth_threshold([0.95, 0.95], [0.94, 0.94], low_support=0.0) == pytest.approx(0.95)


def test_f1_thresholds_refuse_arrays_that_do_not_pair_up():
    params = section_params(ThresholdParams, "thresholds")
    y = np.zeros((4, NUM_LABELS))
    for y_true, y_prob, shapes in ((y, y[:3], r"\(4, 17\) and \(3, 17\)"), (y[0], y[0], r"\(17,\) and \(17,\)"),
                                   (y[:, :3], y[:, :3], r"\(4, 3\) and \(4, 3\)")):
        with pytest.raises(ValueError, match=rf"f1_thresholds: expected two \(N, 17\) arrays, got {shapes}"):
            f1_thresholds(y_true, y_prob, params)


def test_f1_low_start_is_for_classes_strictly_under_low_support():
    # 10 positives in 1000 frames: support 0.01, exactly low_support: the usual grid (from 0.10).
    assert _mouth_threshold([0.06] * 10, [], n=1000, low_support=0.01) == pytest.approx(0.10)
    assert _mouth_threshold([0.06] * 9, [], n=1000, low_support=0.01) == pytest.approx(0.05)  # 0.009: from low_start


def test_f1_low_support_searches_from_low_start():
    y_true = np.zeros((1000, NUM_LABELS), np.uint8)
    y_prob = np.full((1000, NUM_LABELS), 0.01)
    y_true[:3, 8] = 1  # active bleeding: 0.3 % support
    y_prob[:3, 8] = 0.06
    y_true[:300, 4] = 1  # colon: 30 % support
    y_prob[:300, 4] = 0.06
    thresholds = f1_thresholds(y_true, y_prob, section_params(ThresholdParams, "thresholds"))
    assert thresholds["active bleeding"] == pytest.approx(0.05)  # reachable from low_start
    assert thresholds["colon"] == pytest.approx(0.10)  # grid starts at grid_start: nothing fires


def test_threshold_params_check_names_the_key():
    with pytest.raises(ParamsError, match="thresholds.off_threshold"):
        from_dict(ThresholdParams, {**repo_params()["thresholds"], "off_threshold": 0.9}, "thresholds")
    with pytest.raises(ParamsError, match="thresholds.median_windows"):
        from_dict(ThresholdParams, {**repo_params()["thresholds"], "median_windows": [2]}, "thresholds")
    with pytest.raises(ParamsError, match="thresholds.method"):
        from_dict(ThresholdParams, {**repo_params()["thresholds"], "method": "auc"}, "thresholds")
    with pytest.raises(ParamsError, match=r"thresholds.grid_start.*must be <= grid_stop \(0.3\)"):
        from_dict(ThresholdParams, {**repo_params()["thresholds"], "grid_start": 0.31, "grid_stop": 0.3}, "thresholds")
    one_point = from_dict(ThresholdParams, {**repo_params()["thresholds"], "grid_start": 0.3, "grid_stop": 0.3}, "thresholds")
    assert one_point.grid_start == one_point.grid_stop == 0.3  # a one-point grid is a grid


def _synthetic_validation(seed=0, n_videos=4, n=300):
    """Videos with a long colon stretch (easy) and a short polyp in half of them (noisy)."""
    rng = np.random.default_rng(seed)
    gt, rows = {"videos": []}, []
    for v in range(n_videos):
        truth = np.zeros((n, NUM_LABELS))
        truth[100:, LABELS.index("colon")] = 1
        if v % 2 == 0:
            truth[150:160, LABELS.index("polyp")] = 1
        probs = np.clip(truth * 0.5 + rng.random((n, NUM_LABELS)) * 0.5, 0, 1)
        table = pd.DataFrame(probs.astype(np.float32), columns=list(LABELS))
        table.insert(0, "t", np.arange(n))
        table.insert(0, "video_id", f"v{v}")
        rows.append(table)
        labels = pd.DataFrame(truth.astype(np.uint8), columns=list(LABELS))
        labels.insert(0, "t", np.arange(n))
        labels.insert(0, "video_id", f"v{v}")
        gt["videos"] += labels_to_submission(labels)["videos"]
    return pd.concat(rows, ignore_index=True), gt


def test_tune_on_map_never_scores_below_its_start():
    frame_probs, gt = _synthetic_validation()
    start_thresholds = {label: 0.3 for label in LABELS}
    start_params = section_params(EventParams, "events", presence="none")
    small = section_params(ThresholdParams, "thresholds",
        coarse_grid=[0.3, 0.6, 0.9, 1.01], rounds=1, median_windows=[1, 7], fill_gaps=[0, 5],
        min_lengths=[1, 5], presence_thresholds=[0.5], styles=["tuple"],
    )
    start = score(gt, probs_to_submission(frame_probs, start_thresholds, start_params))
    thresholds, params, report = tune_on_map(frame_probs, gt, start_thresholds, start_params, small)
    tuned = score(gt, probs_to_submission(frame_probs, thresholds, params))
    objective = (tuned["map@0.5"] + tuned["map@0.95"]) / 2
    assert report["start"] == pytest.approx((start["map@0.5"] + start["map@0.95"]) / 2)
    assert objective == pytest.approx(report["best"]) and objective >= report["start"]
    assert report["best"] > report["start"]  # noise everywhere at 0.3: switching labels off must help
    assert "z-line" in report["labels_off"]
    json.dumps(report)  # the report is JSON-ready


def test_tune_on_map_needs_its_per_label_and_refinement_phases():
    # Video v holds blood (0.65), a 10-frame polyp and a 2-frame ulcer; video w none of them,
    # but a blood burst at 0.61 and polyp spikes of 3 frames. Only a threshold between 0.61 and
    # 0.65 (refinement from its start, 0.6, + 0.04; the coarse grid has only ties) keeps blood out of w, and
    # only a polyp-only minimum length of 5 drops its spikes without dropping the 2-frame ulcer
    # (shared, the two trade one video each: no gain).
    n = 200
    tables, gt = [], {"videos": []}
    for video_id in ("v", "w"):
        probs = np.zeros((n, NUM_LABELS), np.float32)
        truth = np.zeros((n, NUM_LABELS), np.uint8)
        truth[:, LABELS.index("colon")] = 1  # every video is scored
        probs[:, LABELS.index("colon")] = 0.95
        blood, polyp, ulcer = LABELS.index("blood"), LABELS.index("polyp"), LABELS.index("ulcer")
        if video_id == "v":
            truth[20:30, blood] = truth[40:50, polyp] = truth[150:152, ulcer] = 1
            probs[20:30, blood], probs[40:50, polyp], probs[150:152, ulcer] = 0.65, 0.95, 0.95
        else:
            probs[60:70, blood] = 0.61
            probs[100:103, polyp] = probs[120:123, polyp] = 0.95
        table = pd.DataFrame(probs, columns=list(LABELS))
        table.insert(0, "t", np.arange(n))
        table.insert(0, "video_id", video_id)
        tables.append(table)
        labels = pd.DataFrame(truth, columns=list(LABELS))
        labels.insert(0, "t", np.arange(n))
        labels.insert(0, "video_id", video_id)
        gt["videos"] += labels_to_submission(labels)["videos"]
    start_params = section_params(EventParams, "events", style="per_label", median_window=1, fill_gap=0,
                                  min_length=1, presence="none", anatomy="none", per_label={})
    search = section_params(ThresholdParams, "thresholds", coarse_grid=[0.3, 0.6, 0.9, 1.01], rounds=1,
                            refine_step=0.04, styles=["per_label"], median_windows=[1], fill_gaps=[0],
                            min_lengths=[1, 5])
    thresholds, params, report = tune_on_map(pd.concat(tables, ignore_index=True), gt,
                                             {**{label: 0.3 for label in LABELS}, "blood": 0.6}, start_params, search)
    assert thresholds["blood"] == pytest.approx(0.64)
    assert params.for_label("polyp").min_length == 5 and params.for_label("ulcer").min_length == 1
    per_label = score(gt, probs_to_submission(pd.concat(tables, ignore_index=True), thresholds, params))["per_label@0.5"]
    assert per_label["blood"] == per_label["polyp"] == per_label["ulcer"] == 1.0


def _blood_validation(blood_v: float, blood_w: float):
    """Videos v and w with colon throughout (every video is scored); blood true in v (frames 20-29,
    at probability `blood_v`) and absent from w, which holds a false blood burst at `blood_w`."""
    n, colon, blood = 100, LABELS.index("colon"), LABELS.index("blood")
    tables, gt = [], {"videos": []}
    for video_id in ("v", "w"):
        probs = np.zeros((n, NUM_LABELS), np.float32)
        truth = np.zeros((n, NUM_LABELS), np.uint8)
        truth[:, colon], probs[:, colon] = 1, 0.95
        if video_id == "v":
            truth[20:30, blood], probs[20:30, blood] = 1, blood_v
        else:
            probs[60:70, blood] = blood_w
        rows = {"video_id": video_id, "t": np.arange(n)}
        tables.append(pd.DataFrame({**rows, **dict(zip(LABELS, probs.T))}))
        gt["videos"] += labels_to_submission(pd.DataFrame({**rows, **dict(zip(LABELS, truth.T))}))["videos"]
    start_params = section_params(EventParams, "events", style="per_label", median_window=1, fill_gap=0,
                                  min_length=1, presence="none", anatomy="none", per_label={})
    return pd.concat(tables, ignore_index=True), gt, start_params


def test_refinement_halves_its_step_each_round():
    # Blood must fire in v (0.63) and not in w (0.61): only a threshold in (0.61, 0.63] scores
    # both videos. From 0.6 the first round (step 0.04) tries 0.56 and 0.64 (no gain); only the
    # halved second step reaches 0.62. Doubled, the second round would try 0.52 and 0.68.
    frame_probs, gt, start_params = _blood_validation(blood_v=0.63, blood_w=0.61)
    search = section_params(ThresholdParams, "thresholds", coarse_grid=[0.3, 0.6, 0.9, 1.01], rounds=2,
                            refine_step=0.04, styles=["per_label"], median_windows=[1], fill_gaps=[0],
                            min_lengths=[1])
    start = {**{label: 0.3 for label in LABELS}, "blood": 0.6}
    thresholds, _, report = tune_on_map(frame_probs, gt, start, start_params, search)
    assert thresholds["blood"] == pytest.approx(0.62)
    assert [step["change"] for step in report["steps"]] == ["blood=0.62"]


def test_a_threshold_of_exactly_one_still_fires_and_is_refined():
    # A probability of 1.0 reaches a threshold of 1.0: only thresholds above 1 switch a label off
    # (report "labels_off"), so a label at 1.0 is refined like any firing label. Blood at 0.98 in
    # v: the refinement 1.0 - 0.04 = 0.96 catches it, the coarse grid (1.01 only) cannot.
    frame_probs, gt, start_params = _blood_validation(blood_v=0.98, blood_w=0.0)
    search = section_params(ThresholdParams, "thresholds", coarse_grid=[1.01], rounds=1, refine_step=0.04,
                            styles=["per_label"], median_windows=[1], fill_gaps=[0], min_lengths=[1])
    start = {**{label: 0.3 for label in LABELS}, "blood": 1.0}
    thresholds, _, report = tune_on_map(frame_probs, gt, start, start_params, search)
    assert thresholds["blood"] == pytest.approx(0.96)
    assert "blood" not in report["labels_off"]
