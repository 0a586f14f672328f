"""The exam viewer: an offline HTML folder to look at the events, the misses and the false alarms.

`write_viewer` turns each set (validation, test, or one exam from `vce.infer.detect`) into:

- `index.html`: the score of each set, its videos, a per-label table (how the label is
  decided, its route, counts and temporal APs, and for a label without any event why it is
  silent: `vce.eval.explain`, the same rows metrics/report.md shows);
- one page per video (`<set>_<video>.html`): the 17-row timeline (ground-truth fragments, the
  submission's or the clinical list's events marked TP/FP by the official matching at tIoU 0.5
  and 0.95, `vce.eval.score.event_matches`; the probability trace and the threshold), zoomable,
  where selecting an event shows its frames with the label's probability at each; and the
  clinical event list with thumbnails, the way a reader reviews an exam;
- per label with ground truth (`label_<label>.html`): the top false alarms (ranked as the
  submission ranks them: its order within a video, then the mean probability), the missed
  ground-truth events and the events matched at 0.5 but not at 0.95, each with thumbnails.

Everything is local (one `viewer.js`, one `viewer.css`, the thumbnails; each page's data inline
as JSON): no server, no network. Thumbnails are capped (`vce.viewer.thumbnails`).
"""

from __future__ import annotations

import base64
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from vce.core.errors import DataError
from vce.core.io import atomic_dir, safe_file_name
from vce.core.labels import LABEL_INDEX, LABELS, NUM_LABELS
from vce.eval.explain import ABSENT_RULE, decision, drawn_threshold, explain_labels
from vce.eval.report import ViewerParams
from vce.eval.score import THRESHOLDS, average_precisions, event_matches, score
from vce.viewer.pages import index_page, label_page, label_page_name, video_page
from vce.viewer.thumbnails import Request, event_frames, plan_thumbnails, write_thumbnails

ASSETS = Path(__file__).with_name("assets")
UNKNOWN = -2  # the match of an event in a video without ground truth


@dataclass
class ViewerSet:
    """One set of videos to show.

    probs: video_id, t and the 17 label columns (NaN = invalid frame); frame_files: video_id, t
    and `path` (a frame file, absolute or relative to the working directory); gt: the ground
    truth, None when unknown (videos it lacks are shown without TP/FP marks).
    """

    name: str
    prediction: dict
    clinical: dict
    probs: pd.DataFrame
    frame_files: pd.DataFrame
    units: dict[str, str]
    gt: dict | None = None


@dataclass
class Video:
    """What a video page shows. Event rows: [start, end, label k, rank or position, match@0.5,
    match@0.95, event index, mean probability]; match = GT position (-1 none, -2 no truth)."""

    set_name: str
    video_id: str
    unit: str
    times: np.ndarray  # (N,) sorted event times of the frames with probabilities
    probs: np.ndarray  # (N, 17)
    has_gt: bool
    pred: list = field(default_factory=list)
    clin: list = field(default_factory=list)
    gt: list = field(default_factory=list)
    ap: list | None = None  # (17, 2) row tAP at 0.5 / 0.95
    page: str = ""


def _events_of(submission: dict | None) -> dict:
    return {str(v["video_id"]): v["events"] for v in (submission or {"videos": []})["videos"]}


def _mean_probs(times, cum, count, start: int, end: int, k: int) -> float | None:
    lo, hi = np.searchsorted(times, start, "left"), np.searchsorted(times, end, "right")
    n = count[hi, k] - count[lo, k]
    return round(float((cum[hi, k] - cum[lo, k]) / n), 3) if n else None


def _rows(events: list, matches: dict | None, video_id: str, times, cum, count, gt: bool = False) -> list:
    """One row per (event, label) in file order; rank = its position in the (video, label) group."""
    rows, positions = [], [0] * NUM_LABELS
    taken = {}
    if gt and matches is not None:  # GT position -> matched at each tIoU
        taken = {(label, t): set(m[t][m[t] >= 0].tolist()) for (v, label), m in matches.items() if v == video_id
                 for t in THRESHOLDS}
    for e, event in enumerate(events):
        for label in event["label"]:
            k = LABEL_INDEX[label]
            r = positions[k]
            positions[k] += 1
            if matches is None:
                hit = [UNKNOWN, UNKNOWN]
            elif gt:
                hit = [int(r in taken.get((label, t), ())) for t in THRESHOLDS]
            else:
                m = matches.get((video_id, label))
                hit = [int(m[t][r]) if m is not None else -1 for t in THRESHOLDS]
            rows.append([int(event["start"]), int(event["end"]), k, r, *hit, e,
                         _mean_probs(times, cum, count, event["start"], event["end"], k)])
    return rows


