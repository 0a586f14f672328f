"""The validation report: `metrics/report.md` and the plot files it shows.

Layout as the RARE-VISION challenge asks participants to report: overall temporal mAP at tIoU
0.5 and 0.95, then the per-video breakdown; then the per-class table and one event timeline
per validation video. `write_report` does the whole job from in-memory inputs, so the stage
stays thin and tests run on tiny generated data.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from vce.core.errors import DataError, ParamsError
from vce.core.io import atomic_path, safe_file_name, write_text
from vce.core.labels import LABELS
from vce.core.params import require
from vce.eval.frame_metrics import frame_metrics
from vce.eval.plots import (
    label_slug,
    per_class_table,
    plot_timeline,
    pr_curves,
    roc_curves,
    video_events,
)
from vce.eval.score import score


@dataclass
class ReportParams:
    curve_points: int = 200  # at most this many points per label in each PR / ROC CSV
    timeline_dpi: int = 100  # timeline PNG resolution
    timeline_width: float = 12.0  # timeline PNG width in inches (height follows the 17 rows)
    videos: list = field(default_factory=list)  # validation video ids to draw timelines for; [] = all

    def check(self, section: str = "report") -> None:
        require(self.curve_points >= 2, f"{section}.curve_points", f"must be >= 2, got {self.curve_points}")
        require(30 <= self.timeline_dpi <= 600, f"{section}.timeline_dpi", f"must be in [30, 600], got {self.timeline_dpi}")
        require(2.0 <= self.timeline_width <= 60.0, f"{section}.timeline_width",
                f"must be in [2, 60] inches, got {self.timeline_width}")
        require(all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in self.videos),
                f"{section}.videos", "must be a list of video ids")


# ----------------------------------------------------------------------------- markdown


def _number(value, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    return f"{value:.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _event_count(submission: dict, video_id) -> int:
    return sum(len(v["events"]) for v in submission["videos"] if str(v["video_id"]) == str(video_id))


def render_markdown(score_result: dict, table: pd.DataFrame, gt: dict, prediction: dict,
                    frame_result: dict, timelines: dict[str, str]) -> str:
    """The report text; `timelines` maps video id -> image link relative to the report."""
    per_video = [
        [str(video_id), _number(score_result["per_video@0.5"][video_id]), _number(score_result["per_video@0.95"][video_id]),
         str(_event_count(gt, video_id)), str(_event_count(prediction, video_id)),
         f"[timeline]({timelines[str(video_id)]})" if str(video_id) in timelines else "–"]
        for video_id in score_result["per_video@0.5"]
    ]
    per_class = [
        [row["label"], _number(row["support"]), _number(row["ap"]), _number(row["auc"]), _number(row["threshold"], 2),
         _number(row["f1"]), _number(row["tap@0.5"]), _number(row["tap@0.95"])]
        for row in table.to_dict("records")
    ]
    parts = [
        "# Validation report",
        "",
        "Official RARE-VISION temporal mAP of the validation events (`data/events/val.json`) against the "
        "validation ground truth (`data/score/val_gt.json`).",
        "",
        "## Overall",
        "",
        _table(["metric", "value"], [
            ["mAP@0.5", _number(score_result["map@0.5"])],
            ["mAP@0.95", _number(score_result["map@0.95"])],
            ["videos", str(len(per_video))],
            ["frame mAP (mean per-class AP)", _number(frame_result["map"])],
            ["frame mean ROC AUC", _number(frame_result["mean_auc"])],
        ]),
        "",
        "## Per video",
        "",
        _table(["video", "mAP@0.5", "mAP@0.95", "GT events", "predicted events", "timeline"], per_video),
        "",
        "## Per class",
        "",
        "Support: positive validation frames. AP, AUC, F1: frame level (F1 with the chosen threshold). "
        "tAP: temporal AP averaged over the validation videos (a label absent from a video and never "
        "predicted there scores 1).",
        "",
        _table(["label", "support", "AP", "AUC", "threshold", "F1", "tAP@0.5", "tAP@0.95"], per_class),
        "",
        "## Event timelines",
        "",
        "One row per label; ground truth (green, upper bar) above prediction (red, lower bar).",
        "",
    ]
    for video_id, link in timelines.items():
        parts += [f"### Video {video_id}", "", f"![event timeline of video {video_id}]({link})", ""]
    return "\n".join(parts)


# ----------------------------------------------------------------------------- the whole report


def _write_csv(path: Path, frame: pd.DataFrame) -> None:
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False, float_format="%.6g")


def per_video_table(score_result: dict) -> pd.DataFrame:
    """One row per scored video: video_id, map@0.5, map@0.95 (the challenge's per-video breakdown)."""
    return pd.DataFrame({
        "video_id": [str(v) for v in score_result["per_video@0.5"]],
        "map@0.5": list(score_result["per_video@0.5"].values()),
        "map@0.95": list(score_result["per_video@0.95"].values()),
    })


def _time_ranges(frame_times: pd.DataFrame) -> dict[str, tuple[int, int]]:
    """video id -> (first, last) event time of its frames."""
    spans = frame_times.groupby("video_id", sort=False)["t"].agg(["min", "max"])
    return {str(video_id): (int(row["min"]), int(row["max"])) for video_id, row in spans.iterrows()}


def write_report(
    *,
    y_true: np.ndarray,
    y_prob: np.ndarray,
    frame_times: pd.DataFrame,
    thresholds: dict,
    gt: dict,
    prediction: dict,
    params: ReportParams,
    plots_dir,
    report_path,
) -> dict:
    """Write the curves, the per-class table, the timelines and the report; return the scores.

    y_true, y_prob: (N, 17) labels and probabilities of the valid validation frames;
    frame_times: video_id and event time `t` of the validation frames (timeline extents).
    Writes under `plots_dir`: pr/<label>.csv, roc/<label>.csv, per_class.csv, per_video.csv,
    timelines/<video_id>.png; and `report_path` (markdown).
    """
    plots_dir, report_path = Path(plots_dir), Path(report_path)
    # 1. Frame-level curves and metrics, temporal scores.
    for name, curves in (("pr", pr_curves(y_true, y_prob, params.curve_points)),
                         ("roc", roc_curves(y_true, y_prob, params.curve_points))):
        for label, curve in curves.items():
            _write_csv(plots_dir / name / f"{label_slug(label)}.csv", curve)
    frame_result = frame_metrics(y_true, y_prob)
    score_result = score(gt, prediction)
    missing = [label for label in LABELS if label not in thresholds]
    if missing:
        raise DataError(f"thresholds lack label(s) {missing}")
    table = per_class_table(y_true, y_prob, thresholds, frame_result, score_result)
    _write_csv(plots_dir / "per_class.csv", table)
    _write_csv(plots_dir / "per_video.csv", per_video_table(score_result))
    # 2. One timeline per chosen validation video.
    ranges = _time_ranges(frame_times)
    chosen = [str(v) for v in params.videos] or [str(v) for v in score_result["per_video@0.5"]]
    unknown = [v for v in chosen if v not in ranges]
    if unknown:
        raise ParamsError(f"report.videos: {unknown} are not validation videos; they are {sorted(ranges)}")
    timelines = {}
    for video_id in chosen:
        path = plots_dir / "timelines" / f"{safe_file_name(video_id)}.png"
        map_05 = {str(v): m for v, m in score_result["per_video@0.5"].items()}.get(video_id)
        map_095 = {str(v): m for v, m in score_result["per_video@0.95"].items()}.get(video_id)
        title = f"video {video_id}: mAP@0.5 = {_number(map_05)}, mAP@0.95 = {_number(map_095)}"
        plot_timeline(path, video_events(gt, video_id), video_events(prediction, video_id), ranges[video_id],
                      title, width=params.timeline_width, dpi=params.timeline_dpi)
        timelines[video_id] = Path(os.path.relpath(path, report_path.parent)).as_posix()
    # 3. The markdown report.
    write_text(report_path, render_markdown(score_result, table, gt, prediction, frame_result, timelines))
    return score_result
