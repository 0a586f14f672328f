"""Report stage: tables, curve CSVs, the empty floor, timelines that match the scorer, report.md."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import section_params
from PIL import Image
from viewer_check import check_viewer

from vce.core.labels import LABELS, NUM_LABELS
from vce.core.params import ParamsError, from_dict
from vce.eval.explain import explain_labels
from vce.eval.frame_metrics import frame_metrics
from vce.eval.plots import curve_table, f1_at, offline_template, pr_curves, roc_curves, thin_indices
from vce.eval.report import ReportParams, ScoredSet, empty_submission, write_report
from vce.eval.score import score
from vce.eval.score_reference import shifted_submission
from vce.eval.timelines import fragment_boundaries, greedy_hits, merged_runs, plot_timeline, row_matches
from vce.post.events import labels_to_submission
from vce.post.timeline import labels_on_time

ROOT = Path(__file__).resolve().parents[1]

FRAMES_PER_VIDEO = 300
TINY = dict(curve_points=50, timeline_width=8.0, timeline_dpi=60, videos=[])


def _tiny_validation(seed: int = 0):
    """Two labelled videos (index units): stomach 0-99, small intestine 100-299 with an 8-frame
    ulcer inside it (so small intestine is 3 ground-truth fragments); 'polyp' never occurs."""
    rng = np.random.default_rng(seed)
    rows = []
    for video_id in ("7", "12"):
        labels = np.zeros((FRAMES_PER_VIDEO, NUM_LABELS), dtype=np.uint8)
        labels[:100, LABELS.index("stomach")] = 1
        labels[100:, LABELS.index("small intestine")] = 1
        start = int(rng.integers(120, 250))
        labels[start:start + 8, LABELS.index("ulcer")] = 1
        frame = pd.DataFrame(labels, columns=list(LABELS))
        frame.insert(0, "video_id", video_id)
        frame.insert(1, "index", np.arange(FRAMES_PER_VIDEO))
        rows.append(frame)
    frames = pd.concat(rows, ignore_index=True)
    frames["frame"] = frames["index"] * 5
    frames["event_unit"] = "index"
    y_true = frames[list(LABELS)].to_numpy()
    y_prob = np.clip(0.6 * y_true + rng.normal(0.2, 0.2, y_true.shape), 0, 1)
    return frames, y_true, y_prob


def _prediction(gt: dict) -> dict:
    """Video 7: its ground truth with the stomach event (0-99) cut to 0-89 (tIoU 0.9: a hit at
    0.5, a miss at 0.95); video 12: one false ulcer event."""
    events = copy.deepcopy(next(v["events"] for v in gt["videos"] if v["video_id"] == "7"))
    stomach = next(e for e in events if e["label"] == ["stomach"])
    assert (stomach["start"], stomach["end"]) == (0, 99)
    stomach["end"] = 89
    return {"videos": [{"video_id": "7", "events": events},
                       {"video_id": "12", "events": [{"start": 10, "end": 14, "label": ["ulcer"]}]}]}


def _probs_table(frames: pd.DataFrame, y_prob: np.ndarray) -> pd.DataFrame:
    table = frames[["video_id"]].assign(t=frames["index"])
    table[list(LABELS)] = y_prob
    return table


def _report_inputs(tmp_path, seed: int = 0):
    frames, y_true, y_prob = _tiny_validation(seed)
    gt = labels_to_submission(labels_on_time(frames))
    thresholds = {label: 0.5 for label in LABELS}
    thresholds["polyp"] = 1.01
    saved = {"method": "map", "probs": "temporal", "thresholds": thresholds,
             "events": {"style": "tuple", "median_window": 7, "presence_threshold": 0.7,
                        "per_label": {"blood": {"presence_threshold": 0.0}}}}
    validation = ScoredSet("validation", gt, _prediction(gt), _probs_table(frames, y_prob), {"7": "index", "12": "index"})
    explained = explain_labels(saved, validation.probs, validation.prediction, None, 2, 0.158, saved["events"])
    return dict(y_true=y_true, y_prob=y_prob, sets=[validation], saved_thresholds=saved, probs_source="temporal",
                route=None, explained=explained,
                configured_events={"style": "tuple", "median_window": 7, "presence_threshold": 0.9},
                params=section_params(ReportParams, "report", **TINY), plots_dir=tmp_path / "plots", report_path=tmp_path / "metrics" / "report.md")


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("report")
    inputs = _report_inputs(tmp_path)
    results = write_report(**inputs)
    return inputs, results[0], inputs["report_path"].read_text()


def _markdown_rows(text: str, first_cell: str) -> list[list[str]]:
    """The cells of every markdown table row whose first cell is `first_cell`."""
    lines = [line.strip() for line in text.splitlines()]  # event-knob rows are indented under a bullet
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines if line.startswith(f"| {first_cell} |")]


# ----------------------------------------------------------------------------- tables and numbers


def test_per_class_table_matches_frame_metrics_and_score(written):
    inputs, result, _ = written
    table = pd.read_csv(inputs["plots_dir"] / "per_class.csv")
    assert list(table["label"]) == list(LABELS)
    expected = frame_metrics(inputs["y_true"], inputs["y_prob"])["per_label"]
    scored = inputs["sets"][0]
    expected_score = score(scored.gt, scored.prediction)
    for row in table.to_dict("records"):
        label = row["label"]
        assert row["support"] == expected[label]["support"]
        if expected[label]["ap"] is None:
            assert np.isnan(row["ap"]) and np.isnan(row["auc"])
            # No positives: F1 is 0 once a frame fires, undefined (0/0) when the label is off.
            assert np.isnan(row["f1"]) if label == "polyp" else row["f1"] == 0.0
        else:
            assert row["ap"] == pytest.approx(expected[label]["ap"], rel=1e-5)
            assert row["auc"] == pytest.approx(expected[label]["auc"], rel=1e-5)
        assert row["threshold"] == inputs["saved_thresholds"]["thresholds"][label]
        assert row["tap@0.5"] == pytest.approx(expected_score["per_label@0.5"][label], rel=1e-5)
        assert row["tap@0.95"] == pytest.approx(expected_score["per_label@0.95"][label], rel=1e-5)
    # F1 of ulcer at 0.5, counted by hand.
    k = LABELS.index("ulcer")
    fired = inputs["y_prob"][:, k] >= 0.5
    true_pos = int((fired & (inputs["y_true"][:, k] == 1)).sum())
    hand_f1 = 2 * true_pos / (fired.sum() + inputs["y_true"][:, k].sum())
    assert table.set_index("label").loc["ulcer", "f1"] == pytest.approx(hand_f1, rel=1e-5)
    # Fragments: small intestine is 1 run but 3 ground-truth events per video (the ulcer cuts it).
    by_label = table.set_index("label")
    assert (by_label.loc["small intestine", "gt_runs"], by_label.loc["small intestine", "gt_events"]) == (2, 6)
    assert (by_label.loc["stomach", "gt_runs"], by_label.loc["stomach", "gt_events"]) == (2, 2)
    assert by_label.loc["ulcer", "pred_events"] == 2  # video 7's true one and video 12's false one


def test_per_video_columns_are_the_right_tiou_and_the_empty_floor(written):
    inputs, result, text = written
    # Video 7: stomach hits at tIoU 0.5 but not at 0.95, so the two columns differ.
    assert result.score["per_video@0.5"]["7"] == pytest.approx(1.0)
    assert result.score["per_video@0.95"]["7"] == pytest.approx(16 / 17)
    assert result.score["per_video@0.5"]["12"] == pytest.approx(14 / 17)
    header = next(line for line in text.splitlines() if line.startswith("| set | video |"))
    assert [c.strip() for c in header.strip("|").split("|")][:5] == ["set", "video", "mAP@0.5", "mAP@0.95",
                                                                    "empty submission"]
    rows = {row[1]: row for row in _markdown_rows(text, "validation")}
    assert rows["7"][2:5] == ["1.0000", f"{16 / 17:.4f}", f"{14 / 17:.4f}"]
    assert rows["12"][2:5] == [f"{14 / 17:.4f}", f"{14 / 17:.4f}", f"{14 / 17:.4f}"]
    # The empty floor: 3 of 17 labels occur in each video, so an empty file scores 14/17 at both tIoUs.
    empty = score(inputs["sets"][0].gt, empty_submission(inputs["sets"][0].gt))
    assert result.empty == empty and empty["map@0.5"] == empty["map@0.95"] == pytest.approx(14 / 17)
    overall = _markdown_rows(text, "validation (tuned on it: optimistic)")
    assert overall == [["validation (tuned on it: optimistic)", "2", f"{result.score['map@0.5']:.4f}",
                        f"{result.score['map@0.95']:.4f}", f"{14 / 17:.4f}", "8", "5"]]  # 4 GT events a video; 4 + 1 predicted
    per_video = pd.read_csv(inputs["plots_dir"] / "per_video.csv", dtype={"video_id": str})
    assert per_video.set_index("video_id").loc["7", "map@0.95"] == pytest.approx(16 / 17)
    assert per_video["empty"].tolist() == pytest.approx([14 / 17, 14 / 17])
    bars = pd.read_csv(inputs["plots_dir"] / "per_video_bars.csv")
    assert bars.set_index(["category", "series"]).loc[("validation 7", "mAP@0.95"), "value"] == pytest.approx(16 / 17)


def test_report_says_how_the_events_were_made_and_why_fragments_score_zero(written):
    inputs, result, text = written
    assert "**Probabilities**: `temporal`" in text and "Mismatch" not in text
    assert "Off here: polyp." in text and "| polyp |" in text and "off (1.01)" in text
    knobs = {row[0]: row for row in _markdown_rows(text, "`presence_threshold`")}
    assert knobs["`presence_threshold`"][1:] == ["0.7", "0.9", "tuned"]
    assert _markdown_rows(text, "`median_window`")[0][1:] == ["7", "7", ""]
    assert "per-label override, blood: `presence_threshold` = 0.0" in text
    # Stomach ranks frames well, but its one predicted event is too short for tIoU 0.95.
    assert ("- **stomach**: frame AP 0.975, tAP@0.95 0.000: 2 run(s) are 2 ground-truth events; 1 predicted "
            "event(s) match 1 of them at tIoU 0.5 and 0 at 0.95.") in text
    write_report(**{**_report_inputs(Path(inputs["plots_dir"]).parent / "m"), "probs_source": "frame"})
    assert "**Mismatch**: the thresholds were tuned on `temporal`" in (
        Path(inputs["plots_dir"]).parent / "m" / "metrics" / "report.md").read_text()


def test_curve_tables_have_baselines_and_threshold_points(written):
    inputs, _, _ = written
    pr = pd.read_csv(inputs["plots_dir"] / "pr.csv")
    assert set(pr["label"]) == {"stomach", "small intestine", "ulcer"}
    assert set(pr["kind"]) == {"curve", "chance", "threshold"}
    k = LABELS.index("ulcer")
    truth, probs = inputs["y_true"][:, k], inputs["y_prob"][:, k]
    ulcer = pr[pr["label"] == "ulcer"]
    chance = ulcer[ulcer["kind"] == "chance"]
    assert chance["precision"].tolist() == pytest.approx([truth.mean()] * 2, rel=1e-5)
    point = ulcer[ulcer["kind"] == "threshold"].iloc[0]
    fired = probs >= 0.5
    assert point["recall"] == pytest.approx((fired & (truth == 1)).sum() / truth.sum(), rel=1e-5)
    assert point["precision"] == pytest.approx((fired & (truth == 1)).sum() / fired.sum(), rel=1e-5)
    ap = frame_metrics(inputs["y_true"], inputs["y_prob"])["per_label"]["ulcer"]["ap"]
    assert ulcer["summary"].iloc[0].startswith(f"AP {ap:.3f}, chance {truth.mean():.3f}")
    assert ((pr[["recall", "precision"]] >= 0) & (pr[["recall", "precision"]] <= 1)).all().all()
    assert (pr.groupby("label")["kind"].apply(lambda kinds: (kinds == "curve").sum()) <= 50).all()
    roc = pd.read_csv(inputs["plots_dir"] / "roc.csv")
    diagonal = roc[(roc["label"] == "ulcer") & (roc["kind"] == "chance")]
    assert diagonal[["fpr", "tpr"]].to_numpy().tolist() == [[0, 0], [1, 1]]
    # An off label has no threshold point.
    thresholds = {label: 1.01 for label in LABELS}
    assert "threshold" not in set(curve_table("pr", inputs["y_true"], inputs["y_prob"], thresholds)["kind"])
    temporal = pd.read_csv(inputs["plots_dir"] / "temporal_ap.csv")
    assert set(temporal["series"]) == {"tAP@0.5", "tAP@0.95"} and len(temporal) == 2 * NUM_LABELS
    assert "ulcer (16 frames)" in set(temporal["category"])


def test_thin_indices_keep_the_ends():
    assert list(thin_indices(5, 10)) == [0, 1, 2, 3, 4]
    kept = thin_indices(1000, 7)
    assert kept[0] == 0 and kept[-1] == 999 and len(kept) == 7


def test_curves_skip_undefined_labels():
    y_true = np.zeros((20, NUM_LABELS), dtype=int)
    y_true[:5, 0] = 1
    y_true[:, 1] = 1  # every frame positive: PR defined, ROC not
    y_prob = np.random.default_rng(1).random((20, NUM_LABELS))
    assert set(pr_curves(y_true, y_prob)) == {LABELS[0], LABELS[1]}
    assert set(roc_curves(y_true, y_prob)) == {LABELS[0]}
    assert f1_at(np.zeros(4), np.zeros(4), 0.5) is None


# ----------------------------------------------------------------------------- matching and timelines


def test_greedy_hits_follow_file_order_and_the_tiou():
    gt = [(0, 99), (100, 199)]
    # tIoU of (0, 89) with (0, 99) is 0.9: a hit at 0.5, a miss at 0.95. The second (0, 99) finds
    # its segment taken. (100, 199) is exact.
    pred = [(0, 89), (0, 99), (100, 199)]
    assert greedy_hits(gt, pred, 0.5) == [1, 0, 1]
    assert greedy_hits(gt, pred, 0.95) == [0, 1, 1]
    assert greedy_hits([], pred, 0.5) == [0, 0, 0]


def test_row_matches_reproduce_the_scorer(written):
    """The TP/FP the timelines draw are the scorer's: each row's AP, averaged, gives score()'s mAP."""
    inputs, _, _ = written
    gt = inputs["sets"][0].gt
    for seed in range(3):
        prediction = shifted_submission(gt, seed, shuffle=True)
        prediction["videos"][0]["events"] += prediction["videos"][0]["events"][:3]  # duplicates: contested GT
        expected = score(gt, prediction)
        for video_id in ("7", "12"):
            rows = row_matches(gt, prediction, video_id)
            for threshold in (0.5, 0.95):
                mean_ap = sum(row.ap[threshold] for row in rows) / NUM_LABELS
                assert mean_ap == pytest.approx(expected[f"per_video@{threshold}"][video_id], abs=1e-12)