def _videos(viewer_set: ViewerSet) -> list[Video]:
    """The set's videos in the order of its submission, with their rows matched officially."""
    gt_events = _events_of(viewer_set.gt)
    scored_gt = {"videos": [v for v in (viewer_set.gt or {"videos": []})["videos"]
                            if any(e["label"] for e in v["events"])]}
    scored = {str(v["video_id"]) for v in scored_gt["videos"]}
    raw_ids = {str(v["video_id"]): v["video_id"] for v in scored_gt["videos"]}

    def matched(submission):
        part = {"videos": [v for v in submission["videos"] if str(v["video_id"]) in scored]}
        part["videos"] += [{"video_id": raw_ids[v], "events": []} for v in scored - set(_events_of(part))]
        return {(str(v), label): m for (v, label), m in event_matches(scored_gt, part).items()} if scored else {}

    pred_matches, clin_matches = matched(viewer_set.prediction), matched(viewer_set.clinical)
    aps = {}
    if scored:
        ids, by_threshold = average_precisions(scored_gt, {"videos": [v for v in viewer_set.prediction["videos"]
                                                                       if str(v["video_id"]) in scored]})
        aps = {str(v): np.stack([by_threshold[t][i] for t in THRESHOLDS], axis=1).round(4).tolist()
               for i, v in enumerate(ids)}
    probs = viewer_set.probs.sort_values(["video_id", "t"], kind="stable")
    groups = {str(v): frame for v, frame in probs.groupby("video_id", sort=False)}
    clinical = _events_of(viewer_set.clinical)
    videos = []
    for video_id, events in _events_of(viewer_set.prediction).items():
        frame = groups.get(video_id, probs.iloc[:0])
        times, values = frame["t"].to_numpy(np.int64), frame[list(LABELS)].to_numpy(np.float64)
        valid = np.isfinite(values)
        cum = np.vstack([np.zeros((1, NUM_LABELS)), np.cumsum(np.where(valid, values, 0.0), axis=0)])
        count = np.vstack([np.zeros((1, NUM_LABELS), np.int64), np.cumsum(valid, axis=0)])
        has_gt = video_id in scored
        video = Video(viewer_set.name, video_id, viewer_set.units.get(video_id, "index"), times, values, has_gt)
        video.pred = _rows(events, pred_matches if has_gt else None, video_id, times, cum, count)
        video.clin = _rows(clinical.get(video_id, []), clin_matches if has_gt else None, video_id, times, cum, count)
        video.gt = _rows(gt_events.get(video_id, []), pred_matches if has_gt else None, video_id, times, cum,
                         count, gt=True)
        video.ap = aps.get(video_id)
        video.page = page_name(viewer_set.name, video_id)
        videos.append(video)
    return videos


def error_lists(videos: list[Video], label: str, cap: int) -> dict[str, list]:
    """The label's top false alarms, missed GT events and 0.95 misses over `videos`: (video, row)."""
    k = LABEL_INDEX[label]
    false_alarms = [(v, row) for v in videos if v.has_gt for row in v.pred if row[2] == k and row[4] == -1]
    misses = [(v, row) for v in videos if v.has_gt for row in v.gt if row[2] == k and not row[4]]
    loose = [(v, row) for v in videos if v.has_gt for row in v.pred if row[2] == k and row[4] >= 0 and row[5] == -1]
    confidence = lambda item: -(item[1][7] if item[1][7] is not None else -1.0)  # noqa: E731
    return {"false alarms": sorted(false_alarms, key=lambda item: (item[1][3], confidence(item)))[:cap],
            "missed": sorted(misses, key=confidence)[:cap],
            "matched at 0.5, missed at 0.95": sorted(loose, key=lambda item: (item[1][3], confidence(item)))[:cap]}


def _requests(videos: list[Video], errors: dict, params: ViewerParams) -> list[Request]:
    """What every list asks for: the error pages' entries first (they are few: `errors_per_label`
    x 3 per label and set), then the first `events_per_label` events per (video, label) and kind,
    every list's first event before any list's second (the clinical list, then the submission,
    then the ground truth)."""
    requests = []
    for video in videos:
        for kind, rows, tier in (("clin", video.clin, 0), ("pred", video.pred, 1), ("gt", video.gt, 2)):
            per_label: dict[int, list] = {}
            for row in rows:
                per_label.setdefault(row[2], []).append(row)
            for k, label_rows in per_label.items():
                if kind == "gt":
                    label_rows = sorted(label_rows, key=lambda row: row[4] == 1)  # the misses first
                for j, row in enumerate(label_rows[:params.events_per_label]):
                    times = event_frames(video.times, row[0], row[1], params.frames_per_event)
                    requests.append(Request((j, tier), video.video_id, (kind, row[6], k), tuple(times)))
    for lists in errors.values():
        for name, items in lists.items():
            kind = "gt" if name == "missed" else "pred"
            for j, (video, row) in enumerate(items):
                times = event_frames(video.times, row[0], row[1], params.frames_per_event)
                requests.append(Request((-1, j), video.video_id, (kind, row[6], row[2]), tuple(times)))
    return requests


