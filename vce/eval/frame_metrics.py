"""Frame-level validation metrics per label: support, average precision, ROC AUC (scikit-learn).

These are the numbers the seed system reported per class (REFERENCE.md); they say how well
frames are ranked, not how the events score (that is `vce.eval.score`).
"""

from __future__ import annotations

import numpy as np
from sklearn.metrics import average_precision_score, roc_auc_score

from vce.core.labels import LABELS, NUM_LABELS


def frame_metrics(y_true: np.ndarray, y_prob: np.ndarray) -> dict:
    """Per-label {"support", "ap", "auc"} (None where undefined) plus "map" and "mean_auc".

    y_true: (N, 17) 0/1; y_prob: (N, 17) probabilities. Rows with a NaN probability (invalid
    frames) are left out. AP and AUC are undefined for a label with no positive frame, AUC also
    for a label with no negative frame; the means run over the labels where they are defined.
    """
    y_true = np.asarray(y_true)
    y_prob = np.asarray(y_prob, dtype=np.float64)
    if y_true.shape != y_prob.shape or y_true.ndim != 2 or y_true.shape[1] != NUM_LABELS:
        raise ValueError(f"frame_metrics: expected two (N, {NUM_LABELS}) arrays, got {y_true.shape} and {y_prob.shape}")
    valid = np.isfinite(y_prob).all(axis=1)
    y_true, y_prob = y_true[valid].astype(np.int64), y_prob[valid]
    per_label = {}
    for k, label in enumerate(LABELS):
        positives = int(y_true[:, k].sum())
        negatives = len(y_true) - positives
        ap = float(average_precision_score(y_true[:, k], y_prob[:, k])) if positives else None
        auc = float(roc_auc_score(y_true[:, k], y_prob[:, k])) if positives and negatives else None
        per_label[label] = {"support": positives, "ap": ap, "auc": auc}
    aps = [m["ap"] for m in per_label.values() if m["ap"] is not None]
    aucs = [m["auc"] for m in per_label.values() if m["auc"] is not None]
    return {
        "per_label": per_label,
        "map": float(np.mean(aps)) if aps else None,
        "mean_auc": float(np.mean(aucs)) if aucs else None,
        "frames": int(len(y_true)),
    }