def test_fragment_boundaries_and_runs():
    assert fragment_boundaries([(0, 9), (10, 19), (25, 30), (31, 31)]) == [10, 31]
    assert fragment_boundaries([(10, 19), (0, 9)]) == [10]  # file order does not matter
    assert merged_runs([(0, 9), (10, 19), (25, 30), (31, 31)]) == 2
    assert merged_runs([]) == 0


def test_timeline_draws_fragment_boundaries_and_the_matching_counts(written, tmp_path):
    inputs, result, _ = written
    scored = inputs["sets"][0]
    rows = result.rows["7"]
    frames = scored.probs[scored.probs["video_id"] == "7"]
    drawn = plot_timeline(tmp_path / "7.png", rows, frames["t"].to_numpy(), frames[list(LABELS)].to_numpy(),
                          inputs["saved_thresholds"]["thresholds"], (0, FRAMES_PER_VIDEO - 1), "index", "t",
                          width=8, dpi=60)
    # Small intestine 100-299 with the ulcer inside: 3 touching fragments, 2 boundaries; nothing else touches.
    assert drawn["boundaries"] == 2
    assert drawn["gt_fragments"] == 5  # stomach 1, small intestine 3, ulcer 1
    # Every predicted event of video 7 hits at 0.5; the shortened stomach misses at 0.95.
    n_pred = sum(len(row.pred) for row in rows)
    assert (drawn["tp@0.5"], drawn["fp@0.5"]) == (n_pred, 0)
    assert (drawn["tp@0.95"], drawn["fp@0.95"]) == (n_pred - 1, 1)
    stomach = next(row for row in rows if row.label == "stomach")
    assert stomach.hits == {0.5: [1], 0.95: [0]} and stomach.ap == {0.5: 1.0, 0.95: 0.0}
    # The colours are in the picture: ground truth green, TP blue, FP orange.
    pixels = np.asarray(Image.open(tmp_path / "7.png").convert("RGB")).reshape(-1, 3).astype(int)
    for colour in ([0x2B, 0x8A, 0x3E], [0x19, 0x71, 0xC2], [0xF0, 0x8C, 0x00]):
        assert (np.abs(pixels - colour).sum(axis=1) < 30).sum() > 10, colour