def trace_bins(times: np.ndarray, probs: np.ndarray, bins: int) -> dict:
    """The probability trace in at most `bins` bins of consecutive frames: each bin's first time,
    the min and max of each label in it (uint8 = round(254 p), 255 = no valid frame; base64 of
    (17, B) bytes). Up to `bins` frames every frame is its own bin: the trace exactly."""
    n = len(times)
    if n == 0:
        return {"t": [], "end": 0, "lo": "", "hi": ""}
    starts = np.arange(n) if n <= bins else np.unique(np.round(np.linspace(0, n, bins + 1)).astype(np.int64))[:-1]
    encoded = {}
    for name, ufunc in (("lo", np.fmin), ("hi", np.fmax)):
        with np.errstate(invalid="ignore"):
            values = ufunc.reduceat(probs, starts, axis=0)  # (B, 17), NaN only where a bin has no valid frame
        q = np.where(np.isnan(values), 255, np.round(np.clip(values, 0, 1) * 254)).astype(np.uint8)
        encoded[name] = base64.b64encode(np.ascontiguousarray(q.T).tobytes()).decode("ascii")
    return {"t": times[starts].tolist(), "end": int(times[-1]), **encoded}


def _thumb_rows(video: Video, granted: set, files: dict, frames_per_event: int) -> tuple[list, dict]:
    """The video's thumbnails [t, file, 17 probabilities] and key -> thumbnail ids of each granted entry."""
    ids, thumbs, by_key = {}, [], {}
    for kind, rows in (("pred", video.pred), ("clin", video.clin), ("gt", video.gt)):
        for row in rows:
            key = (kind, row[6], row[2])
            if (video.video_id, key) not in granted:
                continue
            entry = []
            for t in event_frames(video.times, row[0], row[1], frames_per_event):
                if (video.video_id, t) not in files:
                    continue  # unreadable frame
                if t not in ids:
                    ids[t] = len(thumbs)
                    p = video.probs[np.searchsorted(video.times, t)]
                    thumbs.append([t, files[(video.video_id, t)][0],
                                   [None if np.isnan(x) else round(float(x), 3) for x in p]])
                entry.append(ids[t])
            by_key[key] = entry
    return thumbs, by_key


NAME_MAX = 255  # bytes in one file name (Linux, macOS)


def page_name(set_name: str, video_id) -> str:
    """The file name of a video's page."""
    return f"{safe_file_name(set_name)}_{safe_file_name(video_id)}.html"


def check_page_names(set_name: str, video_ids) -> None:
    """Every video's page name fits a file name; else one line naming the video, before any
    work (a 250-byte exam folder failed only after the whole detection run)."""
    for video_id in video_ids:
        name = page_name(set_name, video_id)
        if len(name.encode()) > NAME_MAX:
            raise DataError(f"video id {str(video_id)[:40]!r}… ({len(str(video_id).encode())} bytes): its viewer page "
                            f"would be a {len(name.encode())}-byte file name, over the {NAME_MAX}-byte limit: "
                            "rename the exam folder")


def write_viewer(out_dir, sets: list[ViewerSet], saved_thresholds: dict, params: ViewerParams,
                 n_tuning_videos: int | None, min_gain_sqrt_videos: float, events: dict | None, *,
                 routes: dict | None = None, explained: dict | None = None) -> dict:
    """Write the viewer folder; return its counts (videos, pages, events, thumbnails, bytes, seconds per phase).

    saved_thresholds: models/thresholds.json; routes: each label's route (metrics/route.json);
    n_tuning_videos, min_gain_sqrt_videos, events: what `vce.eval.explain.explain_labels` needs to
    explain a label. explained: set name -> those rows where the caller already made them (the
    report stage: metrics/report.md shows the same); other sets' are made here.
    """
    for viewer_set in sets:
        check_page_names(viewer_set.name, viewer_set.probs["video_id"].unique())
    with atomic_dir(out_dir) as staging:  # the old folder stays whole until the new one is complete
        return _write_viewer(staging, sets, saved_thresholds, params, n_tuning_videos, min_gain_sqrt_videos, events,
                             routes, explained or {})


