"""Plot data and figures of the validation results: curves, the per-class table, event timelines.

- `pr_curves` / `roc_curves`: per-label precision-recall and ROC points on validation frames
  (scikit-learn), thinned to at most `max_points` per label so the git-tracked CSVs stay small.
- `per_class_table`: support, AP, ROC AUC, threshold, F1 at the threshold and temporal
  AP@0.5/0.95 per label: one row per label, readable by `dvc plots` and by people.
- `plot_timeline`: one PNG per video, a row per label, ground-truth events above the predicted
  ones on the event-time axis (matplotlib, Agg backend: no display needed).
- `write_offline_template`: an HTML template for `dvc plots show --html-template` with vega,
  vega-lite and vega-embed inlined (DVC's own page loads them from a CDN), taken from the
  PyPI package `django-js-lib-vega-embed` (plain JS files, no dependencies).
  CLI: ``python -m vce.eval.plots offline-template [OUT]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.metrics import precision_recall_curve, roc_curve

from vce.core.errors import DataError
from vce.core.io import atomic_path, write_text
from vce.core.labels import LABELS, NUM_LABELS

GT_COLOR = "#2b8a3e"  # ground truth: green
PRED_COLOR = "#c92a2a"  # prediction: red


def label_slug(label: str) -> str:
    """A file-name-safe form of a label ("small intestine" -> "small_intestine")."""
    return re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_")


def _check_arrays(y_true, y_prob, where: str) -> tuple[np.ndarray, np.ndarray]:
    """(N, 17) int labels and float probabilities of the rows whose probabilities are all finite."""
    y_true = np.asarray(y_true)
    y_prob = np.asarray(y_prob, dtype=np.float64)
    if y_true.shape != y_prob.shape or y_true.ndim != 2 or y_true.shape[1] != NUM_LABELS:
        raise ValueError(f"{where}: expected two (N, {NUM_LABELS}) arrays, got {y_true.shape} and {y_prob.shape}")
    valid = np.isfinite(y_prob).all(axis=1)
    return y_true[valid].astype(np.int64), y_prob[valid]


# ----------------------------------------------------------------------------- curves


def thin_indices(n: int, max_points: int) -> np.ndarray:
    """At most `max_points` indices of 0..n-1, evenly spread, always keeping the first and last."""
    if n <= max_points:
        return np.arange(n)
    return np.unique(np.round(np.linspace(0, n - 1, max_points)).astype(np.int64))


def pr_curves(y_true, y_prob, max_points: int = 200) -> dict[str, pd.DataFrame]:
    """label -> DataFrame(recall, precision), for labels with at least one positive frame."""
    y_true, y_prob = _check_arrays(y_true, y_prob, "pr_curves")
    curves = {}
    for k, label in enumerate(LABELS):
        if not y_true[:, k].any():
            continue  # precision-recall is undefined without positives
        precision, recall, _ = precision_recall_curve(y_true[:, k], y_prob[:, k])
        keep = thin_indices(len(recall), max_points)
        curves[label] = pd.DataFrame({"recall": recall[keep], "precision": precision[keep]})
    return curves


def roc_curves(y_true, y_prob, max_points: int = 200) -> dict[str, pd.DataFrame]:
    """label -> DataFrame(fpr, tpr), for labels with positive and negative frames."""
    y_true, y_prob = _check_arrays(y_true, y_prob, "roc_curves")
    curves = {}
    for k, label in enumerate(LABELS):
        positives = int(y_true[:, k].sum())
        if positives == 0 or positives == len(y_true):
            continue  # ROC is undefined with a single class
        fpr, tpr, _ = roc_curve(y_true[:, k], y_prob[:, k])
        keep = thin_indices(len(fpr), max_points)
        curves[label] = pd.DataFrame({"fpr": fpr[keep], "tpr": tpr[keep]})
    return curves


def long_curves(curves: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One long table (label first) of per-label curves."""
    if not curves:
        return pd.DataFrame(columns=["label"])
    return pd.concat([frame.assign(label=label)[["label", *frame.columns]] for label, frame in curves.items()],
                     ignore_index=True)


# ----------------------------------------------------------------------------- per-class table


def f1_at(y_true: np.ndarray, y_prob: np.ndarray, threshold: float) -> float | None:
    """Frame F1 when a frame fires at prob >= threshold; None when there is nothing to score (0/0)."""
    fired = y_prob >= threshold
    true_positives = int((fired & (y_true == 1)).sum())
    denominator = int(fired.sum()) + int(y_true.sum())
    return 2 * true_positives / denominator if denominator else None


def per_class_table(y_true, y_prob, thresholds: dict, frame_result: dict, score_result: dict) -> pd.DataFrame:
    """One row per label: support, ap, auc, threshold, f1, tap@0.5, tap@0.95.

    `frame_result` is `vce.frame_metrics.frame_metrics(y_true, y_prob)`, `score_result`
    `vce.score.score(gt, prediction)`; missing values (AP without positives, F1 0/0) are NaN.
    """
    y_true, y_prob = _check_arrays(y_true, y_prob, "per_class_table")
    rows = []
    for k, label in enumerate(LABELS):
        metrics = frame_result["per_label"][label]
        threshold = float(thresholds[label])
        rows.append({
            "label": label,
            "support": int(metrics["support"]),
            "ap": metrics["ap"],
            "auc": metrics["auc"],
            "threshold": threshold,
            "f1": f1_at(y_true[:, k], y_prob[:, k], threshold),
            "tap@0.5": score_result["per_label@0.5"][label],
            "tap@0.95": score_result["per_label@0.95"][label],
        })
    return pd.DataFrame(rows).astype({"ap": float, "auc": float, "f1": float})


