"""The rank detector: runs of the frames in each video's own top share of a label's probabilities.

A threshold on the probability reads its level, and so does the AR(1) decoder's step: a device
or video whose scores sit higher or lower everywhere (a logit offset, another scale) moves every
frame across a fixed threshold. Ranks within the video do not move with any increasing map of
its scores: the frames among the video's top `share` of a label's probabilities, median-filtered
over `median_window` like the thresholded runs (`smooth_runs`). It assumes no noise model and no
calibration; it does assume a video holds at most about `share` of its frames of the label, and
it fires in every video, so the presence gate (on the runs' probabilities) decides where it is
emitted. The engine tries it where the label passes the decoder screen (`decoder_min_auc`) and picks
between it, the thresholded runs and the AR(1) decoder on held-out tuning videos
(`findings._detector_family`).
"""

from __future__ import annotations

import numpy as np

from vce.post.events import smooth_runs
from vce.post.timeline import Timeline


def video_quantile_mask(timeline: Timeline, k: int, share: float) -> np.ndarray:
    """(P,) bool: label k's observed frames whose probability reaches its video's (1 - share)
    quantile (the ceil(share x n)-th highest of the video's n observed frames; ties all in)."""
    probs = timeline.probs[k]
    mask = np.zeros(len(probs), bool)
    bounds = np.append(timeline.video_first, len(probs))
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        observed = timeline.observed[lo:hi]
        values = probs[lo:hi][observed]
        if len(values) == 0:
            continue
        top = min(max(int(np.ceil(share * len(values))), 1), len(values))
        cut = np.partition(values, len(values) - top)[len(values) - top]
        mask[lo:hi] = observed & (probs[lo:hi] >= cut)
    return mask


def quantile_runs(timeline: Timeline, k: int, share: float, median_window: int) -> tuple:
    """(starts, ends) dense positions of the median-filtered runs of `video_quantile_mask`."""
    return smooth_runs(timeline, video_quantile_mask(timeline, k, share), median_window, median_window // 2, 1)
