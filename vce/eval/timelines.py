"""Event timelines that show what the metric scores: ground-truth fragments, matches, probabilities.

The official ground truth starts a new event whenever the *set* of active labels changes, so
one colon passage with a few findings inside is many colon events ("fragments"), and every
fragment must be matched on its own (tIoU >= 0.5, or >= 0.95). A timeline that merged them
into one bar would hide what `vce.eval.score` punishes. Here each label row shows:

- the ground-truth fragments, with a dark tick at every boundary where one fragment touches
  the next (invisible in a merged bar);
- the predicted events twice, coloured true/false positive by the official greedy matching at
  tIoU 0.5 (upper strip) and at 0.95 (lower strip), true positives drawn over the false ones, a
  white gap where two of them touch;
- the frame probability trace with the label's threshold (dashed; none when the label is off);
- on the right, the row's temporal AP at both tIoUs and its event counts.

`row_matches` replays the official matching (REFERENCE.md "The official metric", as in
`vce.eval.score_reference.average_precision`): each prediction in file order takes the first
unmatched ground-truth segment, in file order, whose tIoU reaches the threshold. Its AP per
row averages to `vce.eval.score.score`'s per-video mAP (tests hold them equal).
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
from PIL import Image

from vce.core.io import atomic_path
from vce.core.labels import LABELS, NUM_LABELS
from vce.eval.score import THRESHOLDS

GT_COLOR = "#2b8a3e"  # ground-truth fragments: green
BOUNDARY_COLOR = "#212529"  # fragment boundaries: near black
TP_COLOR = "#1971c2"  # matched prediction: blue
FP_COLOR = "#f08c00"  # unmatched prediction: orange
TRACE_COLOR = "#495057"  # probability trace: grey
THRESHOLD_COLOR = "#c92a2a"  # threshold: red, dashed

# Event time axis per `event_unit` (vce.post.timeline.event_time).
UNIT_AXIS = {
    "index": "event time = CSV `index` (row number of the Galar label file; the file frame number is not used)",
    "frame": "event time = file frame number (RARE-VISION test layout)",
}


@dataclass
class RowMatches:
    """One (video, label) row: segments in file order and, per tIoU, 1/0 per prediction."""

    label: str
    gt: list[tuple[int, int]]
    pred: list[tuple[int, int]]
    hits: dict[float, list[int]]
    ap: dict[float, float]


def _segments(submission: dict, video_id: str) -> dict[str, list[tuple[int, int]]]:
    """label -> [(start, end), ...] of one video in file order; an event counts once per label."""
    segments: dict[str, list[tuple[int, int]]] = {label: [] for label in LABELS}
    for video in submission["videos"]:
        if str(video["video_id"]) == str(video_id):
            for event in video["events"]:
                for label in event["label"]:
                    segments[label].append((int(event["start"]), int(event["end"])))
    return segments


def greedy_hits(gt: list[tuple[int, int]], pred: list[tuple[int, int]], threshold: float) -> list[int]:
    """The official matching: 1 where a prediction (file order) takes the first free GT with tIoU >= thr."""
    if not gt:
        return [0] * len(pred)
    gt_start = np.array([s for s, _ in gt], dtype=np.int64)
    gt_end = np.array([e for _, e in gt], dtype=np.int64)
    free = np.ones(len(gt), dtype=bool)
    hits = []
    for start, end in pred:
        intersection = np.maximum(0, np.minimum(end, gt_end) - np.maximum(start, gt_start) + 1)
        union = (end - start + 1) + (gt_end - gt_start + 1) - intersection
        candidates = np.flatnonzero(free & (intersection / union >= threshold))
        if len(candidates):
            free[candidates[0]] = False
        hits.append(int(len(candidates) > 0))
    return hits


def ranked_hits_ap(hits: list[int], n_gt: int, n_pred: int) -> float:
    """The official AP of predictions in file order from their `greedy_hits`: sum_k precision@k *
    (recall@k - recall@k-1); no ground truth: 1 if nothing predicted, else 0."""
    if n_gt == 0:
        return 0.0 if n_pred else 1.0
    true_positives = np.cumsum(hits)
    precision = true_positives / np.arange(1, len(hits) + 1)
    return float((precision * np.asarray(hits) / n_gt).sum())


def row_matches(gt: dict, prediction: dict, video_id: str) -> list[RowMatches]:
    """The 17 rows of one video (LABELS order) with the official matching at both tIoUs."""
    gt_segments, pred_segments = _segments(gt, video_id), _segments(prediction, video_id)
    rows = []
    for label in LABELS:
        g, p = gt_segments[label], pred_segments[label]
        hits = {threshold: greedy_hits(g, p, threshold) for threshold in THRESHOLDS}
        rows.append(RowMatches(label, g, p, hits,
                               {threshold: ranked_hits_ap(hits[threshold], len(g), len(p)) for threshold in THRESHOLDS}))
    return rows


def fragment_boundaries(segments: list[tuple[int, int]]) -> list[int]:
    """Start times of fragments that touch the previous one (start == previous end + 1)."""
    ordered = sorted(segments)
    return [start for (_, prev_end), (start, _) in zip(ordered, ordered[1:]) if start == prev_end + 1]


def merged_runs(segments: list[tuple[int, int]]) -> int:
    """How many bars the fragments make once touching or overlapping ones are merged."""
    runs, last_end = 0, None
    for start, end in sorted(segments):
        if last_end is None or start > last_end + 1:
            runs += 1
        last_end = end if last_end is None else max(last_end, end)
    return runs


def _palette() -> Image.Image:
    """A "P" image whose palette is every drawing colour at 16 blends towards white, plus greys."""
    colours = [GT_COLOR, BOUNDARY_COLOR, TP_COLOR, FP_COLOR, TRACE_COLOR, THRESHOLD_COLOR, "#ced4da", "#000000"]
    entries = []
    for colour in colours:
        rgb = np.array([int(colour[i:i + 2], 16) for i in (1, 3, 5)], dtype=np.float64)
        entries += [np.round(rgb + (255.0 - rgb) * k / 16) for k in range(16)]
    entries += [np.full(3, v) for v in np.linspace(0, 255, 256 - len(entries))]
    palette = Image.new("P", (1, 1))
    palette.putpalette(np.clip(entries, 0, 255).astype(np.uint8).ravel().tolist())
    return palette


def plot_timeline(
    path,
    rows: list[RowMatches],
    trace_t: np.ndarray,
    trace_probs: np.ndarray,
    thresholds: dict,
    time_range: tuple[int, int],
    unit: str,
    title: str,
    width: float = 12.0,
    dpi: int = 100,
) -> dict:
    """Draw one video's timeline PNG; return the counts of what was drawn.

    rows: `row_matches(...)`; trace_t (N,) event times and trace_probs (N, 17) probabilities of
    the video's frames (NaN = invalid frame, a gap in the trace); thresholds: label -> value
    (> 1 = off, no line). Returns {"boundaries", "tp@0.5", "fp@0.5", "tp@0.95", "fp@0.95",
    "gt_fragments"} summed over the rows.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    first, last = time_range
    row_inches = 0.6
    fig, ax = plt.subplots(figsize=(width, 1.5 + row_inches * NUM_LABELS), dpi=dpi)
    min_width = (last - first + 1) / (width * dpi)  # one pixel, in time units: one-frame events stay visible
    drawn = {"boundaries": 0, "gt_fragments": 0, **{f"{kind}@{t}": 0 for t in THRESHOLDS for kind in ("tp", "fp")}}
    order = np.argsort(trace_t, kind="stable")
    trace_t, trace_probs = np.asarray(trace_t)[order], np.asarray(trace_probs, dtype=np.float64)[order]

    def bars(segments, bottom, height, colors):
        if segments:
            ax.broken_barh([(s, max(e + 1 - s, min_width)) for s, e in segments], (bottom, height),
                           facecolors=colors, linewidth=0)

    right_labels = []
    for k, row in enumerate(rows):
        y = NUM_LABELS - 1 - k  # first label on top; the row spans [y, y + 1]
        # 1. Ground-truth fragments and the boundaries between touching ones.
        bars(row.gt, y + 0.74, 0.20, GT_COLOR)
        boundaries = fragment_boundaries(row.gt)
        if boundaries:
            ax.vlines(boundaries, y + 0.71, y + 0.97, colors=BOUNDARY_COLOR, linewidth=1.0)
        drawn["boundaries"] += len(boundaries)
        drawn["gt_fragments"] += len(row.gt)
        # 2. Predictions, coloured by the official matching at each tIoU: false positives first,
        # true positives over them (a metric-optimal submission stacks candidates on one span,
        # and a TP drawn in file order under its later FP candidates would not show).
        for threshold, bottom in zip(THRESHOLDS, (y + 0.60, y + 0.47)):
            hits = row.hits[threshold]
            bars([seg for seg, hit in zip(row.pred, hits) if not hit], bottom, 0.11, FP_COLOR)
            bars([seg for seg, hit in zip(row.pred, hits) if hit], bottom, 0.11, TP_COLOR)
            drawn[f"tp@{threshold}"] += sum(hits)
            drawn[f"fp@{threshold}"] += len(hits) - sum(hits)
        touching = fragment_boundaries(row.pred)  # adjacent predicted events: a white gap keeps them apart
        if touching:
            ax.vlines(touching, y + 0.47, y + 0.71, colors="white", linewidth=1.0)
        # 3. Probability trace in the row's bottom band, threshold dashed.
        band_low, band_height = y + 0.04, 0.38
        ax.plot(trace_t, band_low + band_height * trace_probs[:, k], color=TRACE_COLOR, linewidth=0.7)
        threshold = float(thresholds[row.label])
        if threshold <= 1.0:
            ax.hlines(band_low + band_height * threshold, first, last + 1, colors=THRESHOLD_COLOR,
                      linewidth=0.7, linestyles=(0, (3, 2)))
        ax.axhline(y, color="#ced4da", linewidth=0.6)
        right_labels.append(f"{row.ap[0.5]:.2f} / {row.ap[0.95]:.2f}   {len(row.gt)} / {len(row.pred)}")
    ax.set_ylim(0, NUM_LABELS)
    ax.set_xlim(first, last + 1)
    left_labels = [f"{row.label}  (thr {'off' if float(thresholds[row.label]) > 1.0 else f'{thresholds[row.label]:.2f}'})"
                   for row in rows]
    ax.set_yticks(np.arange(NUM_LABELS) + 0.5, labels=list(reversed(left_labels)), fontsize=8)
    ax.tick_params(axis="y", length=0)
    right = ax.twinx()
    right.set_ylim(0, NUM_LABELS)
    right.set_yticks(np.arange(NUM_LABELS) + 0.5, labels=list(reversed(right_labels)), fontsize=7.5)
    right.tick_params(axis="y", length=0)
    right.set_ylabel("row tAP @0.5 / @0.95     ground-truth fragments / predicted events", fontsize=8)
    ax.set_xlabel(UNIT_AXIS.get(unit, f"event time ({unit})"), fontsize=8)
    ax.tick_params(axis="x", labelsize=8)
    ax.set_title(title, fontsize=10, loc="left", pad=22)
    ax.legend(handles=[Patch(color=GT_COLOR, label="ground-truth fragment (top)"),
                       Line2D([], [], color=BOUNDARY_COLOR, label="fragment boundary"),
                       Patch(color=TP_COLOR, label="prediction TP"),
                       Patch(color=FP_COLOR, label="prediction FP (strips: tIoU 0.5, then 0.95)"),
                       Line2D([], [], color=TRACE_COLOR, label="probability (bottom band, 0 to 1)"),
                       Line2D([], [], color=THRESHOLD_COLOR, linestyle=(0, (3, 2)), label="threshold")],
              loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=6, fontsize=7.5, frameon=False,
              borderaxespad=0.2, handlelength=1.5, columnspacing=1.0)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    plt.close(fig)
    # A fixed palette (every colour drawn, blended towards white) keeps each colour exact, even a
    # rare one an adaptive palette would drop, and cuts the git-tracked PNG to about a quarter.
    image = Image.open(buffer).convert("RGB").quantize(palette=_palette(), dither=Image.Dither.NONE)
    with atomic_path(path) as tmp:
        image.save(tmp, format="png", optimize=True)
    return drawn