# ----------------------------------------------------------------------------- timelines


def video_events(submission: dict, video_id: str) -> dict[str, list[tuple[int, int]]]:
    """label -> [(start, end), ...] of one video of an official events JSON (end inclusive)."""
    events: dict[str, list[tuple[int, int]]] = {label: [] for label in LABELS}
    for video in submission["videos"]:
        if str(video["video_id"]) != str(video_id):
            continue
        for event in video["events"]:
            for label in event["label"]:
                events[label].append((int(event["start"]), int(event["end"])))
    return events


def plot_timeline(
    path,
    gt_events: dict,
    pred_events: dict,
    time_range: tuple[int, int],
    title: str,
    width: float = 12.0,
    dpi: int = 100,
) -> None:
    """One PNG: a row per label (LABELS order, top to bottom), ground truth above, prediction below.

    Events are drawn as bars from start to end + 1 (end inclusive) on the event-time axis
    `time_range` (first, last); an event of one frame stays visible at any video length because
    bars get a minimum width of one pixel's worth of time.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    first, last = time_range
    row_height = 0.32  # inches per label row
    height = 1.2 + row_height * NUM_LABELS
    fig, ax = plt.subplots(figsize=(width, height), dpi=dpi)
    min_width = (last - first + 1) / (width * dpi)  # one pixel, in time units
    for row, label in enumerate(LABELS):
        y = NUM_LABELS - 1 - row  # first label on top
        for events, bottom, color in ((gt_events, y + 0.52, GT_COLOR), (pred_events, y + 0.12, PRED_COLOR)):
            bars = [(start, max(end + 1 - start, min_width)) for start, end in events.get(label, [])]
            if bars:
                ax.broken_barh(bars, (bottom, 0.36), facecolors=color, linewidth=0)
        ax.axhline(y, color="#dee2e6", linewidth=0.6)
    ax.set_ylim(0, NUM_LABELS)
    ax.set_xlim(first, last + 1)
    ax.set_yticks(np.arange(NUM_LABELS) + 0.5, labels=list(reversed(LABELS)), fontsize=8)
    ax.tick_params(axis="y", length=0)
    ax.set_xlabel("event time (frame index)", fontsize=8)
    ax.tick_params(axis="x", labelsize=8)
    ax.set_title(title, fontsize=10, loc="left")
    ax.legend(handles=[Patch(color=GT_COLOR, label="ground truth (upper bar)"),
                       Patch(color=PRED_COLOR, label="prediction (lower bar)")],
              loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=2, fontsize=8, frameon=False, borderaxespad=0.2)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=dpi)
    plt.close(fig)


# ----------------------------------------------------------------------------- offline dvc plots page

OFFLINE_JS_PACKAGE = "js_lib_vega_embed"  # PyPI: django-js-lib-vega-embed (vega 5, vega-lite 5, vega-embed 6)
OFFLINE_JS_FILES = ("vega5.js", "vega-lite5.js", "vega-embed6.js")  # load order: vega-lite and embed need vega

OFFLINE_PAGE = """<!DOCTYPE html>
<html>
<head>
    {refresh_tag}
    <meta charset="utf-8">
    <title>DVC Plot (offline)</title>
    <!-- No scripts placeholder: DVC would insert its CDN links there; vega, vega-lite and
         vega-embed are inlined below instead. -->
    {inline_scripts}
    <style>
        table { border-spacing: 15px; }
    </style>
</head>
<body>
    {plot_divs}
</body>
</html>
"""


def vega_js_dir() -> Path:
    """The folder of the vega JS files shipped by `django-js-lib-vega-embed`, or a clear error."""
    spec = importlib.util.find_spec(OFFLINE_JS_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"python package {OFFLINE_JS_PACKAGE} not found: `pip install django-js-lib-vega-embed` "
            "(it ships the vega, vega-lite and vega-embed JS files)"
        )
    return Path(list(spec.submodule_search_locations)[0]) / "static" / OFFLINE_JS_PACKAGE


def offline_template(js_dir: Path | None = None) -> str:
    """A `dvc plots show --html-template` page with vega, vega-lite and vega-embed inlined."""
    js_dir = Path(js_dir) if js_dir is not None else vega_js_dir()
    scripts = []
    for name in OFFLINE_JS_FILES:
        path = js_dir / name
        if not path.is_file():
            raise FileNotFoundError(f"vega JS file not found: {path}")
        code = path.read_text(encoding="utf8")
        # DVC fills the page with str.replace on these placeholders; the JS must not contain them.
        for placeholder in ("{plot_divs}", "{scripts}", "{refresh_tag}"):
            if placeholder in code:
                raise DataError(f"{path} contains the DVC placeholder {placeholder}")
        code = code.replace("</script", "<\\/script")
        scripts.append(f"<script type=\"text/javascript\">/* {name} */\n{code}\n</script>")
    return OFFLINE_PAGE.replace("{inline_scripts}", "\n".join(scripts))


def write_offline_template(out, js_dir: Path | None = None) -> Path:
    write_text(out, offline_template(js_dir))
    return Path(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vce.eval.plots", description="Plot helpers.")
    commands = parser.add_subparsers(dest="command", required=True)
    template = commands.add_parser("offline-template", help="write an offline HTML template for `dvc plots show`")
    template.add_argument("out", nargs="?", default="dvc_plots/offline_template.html")
    template.add_argument("--js-dir", default=None, help="folder with vega5.js, vega-lite5.js, vega-embed6.js")
    args = parser.parse_args(argv)
    try:
        out = write_offline_template(args.out, args.js_dir)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {out}: dvc plots show --html-template {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
