"""Plot data of the validation results for `dvc plots`: curves, per-class and per-video tables.

- `pr_curves` / `roc_curves`: per-label precision-recall and ROC points on validation frames
  (scikit-learn), thinned to at most `max_points` per label so the git-tracked CSVs stay small.
- `curve_table`: those curves as one long table for the `label_curves` DVC template
  (.dvc/plots/): per label the curve, the chance baseline (PR: the prevalence; ROC: the
  diagonal), the point at the chosen threshold, and a summary ("AP 0.981") for the legend.
- `per_class_table`: support, AP, ROC AUC, threshold, F1 at the threshold and temporal
  AP@0.5/0.95 per label: one row per label, readable by `dvc plots` and by people.
- `write_offline_template`: an HTML template for `dvc plots show --html-template` with vega,
  vega-lite and vega-embed inlined (DVC's own page loads them from a CDN), taken from the
  PyPI package `django-js-lib-vega-embed` (plain JS files, no dependencies).
  CLI: ``python -m vce.eval.plots offline-template [OUT]``.

The event timelines are `vce.eval.timelines`.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.metrics import average_precision_score, precision_recall_curve, roc_auc_score, roc_curve

from vce.core.errors import DataError
from vce.core.io import write_text
from vce.core.labels import LABELS, NUM_LABELS


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


def _point_at(y_true: np.ndarray, y_prob: np.ndarray, threshold: float) -> tuple[float, float, float] | None:
    """(recall = TPR, precision, FPR) of one label when frames fire at prob >= threshold; None when off."""
    fired = y_prob >= threshold
    if threshold > 1.0 or not fired.any():
        return None
    positives, negatives = int(y_true.sum()), int((y_true == 0).sum())
    true_positives = int((fired & (y_true == 1)).sum())
    recall = true_positives / positives if positives else 0.0
    fpr = int((fired & (y_true == 0)).sum()) / negatives if negatives else 0.0
    return recall, true_positives / int(fired.sum()), fpr


def curve_table(kind: str, y_true, y_prob, thresholds: dict, max_points: int = 200) -> pd.DataFrame:
    """The PR (`kind="pr"`) or ROC (`"roc"`) curves of every defined label as one long table.

    Columns: order (label position, to sort the panels), label, kind (curve | chance |
    threshold), i (point order along the curve), the two axes (recall, precision / fpr, tpr)
    and summary ("AP 0.981, chance 0.046" / "AUC 0.990"), shown in each panel's legend.
    """
    y_true, y_prob = _check_arrays(y_true, y_prob, "curve_table")
    curves = pr_curves(y_true, y_prob, max_points) if kind == "pr" else roc_curves(y_true, y_prob, max_points)
    x_name, y_name = ("recall", "precision") if kind == "pr" else ("fpr", "tpr")
    parts = []
    for label, curve in curves.items():
        k = LABELS.index(label)
        truth, probs = y_true[:, k], y_prob[:, k]
        prevalence = float(truth.mean())
        if kind == "pr":
            summary = f"AP {average_precision_score(truth, probs):.3f}, chance {prevalence:.3f}"
            chance = [(0.0, prevalence), (1.0, prevalence)]
        else:
            summary = f"AUC {roc_auc_score(truth, probs):.3f}"
            chance = [(0.0, 0.0), (1.0, 1.0)]
        point = _point_at(truth, probs, float(thresholds[label]))
        marks = [] if point is None else [(point[0], point[1]) if kind == "pr" else (point[2], point[0])]
        rows = ([("curve", i, x, y) for i, (x, y) in enumerate(zip(curve[x_name], curve[y_name]))]
                + [("chance", i, x, y) for i, (x, y) in enumerate(chance)]
                + [("threshold", 0, x, y) for x, y in marks])
        part = pd.DataFrame(rows, columns=["kind", "i", x_name, y_name])
        part.insert(0, "label", label)
        part.insert(0, "order", k)
        part["summary"] = summary
        parts.append(part)
    columns = ["order", "label", "kind", "i", x_name, y_name, "summary"]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=columns)


# ----------------------------------------------------------------------------- per-class table


def f1_at(y_true: np.ndarray, y_prob: np.ndarray, threshold: float) -> float | None:
    """Frame F1 when a frame fires at prob >= threshold; None when there is nothing to score (0/0)."""
    fired = y_prob >= threshold
    true_positives = int((fired & (y_true == 1)).sum())
    denominator = int(fired.sum()) + int(y_true.sum())
    return 2 * true_positives / denominator if denominator else None


def per_class_table(y_true, y_prob, thresholds: dict, frame_result: dict, score_result: dict) -> pd.DataFrame:
    """One row per label: support, ap, auc, threshold, f1, tap@0.5, tap@0.95.

    `frame_result` is `vce.eval.frame_metrics.frame_metrics(y_true, y_prob)`, `score_result`
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