def test_timeline_draws_true_positives_over_the_false_candidates_on_them(tmp_path):
    """Test video 00051's mouth row read 1.00 / 1.00 but showed only orange: later FP candidates
    over the same span (a metric-optimal submission's) were drawn over the TP, in file order."""
    gt = {"videos": [{"video_id": "v", "events": [{"start": 0, "end": 49, "label": ["mouth"]},
                                                  {"start": 50, "end": 299, "label": ["stomach"]}]}]}
    candidates = [{"start": 0, "end": 49, "label": ["mouth"]}] + [
        {"start": 0, "end": 49 + k, "label": ["mouth"]} for k in range(1, 6)]
    rows = row_matches(gt, {"videos": [{"video_id": "v", "events": candidates}]}, "v")
    assert rows[0].hits[0.5] == [1, 0, 0, 0, 0, 0] and rows[0].ap[0.5] == 1.0
    probs = np.zeros((300, NUM_LABELS))
    plot_timeline(tmp_path / "t.png", rows, np.arange(300), probs, {label: 0.5 for label in LABELS}, (0, 299),
                  "index", "t", width=8, dpi=60)
    pixels = np.asarray(Image.open(tmp_path / "t.png").convert("RGB")).reshape(-1, 3).astype(int)
    blue, orange = ((np.abs(pixels - colour).sum(axis=1) < 30).sum() for colour in ([0x19, 0x71, 0xC2], [0xF0, 0x8C, 0x00]))
    assert blue > 2 * orange  # the TP covers 50 of the row's 55 predicted frames, on top (in file order: 46 blue, 291 orange)


