"""The report: `metrics/report.md` and the plot files it shows, written to explain the score.

Layout as the RARE-VISION challenge asks participants to report (overall temporal mAP at tIoU
0.5 and 0.95, then per video), with what a reader needs to trust or question the numbers:
the held-out test score and the empty-submission floor beside validation; which probabilities
and which tuned knobs made the events; the per-class table with ground-truth fragment counts
(why a label can rank frames perfectly and still score tAP@0.95 0); and one timeline per video
that draws what the metric matches (`vce.eval.timelines`). `write_report` does the whole job
from in-memory inputs, so the stage stays thin and tests run on tiny generated data.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
from pydantic import Field

from vce.core.errors import DataError, ParamsError
from vce.core.io import atomic_path, safe_file_name, write_text
from vce.core.labels import LABELS
from vce.core.params import Section
from vce.eval.explain import ABSENT_RULE
from vce.eval.frame_metrics import frame_metrics
from vce.eval.plots import curve_table, per_class_table
from vce.eval.score import THRESHOLDS, score
from vce.eval.timelines import merged_runs, plot_timeline, row_matches


class ViewerParams(Section):
    """`report.viewer`: the offline HTML exam viewer (`vce.viewer`)."""

    thumbnail_px: int = Field(ge=16, le=1024)
    image_format: Literal["jpeg", "webp"]
    quality: int = Field(ge=1, le=95)
    frames_per_event: int = Field(ge=1, le=16)
    events_per_label: int = Field(ge=0)
    errors_per_label: int = Field(ge=0)
    max_thumbnails: int = Field(ge=0)
    trace_bins: int = Field(ge=16)


class ReportParams(Section):
    """`report`: plots and the markdown report."""

    curve_points: int = Field(ge=2)
    timeline_dpi: int = Field(ge=30, le=600)
    timeline_width: float = Field(ge=2, le=60)
    videos: list[str | int]
    viewer: ViewerParams


@dataclass
class ScoredSet:
    """One set of videos the report scores: ground truth, predicted events, frame probabilities.

    probs: video_id, event time `t` and the 17 label columns of the set's frames (NaN where a
    frame is invalid); units: video id -> event unit (`index` | `frame`) of its time axis.
    """

    name: str  # "validation" (the thresholds and event knobs were tuned on it) | "test" (held out)
    gt: dict
    prediction: dict
    probs: pd.DataFrame
    units: dict[str, str]


@dataclass
class SetResult:
    """What the report computes for one set."""

    scored: ScoredSet
    score: dict  # vce.eval.score.score(gt, prediction)
    empty: dict  # the same for the empty submission: the floor to beat
    rows: dict[str, list] = field(default_factory=dict)  # video id -> its 17 `RowMatches`


def empty_submission(gt: dict) -> dict:
    """A valid submission with no events, for the videos of `gt`."""
    return {"videos": [{"video_id": video["video_id"], "events": []} for video in gt["videos"]]}


def score_set(scored: ScoredSet) -> SetResult:
    result = SetResult(scored, score(scored.gt, scored.prediction), score(scored.gt, empty_submission(scored.gt)))
    result.rows = {str(v): row_matches(scored.gt, scored.prediction, str(v)) for v in result.score["per_video@0.5"]}
    return result


# ----------------------------------------------------------------------------- markdown


def _number(value, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    return f"{value:.{digits}f}"


def _threshold_text(value: float) -> str:
    return f"off ({value:g})" if value > 1.0 else f"{value:.2f}"


def _knob(value) -> str:
    """A params value as params.yaml writes it (true, not True)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _event_count(submission: dict, video_id=None) -> int:
    return sum(len(v["events"]) for v in submission["videos"] if video_id is None or str(v["video_id"]) == str(video_id))


SET_TITLES = {"validation": "validation (tuned on it: optimistic)", "test": "test (held out)"}


