"""The official RARE-VISION temporal mAP, exactly and fast; and the official sanity checks.

`score(gt, pred)` gives the numbers of the challenge's evaluator (REFERENCE.md "The official
metric"; the direct transcription is `vce.eval.score_reference`) to floating-point rounding, with
their sharp edges kept on purpose:

- matching is greedy in prediction file order, each prediction taking the *first* unmatched
  ground-truth segment (ground-truth file order) with tIoU >= threshold, so the order of events
  in the file is their ranking;
- an event with several labels counts once per label;
- a label absent from a video's ground truth scores AP 1 when nothing of it is predicted there
  and 0 otherwise; present but unpredicted scores 0;
- per-video mAP is the mean over all 17 labels, the overall mAP the mean over the ground-truth
  videos that hold at least one labelled event (as the evaluator builds its video list).

Why it is fast: the evaluator compares every prediction with every ground-truth segment of its
(video, label). A pair can only reach tIoU >= thr when the starts differ by at most
(1/thr - 1) * len(prediction) frames (union - intersection >= |start difference| and
intersection <= len(prediction)), so one binary search over ground-truth starts per prediction
finds the few candidate pairs, all at once with numpy. The greedy assignment then runs over
those candidate pairs only, and AP is a grouped cumulative sum.

CLI: ``python -m vce.eval.score GT.json PRED.json`` prints one JSON object; a submission that fails
the checks (or a file that cannot be read) prints ``error: ...`` to stderr and exits 2. The CLI
reads files as the official evaluator does: any UTF-8/16/32 encoding (BOM or not), and events
with start > end, float or bool frames or frames past int64 are scored by the definition
(`vce.eval.score_reference`, the evaluator's arithmetic) with a warning; ``--strict`` refuses them.
The pipeline's own writer (stage `events`) is always checked strictly.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from vce.core.errors import DataError
from vce.core.labels import LABEL_INDEX, LABELS, NUM_LABELS
from vce.core.runner import pipe_safe_stdout

THRESHOLDS = (0.5, 0.95)
_KEY_LIMIT = 2**62  # composite (group, start) keys must stay inside int64
_PLAIN_LIMIT = 2**62  # frame numbers the fast scorer takes as int64 (larger: the reference scorer)


class SubmissionError(DataError):
    """A submission (or ground-truth) JSON breaks the official format rules."""


def check_submission(sub: dict, gt: dict | None = None, where: str = "submission", strict: bool = True) -> list[str]:
    """Raise SubmissionError with a one-line message naming the first problem found.

    Checks: a top-level `videos` list; every video a mapping with `video_id` and an `events`
    list; every event with integer `start` <= `end` and `label` a list of the 17 label strings;
    with `gt`, the set of video ids equal to the ground truth's (the official check).
    `strict=False` accepts what the official evaluator scores although this project's writer
    never produces it (start > end, float or bool frames, frames past int64) and returns one
    message per such event instead (`lenient_events`).
    """
    if not isinstance(sub, dict) or not isinstance(sub.get("videos"), list):
        raise SubmissionError(f"{where}: expected a top-level object with a 'videos' list")
    lenient: list[str] = []
    for v, video in enumerate(sub["videos"]):
        if not isinstance(video, dict) or "video_id" not in video:
            raise SubmissionError(f"{where}: video #{v} has no 'video_id'")
        video_id = video["video_id"]
        if not isinstance(video_id, (str, int)) or isinstance(video_id, bool):
            raise SubmissionError(f"{where}: video #{v}: video_id {video_id!r} must be a string or an integer")
        events = video.get("events")
        if not isinstance(events, list):
            raise SubmissionError(f"{where}: video {video_id!r} has no 'events' list")
        for e, event in enumerate(events):
            # Fast path for the well-formed event; `_check_event` names the problem otherwise.
            if not (
                type(event) is dict
                and type(event.get("start")) is int
                and type(event.get("end")) is int
                and event["start"] <= event["end"]
                and type(event.get("label")) is list
                and all(type(label) is str and label in LABEL_INDEX for label in event["label"])
            ):
                message = _check_event(event, f"{where}: video {video_id!r} event #{e}", strict)
                if message:
                    lenient.append(message)
    if gt is not None:
        gt_ids = {video["video_id"] for video in gt["videos"]}
        sub_ids = {video["video_id"] for video in sub["videos"]}
        if gt_ids != sub_ids:
            typed = sorted({repr(v) for v in sub_ids - gt_ids if str(v) in {str(g) for g in gt_ids - sub_ids}})
            if typed:
                raise SubmissionError(
                    f"{where}: video id(s) {', '.join(typed[:5])} are of another type than the ground "
                    f"truth's (string vs integer: {sorted(map(repr, gt_ids - sub_ids))[:5]}); "
                    "the official check compares ids exactly, write them as in the ground truth")
            missing, extra = sorted(map(str, gt_ids - sub_ids)), sorted(map(str, sub_ids - gt_ids))
            raise SubmissionError(
                f"{where}: video ids differ from the ground truth's "
                f"(missing: {missing[:5]}{' ...' if len(missing) > 5 else ''}; "
                f"extra: {extra[:5]}{' ...' if len(extra) > 5 else ''})"
            )
    return lenient


def _check_event(event, where: str, strict: bool = True) -> str | None:
    """Raise on a broken event; in lenient mode return a message for one the evaluator scores."""
    if not isinstance(event, dict):
        raise SubmissionError(f"{where}: an event must be an object")
    message = None
    for key in ("start", "end"):
        value = event.get(key)
        if not isinstance(value, int) or isinstance(value, bool):
            if strict or not isinstance(value, (int, float)):
                raise SubmissionError(f"{where}: '{key}' must be an integer, got {value!r}")
            message = f"{where}: '{key}' is {value!r}, not an integer"
    if event["start"] > event["end"]:
        if strict:
            raise SubmissionError(f"{where}: start {event['start']} > end {event['end']}")
        message = message or f"{where}: start {event['start']} > end {event['end']}"
    if not strict and message is None and not -_PLAIN_LIMIT < event["start"] <= event["end"] < _PLAIN_LIMIT:
        message = f"{where}: frame numbers {event['start']}..{event['end']} past int64"
    labels = event.get("label")
    if not isinstance(labels, list):
        raise SubmissionError(f"{where}: 'label' must be a list of label strings, got {labels!r}")
    unknown = [label for label in labels if not isinstance(label, str) or label not in LABEL_INDEX]
    if unknown:
        raise SubmissionError(f"{where}: unknown label(s) {unknown}; allowed: {list(LABELS)}")
    return message


# ----------------------------------------------------------------------------- the metric


def _scored_videos(gt: dict) -> list:
    """Ground-truth video ids in file order that hold at least one labelled event."""
    video_ids: dict = {}
    for video in gt["videos"]:
        if any(event["label"] for event in video["events"]):
            video_ids.setdefault(video["video_id"], None)
    return list(video_ids)


def _flatten(sub: dict, video_pos: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(group, start, end) per (event, label), group = video * 17 + label, in file order per group."""
    groups, starts, ends = [], [], []
    for video in sub["videos"]:
        v = video_pos.get(video["video_id"])
        if v is None:
            continue  # not in the ground truth: the evaluator never looks at it
        base = v * NUM_LABELS
        for event in video["events"]:
            for label in event["label"]:
                k = LABEL_INDEX.get(label)
                if k is not None:
                    groups.append(base + k)
                    starts.append(event["start"])
                    ends.append(event["end"])
    group = np.asarray(groups, dtype=np.int64)
    order = np.argsort(group, kind="stable")  # group-major, file order inside a group
    start, end = _frame_array(starts), _frame_array(ends)
    if start is None or end is None or (end < start).any():
        return None  # not plain int64 segments (a leniently read file): only the definition scores it
    return group[order], start[order], end[order]