def test_timeline_pngs_are_written_per_set_and_video(written):
    inputs, _, text = written
    params = inputs["params"]
    for video_id in ("7", "12"):
        path = inputs["plots_dir"] / "timelines" / f"validation_{video_id}.png"
        with Image.open(path) as image:
            width, height = image.size
        assert width == round(params.timeline_width * params.timeline_dpi)
        assert height > width / 2  # 17 label rows
        assert path.stat().st_size < 200_000
        assert f"](../plots/timelines/validation_{video_id}.png)" in text


def test_params_are_checked_and_unknown_videos_named(tmp_path):
    with pytest.raises(ParamsError, match="report.curve_points"):
        from_dict(ReportParams, {**TINY, "curve_points": 1}, "report")
    inputs = _report_inputs(tmp_path)
    inputs["params"] = section_params(ReportParams, "report", **{**TINY, "videos": ["99"]})
    with pytest.raises(ParamsError, match=r"report.videos: \['99'\]"):
        write_report(**inputs)


def test_stage_main_writes_validation_and_test(tmp_path):
    from stages import report as stage  # noqa: PLC0415

    frames, y_true, y_prob = _tiny_validation(seed=3)
    frames["split"] = "val"
    frames["path"] = [f"{video_id}/frame_{frame}.png" for video_id, frame in zip(frames["video_id"], frames["frame"])]
    for path in frames["path"]:  # the viewer's thumbnails read the frame files
        (tmp_path / "root" / path).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8, 8), (120, 40, 30)).save(tmp_path / "root" / path)
    probs = frames[["video_id", "frame"]].copy()
    probs[list(LABELS)] = y_prob.astype(np.float32)
    probs["valid"] = True
    frames.to_parquet(tmp_path / "frames.parquet")
    probs.to_parquet(tmp_path / "val.parquet")
    gt = labels_to_submission(labels_on_time(frames))
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    (tmp_path / "events.json").write_text(json.dumps(gt))
    # The test set: video 12 again, in file-frame units, predicted with nothing.
    test_index = frames[frames["video_id"] == "12"][["video_id", "frame", "index", "path"]].assign(event_unit="frame")
    test_index.to_parquet(tmp_path / "test_index.parquet")
    probs[probs["video_id"] == "12"].to_parquet(tmp_path / "test.parquet")
    test_gt = labels_to_submission(labels_on_time(frames[frames["video_id"] == "12"].assign(event_unit="frame")))
    (tmp_path / "test_gt.json").write_text(json.dumps(test_gt))
    (tmp_path / "submission.json").write_text(json.dumps(empty_submission(test_gt)))
    # The engine decides three labels (two switched off, one region gated off), the thresholds the rest.
    engine = {"policies": {"polyp": {"kind": "off", "tuning_ap": 1.0},
                           "z-line": {"kind": "off", "tuning_ap": 0.5, "shadow": {"detector": "threshold", "threshold": 0.4,
                                                                                  "median_window": 1, "min_length": 1}},
                           "colon": {"kind": "off", "tuning_ap": 1.0}}}
    (tmp_path / "thresholds.json").write_text(json.dumps({"method": "engine", "thresholds": {k: 0.5 for k in LABELS},
                                                          "engine": engine}))
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["report"] = {**params["report"], **TINY, "timeline_dpi": 40}
    params["data"].update(root=str(tmp_path / "root"), test_root=str(tmp_path / "root"))
    params["score"]["test_gt"] = str(tmp_path / "test_gt.json")
    params["post"]["probs"] = "frame"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    argv = ["--params", str(tmp_path / "params.yaml"), "--probs", str(tmp_path / "val.parquet"),
            "--frames", str(tmp_path / "frames.parquet"), "--thresholds", str(tmp_path / "thresholds.json"),
            "--events", str(tmp_path / "events.json"), "--gt", str(tmp_path / "gt.json"),
            "--test-probs", str(tmp_path / "test.parquet"), "--test-index", str(tmp_path / "test_index.parquet"),
            "--test-events", str(tmp_path / "submission.json"),
            "--plots-dir", str(tmp_path / "plots"), "--report", str(tmp_path / "report.md"),
            "--clinical-events", str(tmp_path / "events.json"), "--test-clinical-events", str(tmp_path / "submission.json"),
            "--viewer-dir", str(tmp_path / "viewer"), "--held-out", "", "--route", str(tmp_path / "no_route.json")]
    assert stage.main(argv) == 0
    text = (tmp_path / "report.md").read_text()
    assert _markdown_rows(text, "validation (tuned on it: optimistic)")[0][2:5] == ["1.0000", "1.0000", f"{14 / 17:.4f}"]
    # The empty test submission scores exactly the floor, and the report says the floor is not beaten.
    assert _markdown_rows(text, "test (held out)")[0][1:5] == ["1", f"{14 / 17:.4f}", f"{14 / 17:.4f}", f"{14 / 17:.4f}"]
    assert (tmp_path / "plots" / "timelines" / "validation_12.png").is_file()
    assert (tmp_path / "plots" / "timelines" / "test_12.png").is_file()
    assert "### Test video 12" in text
    _same_silence_in_report_and_viewer(text, (tmp_path / "viewer" / "index.html").read_text())
    counts = check_viewer(tmp_path / "viewer", {"validation": (gt, gt), "test": (empty_submission(test_gt),) * 2})
    assert counts["events"] == sum(len(e["label"]) for v in gt["videos"] for e in v["events"]) and counts["thumbnails"]