def _overall_section(results: list[SetResult], frame_result: dict) -> list[str]:
    rows = [[SET_TITLES.get(r.scored.name, r.scored.name), str(len(r.score["per_video@0.5"])),
             _number(r.score["map@0.5"]), _number(r.score["map@0.95"]), _number(r.empty["map@0.5"]),
             str(_event_count(r.scored.gt)), str(_event_count(r.scored.prediction))] for r in results]
    parts = [
        "## Overall", "",
        _table(["set", "videos", "mAP@0.5", "mAP@0.95", "empty submission", "GT events", "predicted events"], rows), "",
        f"Frame level (validation frames): mAP {_number(frame_result['map'])} (mean per-class AP), "
        f"mean ROC AUC {_number(frame_result['mean_auc'])}.", "",
        "**Empty submission**: the score of a file with no events for the same videos (`vce.eval.score` on it). "
        "A label absent from a video scores AP 1 there when nothing of it is predicted, so the empty file "
        "scores the share of absent labels, at both tIoUs: the floor a submission must beat.",
    ]
    for r in results:
        for threshold in THRESHOLDS:
            if r.score[f"map@{threshold}"] < r.empty[f"map@{threshold}"]:
                parts.append(f"On the {r.scored.name} videos at tIoU {threshold} the empty submission beats the "
                             f"events: {_number(r.empty[f'map@{threshold}'])} against {_number(r.score[f'map@{threshold}'])}.")
    return parts + [""]


def _route_line(route: dict | None) -> list[str]:
    """How many labels used each route (metrics/route.json) and why; the per-class table has each label's."""
    if not route:
        return []
    counts = ", ".join(f"{name} {n}" for name, n in route.get("counts", {}).items())
    why = f" {route['reason']}." if route.get("reason") else f" Chosen per label on {route.get('evidence')}."
    return [f"- **Route per label** (`metrics/route.json`, column *route* of the per-class table): {counts}.{why}"]


def _events_section(saved: dict, probs_source: str, configured_events: dict | None,
                    route: dict | None, explained: dict) -> list[str]:
    """Which probabilities and which (tuned) knobs made the events, from models/thresholds.json."""
    tuned_on = saved.get("probs")
    parts = [
        "## How the events were made", "",
        f"- **Probabilities**: `{probs_source}` (`post.probs`: `frame` = the image model, `data/predict/`; "
        "`temporal` = the temporal model over frame embeddings, cross-fitted, `data/temporal/`; `auto` = per "
        "label frame, temporal or their mean (blend), whichever ranks the cross-fitted validation frames best)"
        + ("." if tuned_on in (None, probs_source) else
           f". **Mismatch**: the thresholds were tuned on `{tuned_on}` probabilities: rerun the thresholds stage."),
        *_route_line(route),
        f"- **Thresholds**: method `{saved.get('method', '?')}` (`thresholds.method`), one per label in the "
        "per-class table; a frame fires a label when its probability reaches the label's threshold."
        + (" With the score engine the column *decided by* is what makes the events (a policy per label: "
           "thresholded runs, a region path, an anchor, or off); the *threshold* column is then the frame-F1 "
           "threshold, behind the F1 column only." if saved.get("engine") else ""),
    ]
    off = [label for label, value in saved["thresholds"].items() if float(value) > 1.0]
    engine_off = [label for label, row in explained.items() if row["decision"] == "engine: off"]
    parts.append(
        "- **Threshold off** (a value above 1, `thresholds.off_threshold`, e.g. 1.01): no probability reaches it, "
        "so the label never fires and emits no event. The thresholds stage sets it for labels without "
        "validation positives or where emitting nothing scores best (AP 1 in every video without that label). "
        f"Off here: {', '.join(off) if off else 'none'}."
        + (f" Engine policy off (silent by the engine's choice): {', '.join(engine_off)}." if engine_off else ""))
    events = saved.get("events")
    if events:
        parts += ["- **Event knobs** (`models/thresholds.json` `events`, what the events stage used; "
                  "a value that differs from `params.yaml` was tuned):", ""]
        rows = []
        for key, value in events.items():
            if key == "per_label":
                continue
            configured = (configured_events or {}).get(key, "–")
            rows.append([f"`{key}`", _knob(value), _knob(configured), "tuned" if configured not in ("–", value) else ""])
        parts += ["  " + line for line in _table(["knob", "used", "params.yaml", ""], rows).splitlines()]
        for label, overrides in (events.get("per_label") or {}).items():
            parts.append(f"  - per-label override, {label}: "
                         + ", ".join(f"`{k}` = {v}" for k, v in overrides.items()))
    return parts + [""]


