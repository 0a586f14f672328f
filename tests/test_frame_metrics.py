import numpy as np
import pytest
from sklearn.metrics import average_precision_score, roc_auc_score

from vce.core.labels import LABELS, NUM_LABELS
from vce.eval.frame_metrics import frame_metrics


def test_frame_metrics_per_label_and_means():
    rng = np.random.default_rng(0)
    y_true = (rng.random((400, NUM_LABELS)) < 0.2).astype(np.uint8)
    y_true[:, 5] = 0  # z-line: no positives -> undefined
    y_true[:, 6] = 1  # pylorus: no negatives -> AUC undefined, AP = 1
    y_prob = np.clip(y_true * 0.3 + rng.random((400, NUM_LABELS)) * 0.7, 0, 1)
    y_prob[:, 0] = y_true[:, 0]  # mouth separated perfectly
    metrics = frame_metrics(y_true, y_prob)
    mouth = metrics["per_label"]["mouth"]
    assert mouth == {"support": int(y_true[:, 0].sum()), "ap": 1.0, "auc": 1.0}
    assert metrics["per_label"]["z-line"] == {"support": 0, "ap": None, "auc": None}
    assert metrics["per_label"]["pylorus"]["auc"] is None and metrics["per_label"]["pylorus"]["ap"] == 1.0
    blood = LABELS.index("blood")
    assert metrics["per_label"]["blood"]["ap"] == pytest.approx(average_precision_score(y_true[:, blood], y_prob[:, blood]))
    assert metrics["per_label"]["blood"]["auc"] == pytest.approx(roc_auc_score(y_true[:, blood], y_prob[:, blood]))
    aps = [m["ap"] for m in metrics["per_label"].values() if m["ap"] is not None]
    assert len(aps) == 16 and metrics["map"] == pytest.approx(np.mean(aps))
    aucs = [m["auc"] for m in metrics["per_label"].values() if m["auc"] is not None]
    assert len(aucs) == 15 and metrics["mean_auc"] == pytest.approx(np.mean(aucs))


def test_frame_metrics_ignores_invalid_rows_and_checks_shapes():
    y_true = np.zeros((4, NUM_LABELS), np.uint8)
    y_true[0, 0] = 1
    y_prob = np.zeros((4, NUM_LABELS))
    y_prob[0, 0] = 0.9
    y_prob[3] = np.nan
    metrics = frame_metrics(y_true, y_prob)
    assert metrics["frames"] == 3 and metrics["per_label"]["mouth"]["auc"] == 1.0
    with pytest.raises(ValueError, match=r"\(N, 17\)"):
        frame_metrics(y_true[:, :3], y_prob[:, :3])
    with pytest.raises(ValueError, match=r"got \(4, 17\) and \(3, 17\)"):  # rows that do not pair up
        frame_metrics(y_true, y_prob[:3])
    with pytest.raises(ValueError, match=r"got \(17,\) and \(17,\)"):  # one frame, not a table
        frame_metrics(y_true[0], y_prob[0])