def _frame_array(values: list) -> np.ndarray | None:
    """int64 array of frame numbers, or None when some are floats or do not fit int64."""
    array = np.asarray(values) if values else np.empty(0, np.int64)
    return array.astype(np.int64) if array.dtype.kind in "ib" else None


def _candidate_pairs(gt, pred, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """All (prediction, ground truth) pairs of one group with tIoU >= threshold, by prediction then GT order."""
    gt_group, gt_start, gt_end = gt
    pr_group, pr_start, pr_end = pred
    if len(gt_group) == 0 or len(pr_group) == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    # 1. GT sorted by (group, start); composite int64 keys make one searchsorted serve all groups.
    by_start = np.lexsort((gt_start, gt_group))
    low = int(gt_start.min())
    span = int(gt_start.max()) - low + 2
    key = gt_group[by_start] * span + (gt_start[by_start] - low)
    # 2. The window of GT starts a prediction can reach: |start difference| <= (1/thr - 1) * len.
    pr_len = pr_end - pr_start + 1
    reach = np.floor((1.0 / threshold - 1.0) * pr_len).astype(np.int64) + 1
    window_lo = np.clip(pr_start - reach - low, 0, span - 1)
    window_hi = np.clip(pr_start + reach - low, -1, span - 2)
    lo = np.searchsorted(key, pr_group * span + window_lo, side="left")
    hi = np.searchsorted(key, pr_group * span + window_hi, side="right")
    counts = np.maximum(hi - lo, 0)
    # 3. Expand the windows into pairs and keep those at tIoU >= threshold.
    pair_pred = np.repeat(np.arange(len(pr_group)), counts)
    first_pair = np.cumsum(counts) - counts
    pair_gt = by_start[lo[pair_pred] + (np.arange(len(pair_pred)) - first_pair[pair_pred])]
    s1, e1, s2, e2 = pr_start[pair_pred], pr_end[pair_pred], gt_start[pair_gt], gt_end[pair_gt]
    intersection = np.maximum(0, np.minimum(e1, e2) - np.maximum(s1, s2) + 1)
    union = (e1 - s1 + 1) + (e2 - s2 + 1) - intersection
    keep = intersection / union >= threshold
    pair_pred, pair_gt = pair_pred[keep], pair_gt[keep]
    order = np.lexsort((pair_gt, pair_pred))
    return pair_pred[order], pair_gt[order]


def _greedy_match(pair_pred: np.ndarray, pair_gt: np.ndarray, n_pred: int, n_gt: int) -> np.ndarray:
    """The evaluator's greedy matching, over candidate pairs only: the GT each prediction took, or -1."""
    match = np.full(n_pred, -1, dtype=np.int64)
    if len(pair_pred) == 0:
        return match
    if len(np.unique(pair_pred)) == len(pair_pred) and len(np.unique(pair_gt)) == len(pair_gt):
        match[pair_pred] = pair_gt  # no prediction or GT segment is contested: every pair matches
        return match
    taken = bytearray(n_gt)
    for p, g in zip(pair_pred.tolist(), pair_gt.tolist()):
        if match[p] < 0 and not taken[g]:
            match[p] = g
            taken[g] = 1
    return match


def _greedy_hits(pair_pred: np.ndarray, pair_gt: np.ndarray, n_pred: int, n_gt: int) -> np.ndarray:
    """1 where a prediction matched (`_greedy_match`), else 0."""
    return (_greedy_match(pair_pred, pair_gt, n_pred, n_gt) >= 0).astype(np.int64)


def _average_precisions(gt, pred, hits: np.ndarray, n_groups: int) -> np.ndarray:
    """AP per group, summed in prediction order exactly as the evaluator does."""
    gt_count = np.bincount(gt[0], minlength=n_groups)
    pr_group = pred[0]
    pred_count = np.bincount(pr_group, minlength=n_groups)
    first = np.cumsum(pred_count) - pred_count
    rank = np.arange(len(pr_group)) - first[pr_group] + 1
    cum_all = np.cumsum(hits)
    before = np.concatenate([[0], cum_all])[first[pr_group]]
    true_positives = cum_all - before
    n_gt = gt_count[pr_group]
    has_gt = n_gt > 0
    recall = true_positives[has_gt] / n_gt[has_gt]
    previous_recall = (true_positives - hits)[has_gt] / n_gt[has_gt]
    precision = true_positives[has_gt] / rank[has_gt]
    ap = np.bincount(pr_group[has_gt], weights=precision * (recall - previous_recall), minlength=n_groups)
    no_gt = gt_count == 0
    ap[no_gt] = np.where(pred_count[no_gt] > 0, 0.0, 1.0)
    return ap


def _fits_int64(gt, pred, n_groups: int) -> bool:
    """Whether the composite (group, start) keys of `_candidate_pairs` stay inside int64."""
    coordinates = [a for part in (gt, pred) for a in part[1:] if len(a)]
    if not coordinates:
        return True
    magnitude = max(max(abs(int(a.min())), abs(int(a.max()))) for a in coordinates)
    return magnitude < 2**40 and (n_groups + 1) * (2 * magnitude + 2) < _KEY_LIMIT


def average_precisions(gt: dict, pred: dict) -> tuple[list, dict]:
    """AP of every (scored video, label): (video ids, {threshold: (V, 17) array}); no checks."""
    video_ids = _scored_videos(gt)
    video_pos = {video_id: v for v, video_id in enumerate(video_ids)}
    n_groups = len(video_ids) * NUM_LABELS
    gt_arrays, pred_arrays = _flatten(gt, video_pos), _flatten(pred, video_pos)
    if gt_arrays is None or pred_arrays is None or not _fits_int64(gt_arrays, pred_arrays, n_groups):
        # Absurd coordinates, floats or start > end (read leniently): fall back to the definition.
        from vce.eval.score_reference import average_precision, segments_by_video_label

        gt_segs, pred_segs = segments_by_video_label(gt), segments_by_video_label(pred)
        return video_ids, {
            threshold: np.array(
                [[average_precision(gt_segs.get(v, {}).get(label, []), pred_segs.get(v, {}).get(label, []), threshold)
                  for label in LABELS] for v in video_ids]
            ).reshape(-1, NUM_LABELS)
            for threshold in THRESHOLDS
        }
    return video_ids, {threshold: ap.reshape(-1, NUM_LABELS)
                       for threshold, ap in group_average_precisions(gt_arrays, pred_arrays, n_groups).items()}


def group_average_precisions(gt: tuple, pred: tuple, n_groups: int) -> dict | None:
    """{threshold: (n_groups,) AP} of segments already laid out as `_flatten` lays them out:
    (group, start, end) int64 arrays, group-major and in file order inside a group (a group is
    one (video, label); `average_precisions` numbers them video * 17 + label). None when the
    coordinates are too large for the fast matching (`average_precisions` then falls back to
    the definition). For callers that score many candidate lists of one label: no JSON dicts."""
    if not _fits_int64(gt, pred, n_groups):
        return None
    aps = {}
    for threshold in THRESHOLDS:
        pair_pred, pair_gt = _candidate_pairs(gt, pred, threshold)
        hits = _greedy_hits(pair_pred, pair_gt, len(pred[0]), len(gt[0]))
        aps[threshold] = _average_precisions(gt, pred, hits, n_groups)
    return aps


def event_matches(gt: dict, pred: dict) -> dict:
    """The official matching of every predicted event, per (video id, label) of the scored videos.

    Returns {(video_id, label): {"gt": (G, 2), "pred": (P, 2) int64 [start, end] in file order,
    0.5: (P,), 0.95: (P,) the position in "gt" of the segment each prediction took, -1 for none}}.
    Position i of a group is the i-th event of the video's file that carries the label (an event
    with several labels is in each of their groups). For the viewer and error analysis: the same
    candidate pairs and greedy pass as `score`; checked submissions only (no lenient fallback).
    """
    video_ids = _scored_videos(gt)
    video_pos = {video_id: v for v, video_id in enumerate(video_ids)}
    n_groups = len(video_ids) * NUM_LABELS
    gt_arrays, pred_arrays = _flatten(gt, video_pos), _flatten(pred, video_pos)
    if gt_arrays is None or pred_arrays is None or not _fits_int64(gt_arrays, pred_arrays, n_groups):
        raise DataError("event_matches: events with non-integer frames, start > end or frames past 2**40")
    gt_first = np.searchsorted(gt_arrays[0], np.arange(n_groups + 1))
    pred_first = np.searchsorted(pred_arrays[0], np.arange(n_groups + 1))
    matches = {threshold: _greedy_match(*_candidate_pairs(gt_arrays, pred_arrays, threshold), len(pred_arrays[0]),
                                        len(gt_arrays[0])) for threshold in THRESHOLDS}
    out = {}
    for group in range(n_groups):
        g0, g1, p0, p1 = gt_first[group], gt_first[group + 1], pred_first[group], pred_first[group + 1]
        entry = {"gt": np.stack([gt_arrays[1][g0:g1], gt_arrays[2][g0:g1]], axis=1),
                 "pred": np.stack([pred_arrays[1][p0:p1], pred_arrays[2][p0:p1]], axis=1)}
        for threshold, match in matches.items():
            local = match[p0:p1]
            entry[threshold] = np.where(local >= 0, local - g0, -1)
        out[(video_ids[group // NUM_LABELS], LABELS[group % NUM_LABELS])] = entry
    return out


def score(gt: dict, pred: dict, check: bool = True, strict: bool = True) -> dict:
    """Official temporal mAP at tIoU 0.5 and 0.95, per video and per label.

    Returns {"map@0.5", "map@0.95", "per_video@0.5", "per_video@0.95", "per_label@0.5",
    "per_label@0.95"}; per_label is the mean over scored videos of that label's AP.
    `strict=False` scores what the official evaluator scores (see `check_submission`).
    """
    if check:
        check_submission(gt, where="ground truth", strict=strict)
        check_submission(pred, gt, strict=strict)
    video_ids, aps = average_precisions(gt, pred)
    result: dict = {}
    for threshold, ap in aps.items():
        per_video = [sum(row) / NUM_LABELS for row in ap.tolist()]  # (V,) in the evaluator's order
        result[f"map@{threshold}"] = sum(per_video) / len(per_video) if per_video else 0.0
        result[f"per_video@{threshold}"] = dict(zip(video_ids, per_video))
        result[f"per_label@{threshold}"] = {
            label: (float(ap[:, k].sum() / len(ap)) if len(ap) else 0.0) for k, label in enumerate(LABELS)
        }
    return result


# ----------------------------------------------------------------------------- CLI


def _read_json(path: str, what: str) -> dict:
    # Bytes: json detects UTF-8 (with or without a BOM), UTF-16 and UTF-32, as the evaluator reads them.
    try:
        return json.loads(Path(path).read_bytes())
    except (OSError, UnicodeDecodeError) as err:
        raise SubmissionError(f"cannot read {what} {path}: {err.strerror if isinstance(err, OSError) else err}") from None
    except json.JSONDecodeError as err:
        raise SubmissionError(f"{what} {path} is not valid JSON: {err}") from None
    except RecursionError:  # json recurses once per nesting level; no submission nests more than 4
        raise SubmissionError(f"{what} {path}: JSON nested too deeply to be a submission") from None


def events_past_the_truth(gt: dict, pred: dict) -> tuple[int, int, str | None]:
    """(events starting after the last ground-truth frame of their video, all events, an
    example). Truth events cover each video's regions to its end, so such events are in other
    units or offsets (frame numbers against `index` truth): they score as the empty submission."""
    truth_end = {}
    for video in gt.get("videos", []):
        ends = [e["end"] for e in video.get("events", []) if isinstance(e.get("end"), (int, float))]
        if ends:
            truth_end[video.get("video_id")] = max(ends)
    past, total, example = 0, 0, None
    for video in pred.get("videos", []):
        end = truth_end.get(video.get("video_id"))
        for event in video.get("events", []):
            total += 1
            if end is not None and isinstance(event.get("start"), (int, float)) and event["start"] > end:
                past += 1
                example = example or f"video {video['video_id']} event {event['start']}-{event.get('end')}, truth ends at {end}"
    return past, total, example


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vce.eval.score", description="Official RARE-VISION temporal mAP (tIoU 0.5 and 0.95)."
    )
    parser.add_argument("gt", help="ground-truth events JSON")
    parser.add_argument("pred", help="predicted events JSON (the submission)")
    parser.add_argument("--strict", action="store_true",
                        help="also refuse what the official evaluator scores but this project's writer never "
                             "writes (start > end, float or bool frames); default: score it, with a warning")
    args = parser.parse_args(argv)
    try:
        gt = _read_json(args.gt, "ground truth")
        pred = _read_json(args.pred, "submission")
        for what, path, sub, ref in (("ground truth", args.gt, gt, None), ("submission", args.pred, pred, gt)):
            unusual = check_submission(sub, ref, where=f"{what} {path}", strict=args.strict)
            if unusual:
                print(f"warning: {len(unusual)} event(s) scored as the official evaluator does, though not "
                      f"integer start <= end (e.g. {unusual[0]}); --strict refuses them", file=sys.stderr)
        result = score(gt, pred, check=False)
        past, total, example = events_past_the_truth(gt, pred)
        if past:
            print(f"warning: {past} of {total} event(s) start after the last ground-truth frame of their video "
                  f"(e.g. {example}): other units or an offset? (frame numbers against index-unit truth)",
                  file=sys.stderr)
    except SubmissionError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    with pipe_safe_stdout():  # `| head`: the reader stopped, nothing to report
        print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