def _per_video_section(results: list[SetResult], timelines: dict) -> list[str]:
    rows = []
    for r in results:
        for video_id in r.score["per_video@0.5"]:
            key = (r.scored.name, str(video_id))
            rows.append([r.scored.name, str(video_id), _number(r.score["per_video@0.5"][video_id]),
                         _number(r.score["per_video@0.95"][video_id]), _number(r.empty["per_video@0.5"][video_id]),
                         str(_event_count(r.scored.gt, video_id)), str(_event_count(r.scored.prediction, video_id)),
                         f"[timeline]({timelines[key]})" if key in timelines else "–"])
    return ["## Per video", "",
            _table(["set", "video", "mAP@0.5", "mAP@0.95", "empty submission", "GT events", "predicted events",
                    "timeline"], rows), ""]


def label_counts(result: SetResult) -> dict[str, dict]:
    """label -> GT fragments, merged GT runs, predicted events, TPs at each tIoU (summed over videos)."""
    counts = {label: {"gt_events": 0, "gt_runs": 0, "pred_events": 0, **{f"tp@{t}": 0 for t in THRESHOLDS}}
              for label in LABELS}
    for rows in result.rows.values():
        for row in rows:
            c = counts[row.label]
            c["gt_events"] += len(row.gt)
            c["gt_runs"] += merged_runs(row.gt)
            c["pred_events"] += len(row.pred)
            for t in THRESHOLDS:
                c[f"tp@{t}"] += sum(row.hits[t])
    return counts


def _per_class_section(table: pd.DataFrame, counts: dict, explained: dict) -> list[str]:
    rows = [[row["label"], explained[row["label"]]["route"] or "–", _number(row["support"]),
             _number(row["ap"]), _number(row["auc"]),
             _threshold_text(row["threshold"]), explained[row["label"]]["decision"], _number(row["f1"]), str(row["gt_runs"]), str(row["gt_events"]),
             str(row["pred_events"]), _number(row["tap@0.5"]), _number(row["tap@0.95"])]
            for row in table.to_dict("records")]
    parts = [
        "## Per class (validation)", "",
        "Route: the probabilities the label used (frame, temporal, blend = their mean). "
        "Support: positive validation frames. AP, AUC, F1: frame level (F1 at the threshold). GT runs: "
        "contiguous stretches of the label; GT events: the ground-truth events the metric scores. "
        f"Decided by: how the label becomes events. tAP: temporal AP averaged over the validation videos ({ABSENT_RULE}).",
        "",
        _table(["label", "route", "support", "AP", "AUC", "threshold", "decided by", "F1", "GT runs", "GT events",
                "predicted events", "tAP@0.5", "tAP@0.95"], rows), "",
        *_silent_lines(explained),
        "**Why a label can rank frames perfectly and still score tAP@0.95 = 0.** The ground truth starts a new "
        "event whenever the *set* of active labels changes, so a region with findings inside (a bleeding in "
        "the small intestine, an erosion in the colon) is cut into several ground-truth events: fragments. "
        "Each fragment must be matched by its own prediction with tIoU >= 0.95 (or 0.5); one long, correct "
        "prediction over the region matches at most one fragment, and only if it covers that fragment alone.",
        "",
    ]
    for row in table.to_dict("records"):
        c = counts[row["label"]]
        if row["ap"] is not None and not math.isnan(row["ap"]) and row["ap"] - row["tap@0.95"] >= 0.5:
            parts.append(
                f"- **{row['label']}**: frame AP {_number(row['ap'], 3)}, tAP@0.95 {_number(row['tap@0.95'], 3)}: "
                f"{c['gt_runs']} run(s) are {c['gt_events']} ground-truth events; {c['pred_events']} predicted "
                f"event(s) match {c['tp@0.5']} of them at tIoU 0.5 and {c['tp@0.95']} at 0.95.")
    return parts + [""]