def _write_viewer(out_dir: Path, sets: list[ViewerSet], saved_thresholds: dict, params: ViewerParams,
                  n_tuning_videos: int | None, min_gain_sqrt_videos: float, events: dict | None,
                  routes: dict | None, explained: dict) -> dict:
    """`write_viewer` into the empty folder `out_dir` (files written plainly: the folder is the unit)."""
    clock = [time.perf_counter()]
    per_set = [(viewer_set, _videos(viewer_set)) for viewer_set in sets]
    errors = {(s.name, label): error_lists(videos, label, params.errors_per_label)
              for s, videos in per_set for label in LABELS if any(v.has_gt for v in videos)}
    all_videos = [video for _, videos in per_set for video in videos]
    granted, frames = plan_thumbnails(_requests(all_videos, errors, params), params.max_thumbnails)
    paths = {}
    for viewer_set, _ in per_set:
        files = viewer_set.frame_files
        wanted = pd.DataFrame(sorted(frames), columns=["video_id", "t"])
        found = wanted.merge(files.assign(video_id=files["video_id"].astype(str)), on=["video_id", "t"])
        paths |= {(v, int(t)): p for v, t, p in found[["video_id", "t", "path"]].itertuples(index=False)}
    clock.append(time.perf_counter())
    files = write_thumbnails(paths, out_dir, params.thumbnail_px, params.image_format, params.quality)
    clock.append(time.perf_counter())
    thumbs = {}
    for video in all_videos:
        thumbs[(video.set_name, video.video_id)] = _thumb_rows(video, granted, files, params.frames_per_event)
        data = {"set": video.set_name, "video": video.video_id, "unit": video.unit, "labels": list(LABELS),
                "thresholds": [drawn_threshold(saved_thresholds, label) for label in LABELS],
                "decisions": [decision(saved_thresholds, label) for label in LABELS],
                "hasGt": video.has_gt, "ap": video.ap, "trace": trace_bins(video.times, video.probs, params.trace_bins),
                "pred": video.pred, "clin": video.clin, "gt": video.gt,
                "thumbs": thumbs[(video.set_name, video.video_id)][0],
                "thumbsOf": {f"{kind}-{e}-{k}": ids for (kind, e, k), ids in thumbs[(video.set_name, video.video_id)][1].items()}}
        (out_dir / video.page).write_text(video_page(video, data, params.events_per_label))
    summaries = []
    for viewer_set, videos in per_set:
        rows = explained.get(viewer_set.name) or explain_labels(
            saved_thresholds, viewer_set.probs, viewer_set.prediction, routes, n_tuning_videos, min_gain_sqrt_videos,
            events)
        summaries.append(_set_summary(viewer_set, videos, rows))
        for label in LABELS if any(v.has_gt for v in videos) else ():
            (out_dir / label_page_name(viewer_set.name, label)).write_text(label_page(viewer_set.name, label, errors[(viewer_set.name, label)], thumbs))
    (out_dir / "index.html").write_text(index_page(summaries, unavailable=len(frames) - len(files), wanted=len(frames)))
    for asset in ("viewer.js", "viewer.css"):
        shutil.copyfile(ASSETS / asset, out_dir / asset)
    clock.append(time.perf_counter())
    return {"videos": len(all_videos), "pages": len(list(out_dir.glob("*.html"))),
            "seconds": dict(zip(("matching", "thumbnails", "pages"), np.diff(clock).round(1).tolist())),
            "events": sum(len(v.pred) for v in all_videos), "thumbnails": len(files),
            "unavailable": len(frames) - len(files),  # granted, but the frame file is missing or unreadable here
            "thumbnail_bytes": sum(n for _, n in files.values()),
            "bytes": sum(p.stat().st_size for p in out_dir.rglob("*") if p.is_file())}


def _set_summary(viewer_set: ViewerSet, videos: list[Video], explained: dict) -> dict:
    """What index.html shows of a set: its score, its videos and the per-label table (`explained`:
    `vce.eval.explain.explain_labels` of the set)."""
    scored_gt = {"videos": [v for v in (viewer_set.gt or {"videos": []})["videos"] if any(e["label"] for e in v["events"])]}
    scored_ids = {str(v["video_id"]) for v in scored_gt["videos"]}
    result = None
    if scored_ids:
        result = score(scored_gt, {"videos": [v for v in viewer_set.prediction["videos"]
                                              if str(v["video_id"]) in scored_ids]}, check=False)
    labels = []
    for k, label in enumerate(LABELS):
        row = {"label": label, "decision": explained[label]["decision"], "route": explained[label]["route"],
               "gt": sum(r[2] == k for v in videos for r in v.gt), "pred": sum(r[2] == k for v in videos for r in v.pred),
               "clin": sum(r[2] == k for v in videos for r in v.clin),
               "tp": [sum(r[2] == k and r[4 + i] >= 0 for v in videos if v.has_gt for r in v.pred) for i in range(2)],
               "tap": [result[f"per_label@{t}"][label] for t in THRESHOLDS] if result else None,
               "silent": explained[label]["silent"]}
        labels.append(row)
    return {"name": viewer_set.name, "score": result, "videos": videos, "labels": labels,
            "has_gt": any(v.has_gt for v in videos), "absent_rule": ABSENT_RULE}