def _same_silence_in_report_and_viewer(report: str, index: str) -> None:
    """Issue 52: report.md and the viewer gave a silent label different stories (a threshold of
    0.51 in one, `engine: off` in the other). Every label the viewer's validation table calls
    silent has the same route, decision and reason in report.md, and no other label is silent there."""
    import html
    import re

    section = index[index.index('id="set-validation"'):]
    section = section[:section.index("<h2", 10)] if "<h2" in section[10:] else section
    viewer = {}
    for row in re.findall(r"<tr>(.*?)</tr>", section):
        cells = [html.unescape(re.sub(r"<[^>]+>", "", c)) for c in re.findall(r"<td>(.*?)</td>", row)]
        if len(cells) == 11 and cells[-1]:
            viewer[cells[0]] = cells[1:3] + [cells[-1]]
    assert viewer, "no silent label in the viewer"
    for label, (route, decision, reason) in viewer.items():
        assert f"- **{label}** (route {route}; {decision}): {reason}." in report, label
    listed = report[report.index("**Silent labels**"):].split("\n\n")[1]
    assert len(listed.splitlines()) == len(viewer)


def test_offline_template_inlines_the_scripts_and_keeps_the_placeholder(tmp_path):
    js = tmp_path / "js"
    js.mkdir()
    for name in ("vega5.js", "vega-lite5.js", "vega-embed6.js"):
        (js / name).write_text(f"var {name.split('.')[0].replace('-', '_')} = '</script>';")
    page = offline_template(js)
    assert "{plot_divs}" in page and "{scripts}" not in page and "https:" not in page
    assert page.index("vega5.js") < page.index("vega-lite5.js") < page.index("vega-embed6.js")
    assert "'<\\/script>'" in page
    with pytest.raises(FileNotFoundError, match="vega-embed6.js"):
        (js / "vega-embed6.js").unlink()
        offline_template(js)