def _silent_lines(explained: dict) -> list[str]:
    """Why each label without a validation event is silent: `vce.eval.explain`, as the viewer says it."""
    silent = [(label, row) for label, row in explained.items() if row["silent"]]
    if not silent:
        return []
    return ["**Silent labels** (no validation event; the exam viewer's index gives the same reasons):", "",
            *(f"- **{label}** (route {row['route'] or '–'}; {row['decision']}): {row['silent']}." for label, row in silent),
            ""]


def render_markdown(results: list[SetResult], table: pd.DataFrame, frame_result: dict, saved_thresholds: dict,
                    probs_source: str, configured_events: dict | None, timelines: dict, route: dict | None,
                    explained: dict) -> str:
    """The report text; `timelines` maps (set name, video id) -> image link relative to the report."""
    validation = results[0]
    parts = [
        "# Report",
        "",
        "Official RARE-VISION temporal mAP (`vce.eval.score`) of the predicted events against the ground truth: "
        "validation events `data/events/val.json` against `data/score/val_gt.json`"
        + ("; test events `data/events/submission.json` against `data/score/test_gt.json` (`score.test_gt` and the `split.test_videos` labels)." if len(results) > 1 else
           "; no test score (no `score.test_gt`, no `split.test_videos`)."),
        "",
        *_overall_section(results, frame_result),
        *_events_section(saved_thresholds, probs_source, configured_events, route, explained),
        *_per_video_section(results, timelines),
        *_per_class_section(table, label_counts(validation), explained),
        "## Event timelines",
        "",
        "One row per label (threshold beside the name; `off` never fires). In each row: the ground-truth "
        "events (green) with a dark tick where one fragment touches the next; the predicted events twice, "
        "blue where the official matching makes them a true positive and orange where false, at tIoU 0.5 "
        "(upper strip) and 0.95 (lower strip); the frame probability (grey) and the threshold (red, dashed). "
        "On the right: the row's temporal AP at 0.5 / 0.95 and its event counts. The x axis says which time "
        "unit the events use.",
        "",
    ]
    for (name, video_id), link in timelines.items():
        parts += [f"### {name.capitalize()} video {video_id}", "", f"![event timeline of {name} video {video_id}]({link})", ""]
    return "\n".join(parts)


# ----------------------------------------------------------------------------- the whole report


def _write_csv(path: Path, frame: pd.DataFrame) -> None:
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False, float_format="%.6g")


def per_video_table(results: list[SetResult]) -> pd.DataFrame:
    """One row per scored video: set, video_id, map@0.5, map@0.95, empty (the empty submission's mAP)."""
    rows = [{"set": r.scored.name, "video_id": str(v), "map@0.5": r.score["per_video@0.5"][v],
             "map@0.95": r.score["per_video@0.95"][v], "empty": r.empty["per_video@0.5"][v]}
            for r in results for v in r.score["per_video@0.5"]]
    return pd.DataFrame(rows, columns=["set", "video_id", "map@0.5", "map@0.95", "empty"])


def _bars(frame: pd.DataFrame, category: str, series: dict[str, str]) -> pd.DataFrame:
    """Long table (category, series, series_order, value) for the `grouped_bars` DVC template."""
    parts = [pd.DataFrame({"category": frame[category], "series": name, "series_order": k, "value": frame[column]})
             for k, (column, name) in enumerate(series.items())]
    return pd.concat(parts, ignore_index=True)


def _time_range(probs: pd.DataFrame, video_id: str) -> tuple[int, int]:
    t = probs.loc[probs["video_id"].astype(str) == video_id, "t"]
    return int(t.min()), int(t.max())


