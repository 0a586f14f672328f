"""What the engine reads findings through: per-video centres and per-label temperatures.

A capsule (or a video) may read every frame a little more "blood" than another, and a model
may read one finding overconfident and another timid; both move the meaning of a run
threshold. `recentred` moves each video's median logit to the tuning videos' median;
`fit_temperatures` / `calibrated` read each finding through a logistic fit of its own logit.
`logistic` is the one sklearn fit every calibration and the presence model use.
"""

from __future__ import annotations

import numpy as np

from vce.core.labels import LABELS, REGIONS
from vce.post.anatomy import label_logits
from vce.post.timeline import Timeline


def logistic(x: np.ndarray, y: np.ndarray, sample_weight: np.ndarray | None = None, one_thread: bool = True,
              **options):
    """sklearn's LogisticRegression fitted on one BLAS thread (problems of a few features: more
    threads only contend on a shared machine). `one_thread` False: no thread limit, whose set-up
    costs more than a fit on a few dozen rows (the presence model)."""
    from sklearn.linear_model import LogisticRegression
    from threadpoolctl import threadpool_limits

    if not one_thread:
        return LogisticRegression(**options).fit(x, y, sample_weight=sample_weight)
    with threadpool_limits(1):
        return LogisticRegression(**options).fit(x, y, sample_weight=sample_weight)


# Fewer positive (or negative) tuning frames than this: a label keeps its probabilities as they are.
MIN_CALIBRATION_FRAMES = 20


def fit_temperatures(timeline: Timeline, labels: np.ndarray, n_frames: int, seed: int = 0) -> list:
    """Per finding / landmark, [a, b] of p' = sigmoid(a logit(p) + b): a logistic regression of the
    label on its own logit over up to n_frames / 2 positive and n_frames / 2 negative tuning
    frames (`labels`: `label_truth`). Equal shares make p' the posterior under an even prior, so
    a run threshold means the same likelihood ratio for every label, whatever its temperature
    and offset (a model that reads one finding overconfident and another timid gets the same
    grid of thresholds for both). None for regions (their calibration is the region path's), for
    a label with fewer than `MIN_CALIBRATION_FRAMES` frames on either side, and where the fitted
    slope is not positive (the scores rank the wrong way on the tuning videos: kept as they are)."""
    rng = np.random.default_rng(seed)
    out: list = []
    for k, label in enumerate(LABELS):
        sides = [np.flatnonzero(labels[k] == value) for value in (0, 1)]
        if label in REGIONS or min(len(side) for side in sides) < MIN_CALIBRATION_FRAMES:
            out.append(None)
            continue
        negatives, positives = (side if len(side) <= n_frames // 2 else rng.choice(side, n_frames // 2, replace=False)
                                for side in sides)
        rows = np.concatenate([negatives, positives])
        target = np.repeat([0, 1], [len(negatives), len(positives)])
        # "balanced": each side weighs half whatever its sample size, the even prior.
        model = logistic(label_logits(timeline, k)[rows][:, None], target, C=100.0, max_iter=200,
                          class_weight="balanced")
        slope, offset = float(model.coef_[0, 0]), float(model.intercept_[0])
        out.append([slope, offset] if slope > 0 else None)
    return out


def calibrated(timeline: Timeline, temperatures: list) -> Timeline:
    """A copy of `timeline` with each label that has a temperature read through it (`fit_temperatures`)."""
    probs = timeline.probs.copy()
    for k, fitted in enumerate(temperatures):
        if fitted is not None:
            z = fitted[0] * label_logits(timeline, k) + fitted[1]
            probs[k] = np.where(timeline.observed, 1 / (1 + np.exp(-z)), np.nan)
    return timeline.with_probs(probs)


def recentred(timeline: Timeline, centres: list) -> Timeline:
    """A copy of `timeline` whose labels with a centre have their logits moved, per video, so that
    the video's median logit is that centre: a capsule (or a video) that reads every frame a
    little more "blood" than another no longer fires everywhere (findings are rare, so a
    video's median frame is a negative one)."""
    probs = timeline.probs.copy()
    bounds = np.append(timeline.video_first, probs.shape[1])
    lo = int(bounds[0]) if len(bounds) > 1 else probs.shape[1]  # nothing before the first video moves
    lengths, observed = np.diff(bounds), timeline.observed[lo:]
    video = np.repeat(np.arange(len(lengths)), lengths)
    firsts = bounds[:-1] - lo
    has_seen = np.add.reduceat(observed, firsts) > 0 if len(firsts) else np.zeros(0, bool)
    moved = has_seen[video]  # a video without an observed frame keeps its probabilities
    for k, centre in enumerate(centres):
        if centre is None:
            continue
        # 1. Each video's logits (one pass over the label), 2. their median per video, 3. the
        #    shift to the centre, then back to probabilities (the same sums as video by video).
        z = label_logits(timeline, k)[lo:].copy()  # shifted in place below
        shift = np.zeros(len(lengths))
        for v in np.flatnonzero(has_seen):
            seen = z[firsts[v]:firsts[v] + lengths[v]][observed[firsts[v]:firsts[v] + lengths[v]]]
            shift[v] = centre - np.median(seen)
        z += shift[video]
        np.negative(z, out=z)  # 1 / (1 + exp(-z)), in place
        np.exp(z, out=z)
        z += 1
        np.divide(1, z, out=z)
        np.copyto(probs[k, lo:], z, where=moved & observed)
        np.copyto(probs[k, lo:], np.nan, where=moved & ~observed)
    return timeline.with_probs(probs)
