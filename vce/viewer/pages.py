"""The viewer's HTML: the index, one page per video, one error page per (set, label).

Plain HTML that reads without JavaScript (tables, thumbnails); `viewer.js` adds the zoomable
timeline and the event panel from the page's inline JSON (`<script type="application/json"
id="viewer-data">`: a file:// page cannot fetch a JSON file beside it). Every link is relative.
"""

from __future__ import annotations

import json
import math
from html import escape

from vce.core.io import safe_file_name
from vce.core.labels import LABELS

SET_TITLES = {"validation": "Validation (tuned on it: optimistic)", "test": "Test (held out)", "exam": "Exam"}


def _page(title: str, body: str, data: dict | None = None) -> str:
    script = ""
    if data is not None:
        text = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
        script = f'<script type="application/json" id="viewer-data">{text}</script>\n<script src="viewer.js"></script>\n'
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{escape(title)}</title>\n'
            f'<link rel="stylesheet" href="viewer.css">\n</head>\n<body>\n{body}\n{script}</body>\n</html>\n')


def _number(value, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.{digits}f}"


def _table(header: list[str], rows: list[list[str]], cls: str = "") -> str:
    head = "".join(f"<th>{h}</th>" for h in header)
    body = "\n".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}">\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody>\n</table>'


def label_page_name(set_name: str, label: str) -> str:
    return f"label_{safe_file_name(set_name)}_{safe_file_name(label)}.html"


UNAVAILABLE = "frames unavailable here (frame files not found or unreadable)"


def _thumb_strip(files: list[tuple[str, str]] | None, cls: str = "strip") -> str:
    """Thumbnails (file, caption) in a row; a note where the cap left an event without frames
    (None) or where its frame files could not be read on this machine ([])."""
    if files is None:
        return '<span class="nothumb">no thumbnails (past the cap)</span>'
    if not files:
        return f'<span class="nothumb">{UNAVAILABLE}</span>'
    return f'<span class="{cls}">' + "".join(
        f'<figure><img src="{escape(f)}" alt="{escape(c)}" loading="lazy"><figcaption>{escape(c)}</figcaption></figure>'
        for f, c in files) + "</span>"


def _files(thumbs: tuple, key: tuple, k: int) -> list[tuple[str, str]] | None:
    """The entry's thumbnails (file, caption); None when the cap granted it none."""
    rows, by_key = thumbs
    if key not in by_key:
        return None
    return [(rows[i][1], f"t {rows[i][0]} · p {_number(rows[i][2][k], 2)}") for i in by_key[key]]


# ----------------------------------------------------------------------------- index


def _set_section(summary: dict) -> str:
    name, result, videos = summary["name"], summary["score"], summary["videos"]
    parts = [f'<h2 id="set-{escape(name)}">{escape(SET_TITLES.get(name, name))}</h2>']
    if result:
        parts.append(f'<p class="score">mAP@0.5 <b>{_number(result["map@0.5"], 4)}</b> · mAP@0.95 '
                     f'<b>{_number(result["map@0.95"], 4)}</b> over the {len(result["per_video@0.5"])} videos with '
                     "ground truth (official RARE-VISION metric)</p>")
    else:
        parts.append('<p class="score">No ground truth: events are shown without TP/FP marks.</p>')
    rows = []
    for v in videos:
        ap = [sum(a[i] for a in v.ap) / len(v.ap) for i in range(2)] if v.ap else [None, None]
        rows.append([f'<a href="{escape(v.page)}">{escape(v.video_id)}</a>', str(len(v.times)),
                     _number(ap[0]), _number(ap[1]), str(len({r[6] for r in v.gt})) if v.has_gt else "–",
                     str(len({r[6] for r in v.pred})), str(len({r[6] for r in v.clin}))])
    parts.append(_table(["video", "frames", "mAP@0.5", "mAP@0.95", "GT events", "submission events",
                         "clinical events"], rows))
    rows = []
    for row in summary["labels"]:
        label = escape(row["label"])
        if summary["has_gt"]:
            label = f'<a href="{escape(label_page_name(name, row["label"]))}">{label}</a>'
        tap = row["tap"] or [None, None]
        rows.append([label, escape(row["route"] or "–"), escape(row["decision"]), str(row["gt"]) if summary["has_gt"] else "–", str(row["pred"]),
                     str(row["clin"]), *(str(n) if summary["has_gt"] else "–" for n in row["tp"]),
                     _number(tap[0]), _number(tap[1]),
                     f'<span class="silent">{escape(row["silent"])}</span>' if row["silent"] else ""])
    parts += [f"<h3>Per label ({escape(name)})</h3>",
              "<p>Counts are (event, label) pairs: an event with two labels counts in both rows. TP: submission "
              "events the official matching pairs with a ground-truth event. Route: the probabilities the label "
              "used (metrics/route.json). A label without any event says why (metrics/report.md gives the same "
              f"reason). tAP, the official rule: {escape(summary['absent_rule'])}."
              + (" The label links open its false alarms and misses." if summary["has_gt"] else "") + "</p>",
              _table(["label", "route", "decided by", "GT", "submission", "clinical", "TP@0.5", "TP@0.95", "tAP@0.5",
                      "tAP@0.95", "why silent"], rows, "labels")]
    return "\n".join(parts)