def _draw_timelines(results: list[SetResult], thresholds: dict, params, plots_dir: Path, report_path: Path) -> dict:
    """One PNG per chosen video of every set; (set, video id) -> link relative to the report."""
    available = {str(v) for r in results for v in r.rows}
    chosen = {str(v) for v in params.videos} or available
    unknown = sorted(chosen - available)
    if unknown:
        raise ParamsError(f"report.videos: {unknown} are not scored videos; they are {sorted(available)}")
    links = {}
    for r in results:
        probs = r.scored.probs
        for video_id, rows in r.rows.items():
            if video_id not in chosen:
                continue
            frames = probs[probs["video_id"].astype(str) == video_id]
            if frames.empty:
                raise DataError(f"no {r.scored.name} probabilities for video {video_id}: rerun predict")
            path = plots_dir / "timelines" / f"{r.scored.name}_{safe_file_name(video_id)}.png"
            title = (f"{r.scored.name} video {video_id}: mAP@0.5 {_number(r.score['per_video@0.5'][video_id], 3)}, "
                     f"mAP@0.95 {_number(r.score['per_video@0.95'][video_id], 3)} "
                     f"(empty submission {_number(r.empty['per_video@0.5'][video_id], 3)})")
            plot_timeline(path, rows, frames["t"].to_numpy(), frames[list(LABELS)].to_numpy(np.float64), thresholds,
                          _time_range(probs, video_id), r.scored.units.get(video_id, "index"), title,
                          width=params.timeline_width, dpi=params.timeline_dpi)
            links[(r.scored.name, video_id)] = Path(os.path.relpath(path, report_path.parent)).as_posix()
    return links


def write_report(
    *,
    y_true: np.ndarray,
    y_prob: np.ndarray,
    sets: list[ScoredSet],
    saved_thresholds: dict,
    probs_source: str,
    configured_events: dict | None,
    params: ReportParams,
    plots_dir,
    report_path,
    route: dict | None,
    explained: dict,
) -> list[SetResult]:
    """Write the curves, the tables, the timelines and the report; return each set's scores.

    y_true, y_prob: (N, 17) labels and probabilities of the valid validation frames (frame
    metrics and curves); sets: validation first, then test when its ground truth is known;
    saved_thresholds: models/thresholds.json; configured_events: params.yaml `events` (to mark
    the tuned knobs). Writes under `plots_dir`: pr.csv, roc.csv, per_class.csv, temporal_ap.csv,
    per_video.csv, per_video_bars.csv, timelines/<set>_<video_id>.png; and `report_path`. route:
    metrics/route.json, None when unknown; explained: `vce.eval.explain.explain_labels` of the
    validation set (each label's route, decision and why it is silent: the viewer shows the same).
    """
    plots_dir, report_path = Path(plots_dir), Path(report_path)
    thresholds = saved_thresholds["thresholds"]
    missing = [label for label in LABELS if label not in thresholds]
    if missing:
        raise DataError(f"thresholds lack label(s) {missing}")
    # 1. Frame-level curves and metrics (validation frames).
    for kind in ("pr", "roc"):
        _write_csv(plots_dir / f"{kind}.csv", curve_table(kind, y_true, y_prob, thresholds, params.curve_points))
    frame_result = frame_metrics(y_true, y_prob)
    # 2. Temporal scores, the empty floor and the official matching of every set.
    results = [score_set(scored) for scored in sets]
    validation = results[0]
    table = per_class_table(y_true, y_prob, thresholds, frame_result, validation.score)
    counts = label_counts(validation)
    for key in ("gt_runs", "gt_events", "pred_events"):
        table[key] = [counts[label][key] for label in table["label"]]
    table["bar_label"] = [f"{label} ({support} frames)" for label, support in zip(table["label"], table["support"])]
    _write_csv(plots_dir / "per_class.csv", table)
    _write_csv(plots_dir / "temporal_ap.csv", _bars(table, "bar_label", {"tap@0.5": "tAP@0.5", "tap@0.95": "tAP@0.95"}))
    per_video = per_video_table(results)
    _write_csv(plots_dir / "per_video.csv", per_video)
    per_video["category"] = per_video["set"] + " " + per_video["video_id"]
    _write_csv(plots_dir / "per_video_bars.csv",
               _bars(per_video, "category", {"map@0.5": "mAP@0.5", "map@0.95": "mAP@0.95", "empty": "empty submission"}))
    # 3. Timelines, then the markdown report.
    timelines = _draw_timelines(results, thresholds, params, plots_dir, report_path)
    write_text(report_path, render_markdown(results, table, frame_result, saved_thresholds, probs_source,
                                            configured_events, timelines, route, explained))
    return results
