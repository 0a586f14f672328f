"""The official RARE-VISION temporal mAP, transcribed directly from its definition.

Quadratic and slow on purpose: it is the yardstick that tests and `bench/score.py` hold the fast
scorer (`vce.score.score`) against. The steps follow REFERENCE.md "The official metric" and the
challenge's evaluator:

1. Per video and label, the ground-truth and predicted segments in file order (an event with
   several labels counts once for each label).
2. tIoU counts frames inclusively.
3. Each prediction, in file order, takes the first not-yet-matched ground-truth segment (in
   ground-truth order) whose tIoU >= threshold.
4. AP = sum_k precision@k * (recall@k - recall@k-1); no ground truth: 1 if nothing predicted,
   else 0.
5. Per-video mAP = mean over the 17 labels; overall = mean over videos.

As in the official evaluator, the videos averaged are those of the ground truth that hold at
least one labelled event (a ground-truth video without events adds nothing to the mean), and
predicted videos absent from the ground truth are ignored.
"""

from __future__ import annotations

import copy
import random

from vce.core.labels import LABELS

THRESHOLDS = (0.5, 0.95)


def tiou(a: tuple[int, int], b: tuple[int, int]) -> float:
    intersection = max(0, min(a[1], b[1]) - max(a[0], b[0]) + 1)
    union = (a[1] - a[0] + 1) + (b[1] - b[0] + 1) - intersection
    return intersection / union if union > 0 else 0.0


def segments_by_video_label(sub: dict) -> dict:
    """{video_id: {label: [(start, end), ...]}} in file order; videos without events are absent."""
    out: dict = {}
    for video in sub["videos"]:
        for event in video["events"]:
            for label in event["label"]:
                out.setdefault(video["video_id"], {}).setdefault(label, []).append(
                    (event["start"], event["end"])
                )
    return out


def average_precision(gt_segs: list, pred_segs: list, threshold: float) -> float:
    matched: set[int] = set()
    hits = []
    for pred in pred_segs:
        hit = 0
        for i, gt_seg in enumerate(gt_segs):
            if i not in matched and tiou(pred, gt_seg) >= threshold:
                matched.add(i)
                hit = 1
                break
        hits.append(hit)
    if not gt_segs:
        return 0.0 if pred_segs else 1.0
    ap, true_positives, previous_recall = 0.0, 0, 0.0
    for k, hit in enumerate(hits, start=1):
        true_positives += hit
        recall = true_positives / len(gt_segs)
        ap += (true_positives / k) * (recall - previous_recall)
        previous_recall = recall
    return ap


def score_reference(gt: dict, pred: dict) -> dict:
    """Same keys as `vce.score.score`, computed the slow, obvious way."""
    gt_segs = segments_by_video_label(gt)
    pred_segs = segments_by_video_label(pred)
    result: dict = {}
    for threshold in THRESHOLDS:
        per_video, per_label = {}, {label: [] for label in LABELS}
        for video_id, gt_labels in gt_segs.items():
            pred_labels = pred_segs.get(video_id, {})
            aps = []
            for label in LABELS:
                ap = average_precision(gt_labels.get(label, []), pred_labels.get(label, []), threshold)
                per_label[label].append(ap)
                aps.append(ap)
            per_video[video_id] = sum(aps) / len(aps)
        result[f"map@{threshold}"] = sum(per_video.values()) / len(per_video) if per_video else 0.0
        result[f"per_video@{threshold}"] = per_video
        result[f"per_label@{threshold}"] = {
            label: (sum(v) / len(v) if v else 0.0) for label, v in per_label.items()
        }
    return result


def shifted_submission(gt: dict, seed: int, shuffle: bool = False) -> dict:
    """`gt` with every event moved by -2, -1, +1 or +2 frames (optionally reordered per video):
    a realistic, imperfect prediction for comparing scorers on real timelines."""
    rng = random.Random(seed)
    pred = copy.deepcopy(gt)
    for video in pred["videos"]:
        for event in video["events"]:
            shift = rng.choice([-2, -1, 1, 2])
            event["start"] += shift
            event["end"] += shift
        if shuffle:
            rng.shuffle(video["events"])
    return pred