def index_page(summaries: list[dict], unavailable: int, wanted: int) -> str:
    """The viewer's first page; `unavailable` of the `wanted` thumbnails had no readable frame file."""
    nav = " · ".join(f'<a href="#set-{escape(s["name"])}">{escape(SET_TITLES.get(s["name"], s["name"]))}</a>'
                     for s in summaries)
    note = (f'<p class="nothumb">{unavailable} of {wanted} thumbnails unavailable: their frame files were not '
            "found or unreadable where this viewer was written (a machine without the frames shows timelines, "
            "events and scores, and no frames).</p>\n") if unavailable else ""
    body = (f"<header><h1>Exam viewer</h1><nav>{nav}</nav></header>\n<main>\n"
            "<p>Open a video for its timeline (ground truth, events marked TP/FP at tIoU 0.5 and 0.95, the "
            "probability of each label) and its frames; the clinical event list is on each video page.</p>\n"
            + note
            + "\n".join(_set_section(s) for s in summaries) + "\n</main>")
    return _page("Exam viewer", body)


# ----------------------------------------------------------------------------- video pages


def _clinical_table(video, data: dict) -> str:
    thumbs = (data["thumbs"], {tuple(_key(k)): ids for k, ids in data["thumbsOf"].items()})
    by_event: dict[int, list] = {}
    for row in video.clin:
        by_event.setdefault(row[6], []).append(row)
    rows = []
    for n, (e, rows_of_event) in enumerate(by_event.items(), start=1):
        first = rows_of_event[0]
        labels = ", ".join(f'{escape(LABELS[r[2]])} <span class="p">{_number(r[7], 2)}</span>' for r in rows_of_event)
        marks = ""
        if video.has_gt:
            marks = " ".join(f'<span class="{"tp" if r[4] >= 0 else "fp"}">{"TP" if r[4] >= 0 else "FP"}@0.5</span>'
                             for r in rows_of_event)
        rows.append(f'<tr class="pick" data-ref="clin-{e}-{first[2]}"><td>{n}</td><td>{labels} {marks}</td>'
                    f"<td>{first[0]}–{first[1]}</td><td>{first[1] - first[0] + 1}</td>"
                    f"<td>{_thumb_strip(_files(thumbs, ('clin', e, first[2]), first[2]), 'strip small')}</td></tr>")
    if not rows:
        return "<p>The clinical list has no event for this video.</p>"
    return ('<table class="clinical"><thead><tr><th>#</th><th>labels (mean probability)</th><th>span</th>'
            "<th>frames</th><th>thumbnails (start … end)</th></tr></thead>\n<tbody>\n" + "\n".join(rows)
            + "\n</tbody></table>")


def _key(text: str) -> tuple:
    kind, e, k = text.split("-")
    return kind, int(e), int(k)


