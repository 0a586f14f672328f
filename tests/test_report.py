"""Report stage: per-class table numbers, curve CSVs, timeline PNGs, report.md, offline template."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from vce.core.labels import LABELS, NUM_LABELS
from vce.core.params import ParamsError, from_dict
from vce.eval.frame_metrics import frame_metrics
from vce.eval.plots import (
    f1_at,
    label_slug,
    offline_template,
    plot_timeline,
    pr_curves,
    roc_curves,
    thin_indices,
    video_events,
)
from vce.eval.report import ReportParams, write_report
from vce.eval.score import score
from vce.post.events import labels_to_submission
from vce.post.timeline import labels_on_time

ROOT = Path(__file__).resolve().parents[1]

FRAMES_PER_VIDEO = 300


def _tiny_validation(seed: int = 0):
    """Two labelled videos (index units) with noisy probabilities; label 'polyp' never occurs."""
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


def _report_inputs(tmp_path, seed: int = 0):
    frames, y_true, y_prob = _tiny_validation(seed)
    gt = labels_to_submission(labels_on_time(frames))
    # A prediction: the ground truth of video 7 only, plus one false ulcer event in video 12.
    prediction = {"videos": [
        {"video_id": "7", "events": next(v["events"] for v in gt["videos"] if v["video_id"] == "7")},
        {"video_id": "12", "events": [{"start": 10, "end": 14, "label": ["ulcer"]}]},
    ]}
    thresholds = {label: 0.5 for label in LABELS}
    thresholds["polyp"] = 1.01
    frame_times = frames[["video_id"]].assign(t=frames["index"])
    return dict(y_true=y_true, y_prob=y_prob, frame_times=frame_times, thresholds=thresholds, gt=gt,
                prediction=prediction, params=ReportParams(curve_points=50, timeline_width=6.0, timeline_dpi=60),
                plots_dir=tmp_path / "plots", report_path=tmp_path / "metrics" / "report.md")


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("report")
    inputs = _report_inputs(tmp_path)
    result = write_report(**inputs)
    return inputs, result


def test_per_class_table_matches_frame_metrics_and_score(written):
    inputs, result = written
    table = pd.read_csv(inputs["plots_dir"] / "per_class.csv")
    assert list(table["label"]) == list(LABELS)
    expected = frame_metrics(inputs["y_true"], inputs["y_prob"])["per_label"]
    expected_score = score(inputs["gt"], inputs["prediction"])
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
        assert row["threshold"] == inputs["thresholds"][label]
        assert row["tap@0.5"] == pytest.approx(expected_score["per_label@0.5"][label], rel=1e-5)
        assert row["tap@0.95"] == pytest.approx(expected_score["per_label@0.95"][label], rel=1e-5)
    # F1 of ulcer at 0.5, counted by hand.
    k = LABELS.index("ulcer")
    fired = inputs["y_prob"][:, k] >= 0.5
    true_pos = int((fired & (inputs["y_true"][:, k] == 1)).sum())
    hand_f1 = 2 * true_pos / (fired.sum() + inputs["y_true"][:, k].sum())
    assert table.set_index("label").loc["ulcer", "f1"] == pytest.approx(hand_f1, rel=1e-5)
    # Video 7 predicted perfectly; video 12: every absent label 1, stomach/small intestine 0, false ulcer 0.
    assert result["per_video@0.5"]["7"] == pytest.approx(1.0)
    assert result["per_video@0.5"]["12"] == pytest.approx(14 / 17)


def test_curve_csvs_parse_and_are_thinned(written):
    inputs, _ = written
    plots = inputs["plots_dir"]
    pr_files = sorted(p.stem for p in (plots / "pr").glob("*.csv"))
    assert pr_files == sorted(label_slug(label) for label in ("stomach", "small intestine", "ulcer"))
    for name in ("pr", "roc"):
        for path in (plots / name).glob("*.csv"):
            curve = pd.read_csv(path)
            assert list(curve.columns) == (["recall", "precision"] if name == "pr" else ["fpr", "tpr"])
            assert 2 <= len(curve) <= inputs["params"].curve_points
            assert curve.notna().all().all() and ((curve >= 0) & (curve <= 1)).all().all()


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


def test_timeline_pngs_have_the_expected_size(written):
    inputs, _ = written
    params = inputs["params"]
    for video_id in ("7", "12"):
        path = inputs["plots_dir"] / "timelines" / f"{video_id}.png"
        with Image.open(path) as image:
            width, height = image.size
        assert width == round(params.timeline_width * params.timeline_dpi)
        assert height > width / 3  # 17 label rows
        assert path.stat().st_size < 200_000


def test_timeline_draws_ground_truth_and_prediction_colours(tmp_path):
    gt = {label: [] for label in LABELS}
    pred = {label: [] for label in LABELS}
    gt["mouth"] = [(0, 49)]
    pred["ulcer"] = [(50, 99)]
    path = tmp_path / "t.png"
    plot_timeline(path, gt, pred, (0, 99), "t", width=4, dpi=50)
    pixels = np.asarray(Image.open(path).convert("RGB")).reshape(-1, 3)
    assert (np.abs(pixels - [0x2B, 0x8A, 0x3E]).sum(axis=1) < 30).sum() > 20  # green ground truth
    assert (np.abs(pixels - [0xC9, 0x2A, 0x2A]).sum(axis=1) < 30).sum() > 20  # red prediction


def test_report_markdown_has_overall_numbers_and_a_row_per_video(written):
    inputs, result = written
    text = inputs["report_path"].read_text()
    assert f"| mAP@0.5 | {result['map@0.5']:.4f} |" in text
    assert f"| mAP@0.95 | {result['map@0.95']:.4f} |" in text
    for video_id in ("7", "12"):
        assert f"| {video_id} | {result['per_video@0.5'][video_id]:.4f} |" in text
        assert f"](../plots/timelines/{video_id}.png)" in text
    assert sum(line.startswith("| ulcer |") for line in text.splitlines()) == 1
    per_video = pd.read_csv(inputs["plots_dir"] / "per_video.csv", dtype={"video_id": str})
    assert list(per_video["video_id"]) == list(result["per_video@0.5"])
    assert per_video["map@0.95"].tolist() == pytest.approx(list(result["per_video@0.95"].values()))


def test_video_events_counts_each_label_of_an_event():
    sub = {"videos": [{"video_id": 3, "events": [{"start": 1, "end": 4, "label": ["blood", "ulcer"]}]}]}
    events = video_events(sub, "3")
    assert events["blood"] == [(1, 4)] and events["ulcer"] == [(1, 4)] and events["polyp"] == []


def test_params_are_checked_and_unknown_videos_named(tmp_path):
    with pytest.raises(ParamsError, match="report.curve_points"):
        from_dict(ReportParams, {"curve_points": 1}, "report")
    inputs = _report_inputs(tmp_path)
    inputs["params"] = ReportParams(videos=["99"])
    with pytest.raises(ValueError, match=r"report.videos: \['99'\]"):
        write_report(**inputs)


def test_stage_main_writes_everything(tmp_path):
    from stages import report as stage  # noqa: PLC0415

    frames, y_true, y_prob = _tiny_validation(seed=3)
    frames["split"] = "val"
    probs = frames[["video_id", "frame"]].copy()
    probs[list(LABELS)] = y_prob.astype(np.float32)
    probs["valid"] = True
    frames.to_parquet(tmp_path / "frames.parquet")
    probs.to_parquet(tmp_path / "val.parquet")
    gt = labels_to_submission(labels_on_time(frames))
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    (tmp_path / "events.json").write_text(json.dumps(gt))
    (tmp_path / "thresholds.json").write_text(json.dumps({"method": "f1", "thresholds": {k: 0.5 for k in LABELS}}))
    (tmp_path / "params.yaml").write_text("report:\n  curve_points: 20\n  timeline_dpi: 40\n  timeline_width: 5.0\n  videos: []\n")
    argv = ["--params", str(tmp_path / "params.yaml"), "--probs", str(tmp_path / "val.parquet"),
            "--frames", str(tmp_path / "frames.parquet"), "--thresholds", str(tmp_path / "thresholds.json"),
            "--events", str(tmp_path / "events.json"), "--gt", str(tmp_path / "gt.json"),
            "--plots-dir", str(tmp_path / "plots"), "--report", str(tmp_path / "report.md")]
    assert stage.main(argv) == 0
    assert "| mAP@0.5 | 1.0000 |" in (tmp_path / "report.md").read_text()
    assert (tmp_path / "plots" / "timelines" / "12.png").is_file()


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
