"""Spans learned from the tuning ground truth, placed relative to decoded runs and boundaries.

The official ground truth cuts a region wherever another label starts or ends, so a region's
fragments sit at its run's ends (a landmark's frames, a moved boundary): `learn_variants`
learns where, as (mode, a, b) moves of the decoded run (`place_variant`). A landmark sits at
the boundary it marks: `learn_anchors` learns its (offset, length) from the decoded boundary.
Both keep the options that match the most ground-truth spans not matched yet (`_greedy_cover`).
"""

from __future__ import annotations

import numpy as np

from vce.core.labels import LANDMARKS, REGIONS
from vce.eval.score import THRESHOLDS
from vce.post.anatomy import boundaries
from vce.post.runs import runs_of, video_of
from vce.post.timeline import Timeline

# How a region variant (mode, a, b) places its span on a decoded run [s, e].
RUN, FROM_START, FROM_END = 0, 1, 2  # [s + a, e + b]; [s + a, s + b]; [e + a, e + b]


def place_variant(mode, a, b, start, end):
    """The span variant (mode, a, b) gives on the run [start, end] (numbers or arrays)."""
    if mode == RUN:
        return start + a, end + b
    base = start if mode == FROM_START else end
    return base + a, base + b


def learn_variants(timeline: Timeline, path: np.ndarray, gt: dict, state: int, n: int, reach: int) -> list:
    """Up to `n` variants (mode, a, b) of a decoded region run (`place_variant`), ranked by how
    many of its ground-truth fragments the run itself does not match they match in the tuning
    videos (`_greedy_cover`; the run is always ranked first: it is the likeliest fragment, and
    appended candidates cannot lower a present label's AP). The ground truth cuts a region wherever another
    label starts or ends, so its fragments sit at the run's ends (a landmark's frames, a moved
    boundary): options come from fragments within `reach` frames of a run end (RUN), or wholly
    within `reach` of its start (FROM_START) or of its end (FROM_END)."""
    if n == 0:
        return []
    region = REGIONS[state]
    starts, ends = runs_of(path == state)
    run_of = {timeline.video_ids[v]: (int(timeline.time[s]), int(timeline.time[e]))
              for v, s, e in zip(video_of(timeline, starts).tolist(), starts.tolist(), ends.tolist())}
    rows = []  # (run start, run end, fragment start, fragment end)
    for video in gt["videos"]:
        run = run_of.get(str(video["video_id"]))
        if run is not None:
            rows += [(*run, e["start"], e["end"]) for e in video["events"] if region in e["label"]]
    if not rows:
        return []
    s, e, fs, fe = np.array(rows, np.int64).T
    by_mode = [
        (RUN, fs - s, fe - e, (np.abs(fs - s) <= reach) | (np.abs(fe - e) <= reach)),
        (FROM_START, fs - s, fe - s, np.abs(fe - s) <= reach),
        (FROM_END, fs - e, fe - e, np.abs(fs - e) <= reach),
    ]
    options = np.unique(np.vstack([np.stack([np.full(near.sum(), mode), a[near], b[near]], axis=1)
                                   for mode, a, b, near in by_mode]), axis=0)
    return _greedy_cover(options, lambda o: place_variant(o[0], o[1], o[2], s, e), np.stack([fs, fe], axis=1), n,
                         given=(RUN, 0, 0))


def learn_anchors(timeline: Timeline, path: np.ndarray, gt: dict, landmark: str, n: int) -> list:
    """Up to `n` (offset, length) from the decoded boundary that `landmark` marks, matching its
    ground-truth events in the most tuning videos (`_greedy_cover`)."""
    if n == 0:
        return []
    crossings = boundaries(path, REGIONS.index(LANDMARKS[landmark][1]))
    crossing_of = {}
    for v, c in zip(video_of(timeline, crossings).tolist(), crossings.tolist()):
        crossing_of.setdefault(timeline.video_ids[v], int(timeline.time[c]))
    rows = []  # (boundary, event start, event end)
    for video in gt["videos"]:
        at = crossing_of.get(str(video["video_id"]))
        if at is not None:
            rows += [(at, e["start"], e["end"]) for e in video["events"] if landmark in e["label"]]
    if not rows:
        return []
    table = np.array(rows, np.int64)
    options = np.unique(np.stack([table[:, 1] - table[:, 0], table[:, 2] - table[:, 1] + 1], axis=1), axis=0)
    return _greedy_cover(options, lambda o: (table[:, 0] + o[0], table[:, 0] + o[0] + o[1] - 1), table[:, 1:], n)


def _greedy_cover(options: np.ndarray, predict, truth: np.ndarray, n: int, given=None) -> list:
    """Up to `n` options, each the one whose prediction matches (tIoU >= 0.5 and >= 0.95, both
    counted) the most ground-truth spans not matched yet (two at least at one threshold), after the spans
    that the `given` option (ranked before them all) matches."""
    unmatched = {t: np.ones(len(truth), bool) for t in THRESHOLDS}
    matches: dict = {}  # option -> {t: (F,) its prediction's tIoU >= t}: the same every round

    def hits_of(option):
        if option not in matches:
            a, b = predict(option)  # (F,) predicted span per ground-truth span
            inter = np.maximum(0, np.minimum(b, truth[:, 1]) - np.maximum(a, truth[:, 0]) + 1)
            iou = inter / np.maximum((b - a + 1) + (truth[:, 1] - truth[:, 0] + 1) - inter, 1)
            matches[option] = {t: iou >= t for t in THRESHOLDS}
        return {t: matches[option][t] & unmatched[t] for t in THRESHOLDS}

    if given is not None:
        for t, hits in hits_of(given).items():
            unmatched[t] &= ~hits
    chosen, options = [], [tuple(o) for o in options if given is None or tuple(o) != tuple(given)]
    while len(chosen) < n and options:
        best, best_value, best_hits = None, 0, None
        for option in options:
            hits = hits_of(option)
            value = sum(int(h.sum()) for h in hits.values())
            if value > best_value and max(int(h.sum()) for h in hits.values()) >= 2:
                best, best_value, best_hits = option, value, hits
        if best is None:
            break
        chosen.append([int(x) for x in best])
        options.remove(best)
        for t in THRESHOLDS:
            unmatched[t] &= ~best_hits[t]
    return chosen