def _video_label_table(video, data: dict) -> str:
    rows = []
    for k, label in enumerate(LABELS):
        pred = [r for r in video.pred if r[2] == k]
        ap = video.ap[k] if video.ap else [None, None]
        rows.append([escape(label), escape(data["decisions"][k]),
                     str(sum(r[2] == k for r in video.gt)) if video.has_gt else "–", str(len(pred)),
                     str(sum(r[2] == k for r in video.clin)),
                     *(str(sum(r[4 + i] >= 0 for r in pred)) if video.has_gt else "–" for i in range(2)),
                     _number(ap[0]), _number(ap[1])])
    return _table(["label", "decided by", "GT", "submission", "clinical", "TP@0.5", "TP@0.95", "tAP@0.5",
                   "tAP@0.95"], rows, "labels")


def video_page(video, data: dict, events_per_label: int) -> str:
    ap = [sum(a[i] for a in video.ap) / len(video.ap) for i in range(2)] if video.ap else None
    score = (f"mAP@0.5 <b>{_number(ap[0])}</b> · mAP@0.95 <b>{_number(ap[1])}</b>" if ap
             else "no ground truth: no TP/FP marks")
    title = f"{SET_TITLES.get(video.set_name, video.set_name).split(' (')[0]} video {video.video_id}"
    body = f"""<header><h1>{escape(title)}</h1><nav><a href="index.html">← all videos</a></nav>
<p class="score">{score} · {len(video.times)} frames · {len({r[6] for r in video.pred})} submission events ·
{len({r[6] for r in video.clin})} clinical events</p></header>
<main>
<section id="timeline-panel">
<div class="toolbar">
<button type="button" id="zoom-in">+</button><button type="button" id="zoom-out">−</button>
<button type="button" id="zoom-reset">whole video</button>
<label><input type="radio" name="events" value="pred" checked> submission (metric-optimal)</label>
<label><input type="radio" name="events" value="clin"> clinical list</label>
<span id="legend"></span>
</div>
<canvas id="timeline" width="1200" height="1460">The timeline needs JavaScript.</canvas>
<div id="tip" hidden></div>
<p class="hint">Wheel or +/−: zoom · drag: pan · click an event: its frames · ←/→: previous/next event of the row ·
thumbnails for the first {events_per_label} events per label and kind (more where the error pages list them).</p>
<p id="status"></p>
</section>
<section id="event-panel"><p class="hint">Select an event on the timeline or in the clinical list.</p></section>
<section><h2>Clinical event list</h2>
<p>One event per detected run, in time order as the events stage writes it: what a reader reviews.</p>
{_clinical_table(video, data)}</section>
<section><h2>Per label</h2>{_video_label_table(video, data)}</section>
</main>"""
    return _page(title, body, data)


# ----------------------------------------------------------------------------- label pages


def label_page(set_name: str, label: str, lists: dict, thumbs: dict) -> str:
    """The label's error lists of one set; `thumbs`: (set, video) -> (thumb rows, key -> ids)."""
    k = LABELS.index(label)
    parts = [f'<header><h1>{escape(label)}: errors ({escape(set_name)})</h1><nav><a href="index.html">← all videos'
             "</a></nav></header><main>",
             "<p>False alarms: submission events the official matching leaves unmatched at tIoU 0.5, ranked as the "
             "submission ranks them (its order within a video, then the mean probability). Missed: ground-truth "
             "events no prediction matched at 0.5, most probable first. Last: events matched at 0.5 whose span "
             "misses tIoU 0.95 (what mAP@0.95 punishes). Each opens on its video page.</p>"]
    for name, items in lists.items():
        kind = "gt" if name == "missed" else "pred"
        rows = []
        for video, row in items:
            ref = f"{kind}-{row[6]}-{row[2]}"
            rank = f"rank {row[3] + 1}" if kind == "pred" else f"GT event {row[3] + 1}"
            rows.append([f'<a href="{escape(video.page)}#{ref}">{escape(video.video_id)}</a>', rank,
                         f"{row[0]}–{row[1]}", str(row[1] - row[0] + 1), _number(row[7], 2),
                         _thumb_strip(_files(thumbs[(set_name, video.video_id)], (kind, row[6], k), k))])
        parts.append(f"<h2>{escape(name.capitalize())} ({len(items)})</h2>")
        parts.append(_table(["video", "rank", "span", "frames", "mean p", "thumbnails (start … end; p of the label)"],
                            rows, "errors") if rows else "<p>None.</p>")
    return _page(f"{label}: errors ({set_name})", "\n".join(parts) + "</main>")
