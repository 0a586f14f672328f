"""How the region phase picks its switch penalty and prior weight: by the summed APs of all five
regions on the tuning videos, each computed here by the official scorer from the decoded path."""

import numpy as np
import pandas as pd
import pytest
from test_engine import _engine_params, _labels

from vce.core.labels import LABELS, REGIONS
from vce.eval.score import score
from vce.post.engine.gate import LabelObjective
from vce.post.engine.regions import decode, phase_regions, region_emissions, region_log_prior, region_truth
from vce.post.events import labels_to_submission
from vce.post.timeline import build_timeline

IDENTITY = np.eye(len(REGIONS)).tolist()  # calibration that reads the region probabilities as they are
LEVEL = [0.0] * len(REGIONS)


def _videos(lengths, blips, n_videos=2):
    """`n_videos` identical videos whose regions last `lengths` frames, every region read at 0.9
    where it is true and 0.05 elsewhere, except the (first, last + 1, region, probability) `blips`."""
    truth = np.repeat(np.arange(len(REGIONS)), lengths)
    probs = {label: np.full(len(truth), 0.02) for label in LABELS}
    for k, region in enumerate(REGIONS):
        probs[region] = np.where(truth == k, 0.9, 0.05)
    for first, end, region, p in blips:
        probs[region][first:end] = p
    tables, gt = [], {"videos": []}
    for v in range(n_videos):
        tables.append(pd.DataFrame({"video_id": f"v{v}", "t": np.arange(len(truth)),
                                    **{label: values.astype(np.float32) for label, values in probs.items()}}))
        gt["videos"] += labels_to_submission(_labels(truth, f"v{v}"))["videos"]
    timeline = build_timeline(pd.concat(tables, ignore_index=True), max_reach=1)
    return timeline, gt


def _region_aps(timeline, gt, scores, penalty) -> dict:
    """Per region, the summed objective AP (mean of @0.5 and @0.95) over the videos when each
    emits its decoded run, or silence where that scores more (the videos are identical, so a
    presence gate admits all of them or none), by the official scorer."""
    path = decode(timeline, scores, penalty, None)
    bounds = np.append(timeline.video_first, len(path))
    videos = []
    for v, video_id in enumerate(timeline.video_ids):
        events = []
        for state, region in enumerate(REGIONS):
            on = np.flatnonzero(path[bounds[v]:bounds[v + 1]] == state) + bounds[v]
            if len(on):
                events.append({"start": int(timeline.time[on[0]]), "end": int(timeline.time[on[-1]]), "label": [region]})
        videos.append({"video_id": video_id, "events": events})
    result = score(gt, {"videos": videos})
    n_videos = len(gt["videos"])
    aps = {}
    for region in REGIONS:
        emitted = n_videos * (result["per_label@0.5"][region] + result["per_label@0.95"][region]) / 2
        silent = sum(not any(region in e["label"] for e in video["events"]) for video in gt["videos"])
        aps[region] = max(emitted, silent)
    return aps


def test_the_switch_penalty_is_the_one_with_the_best_summed_region_aps():
    """No video has an esophagus, but 3 frames where the mouth meets the stomach read esophagus
    a little more than mouth or stomach. Without a switch penalty the path visits it and the
    mouth loses its last 2 frames (tIoU 0.9: a miss at 0.95); a penalty of 3 skips it. Only the
    mouth's AP tells the two apart: the colon, the last region, scores the same under both."""
    timeline, gt = _videos([20, 0, 40, 60, 40], [(18, 21, "esophagus", 0.6), (18, 20, "mouth", 0.5),
                                                  (20, 21, "stomach", 0.5)])
    scores = region_emissions(timeline, IDENTITY, LEVEL)
    aps = {penalty: _region_aps(timeline, gt, scores, penalty) for penalty in (0.0, 3.0)}
    assert aps[3.0]["mouth"] > aps[0.0]["mouth"] and aps[3.0]["colon"] == aps[0.0]["colon"]
    objective = LabelObjective(timeline, gt, "mean")
    for grid in ([0.0, 3.0], [3.0, 0.0]):
        params = _engine_params(switch_penalties=grid, prior_weights=[0.0])
        total, penalty, _, _, _, _ = phase_regions(timeline, objective, params, IDENTITY, LEVEL,
                                                   region_log_prior(region_truth(timeline, gt)), None)
        assert penalty == 3.0
        assert total == pytest.approx(sum(aps[3.0].values()))


def test_the_prior_weight_is_the_one_with_the_best_summed_region_aps():
    """A 10-frame mouth reads esophagus a little more than mouth (0.55 against 0.45): on its own
    evidence the path starts in the esophagus and the mouth is lost. A weight of -1 on the log
    region prior is a stay bonus for the short regions that keeps it. The colon scores the same
    under both weights."""
    timeline, gt = _videos([10, 20, 40, 60, 40], [(0, 10, "mouth", 0.45), (0, 10, "esophagus", 0.55)])
    log_prior = region_log_prior(region_truth(timeline, gt))
    aps = {weight: _region_aps(timeline, gt, region_emissions(timeline, IDENTITY, (weight * log_prior).tolist()), 0.0)
           for weight in (0.0, -1.0)}
    assert aps[-1.0]["mouth"] > aps[0.0]["mouth"] and aps[-1.0]["colon"] == aps[0.0]["colon"]
    objective = LabelObjective(timeline, gt, "mean")
    for grid in ([0.0, -1.0], [-1.0, 0.0]):
        params = _engine_params(switch_penalties=[0.0], prior_weights=grid)
        total, _, _, _, intercept, weight = phase_regions(timeline, objective, params, IDENTITY, LEVEL, log_prior, None)
        assert weight == -1.0 and intercept == pytest.approx((-1.0 * log_prior).tolist())
        assert total == pytest.approx(sum(aps[-1.0].values()))
