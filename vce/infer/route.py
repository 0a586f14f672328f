"""Which probabilities each label uses: the frame model's, the temporal model's, or their mean.

`post.probs: auto` chooses per label on **cross-fitted** validation evidence: every temporal
probability compared here comes from a temporal model that never trained on that video
(`vce.infer.temporal_fit`), and the frame model never trained on validation videos, so the
three candidates are compared on equal, out-of-sample terms.

The evidence is pooled frame AP (`vce.eval.frame_metrics`), not temporal mAP. Temporal mAP is
what is scored, but it needs the thresholds/engine fit per candidate (minutes each) and, with
the few validation videos a split holds, rests on a handful of events per label; frame AP
ranks every validation frame and moves smoothly.

A label leaves the frame route only on evidence that beats noise (`RouteRule`): the other
route's AP gain over the frame route must exceed `post.route_min_gain` at the lower end of a
paired block bootstrap (blocks of `post.route_block_frames` consecutive validation frames of one
video, so a finding's run moves as a whole; the gain's `1 - post.route_confidence` quantile over
`post.route_replicates` replicates): choosing the highest AP outright moved labels on gains far
inside the noise and scored below the frame route on held-out videos (docs/temporal.md, measured
by `bench/route_seeds.py`). A bootstrap over blocks learns a gain's spread only from several
independent runs of positives: a label whose validation positives lie in fewer than
`post.route_min_positive_blocks` blocks (one event, or every positive in one or two short
videos) gives no evidence and stays on `frame`, as does a label without a validation positive
(with k positive blocks, a replicate draws none of them with probability about e^-k, and the
quantile is taken over the replicates that draw one: with one or two, the lower bound is about
the observed gain). Of the routes that pass, the larger observed gain wins (ties in `ROUTES`
order). The five regions share one route, chosen on their mean gain
(`post.route_regions_together`): the score engine decodes them as one monotone path from their
joint probabilities, which must come from one model.

Torch-free: detect and the stages import it.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from vce.core.errors import DataError
from vce.core.labels import LABELS, REGIONS
from vce.eval.frame_metrics import frame_metrics

ROUTES = ("frame", "blend", "temporal")  # in tie-break order: the frame model wins a tie
EVIDENCE = ("frame AP on cross-fitted validation frames (vce.eval.frame_metrics); a label leaves the frame route "
            "when the gain's block-bootstrap lower bound exceeds post.route_min_gain")


@dataclass(frozen=True)
class RouteRule:
    """How much evidence moves a label off the frame route (`post.route_*`, see the module docstring).

    No defaults: params.yaml is their one source (`vce.infer.temporal_fit.route_rule` reads them)."""

    min_gain: float
    confidence: float
    block_frames: int
    replicates: int
    seed: int
    regions_together: bool
    min_positive_blocks: int


@dataclass(frozen=True)
class RouteChoice:
    """Per label the chosen route and its evidence (AP of each candidate, None when undefined)."""

    routes: dict[str, str]
    evidence: dict[str, dict]

    def to_dict(self, source: str, reason: str | None = None) -> dict:
        """What metrics/route.json holds."""
        return {"post_probs": source, "evidence": EVIDENCE, "reason": reason,
                "routes": dict(self.routes), "per_label": self.evidence,
                "counts": {route: sum(r == route for r in self.routes.values()) for route in ROUTES}}


def blend(frame_probs: np.ndarray, temporal_probs: np.ndarray) -> np.ndarray:
    """The blend route: the mean of the two probabilities, (N, 17) float32."""
    return ((np.asarray(frame_probs, np.float64) + np.asarray(temporal_probs, np.float64)) / 2).astype(np.float32)


def fixed_routes(route: str) -> dict[str, str]:
    """Every label on one route (`post.probs: frame | temporal`, or auto's fallback)."""
    if route not in ROUTES:
        raise DataError(f"unknown route {route!r}; allowed: {list(ROUTES)}")
    return dict.fromkeys(LABELS, route)


def ranking(y_true: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One label's frames by descending score: (order, labels in that order as float64, mask of
    the last frame of each run of equal scores: where a threshold step ends)."""
    order = np.argsort(-scores, kind="stable")
    ranked = scores[order]
    return order, y_true[order].astype(np.float64), np.r_[ranked[1:] != ranked[:-1], True]


def ranked_average_precision(y: np.ndarray, last_of_tie: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """`average_precision` on a `ranking`: `weights` (R, N) already in its order."""
    tp = np.cumsum(weights * y, axis=1)[:, last_of_tie]
    fp = np.cumsum(weights * (1 - y), axis=1)[:, last_of_tie]
    positives = tp[:, -1:]
    with np.errstate(invalid="ignore", divide="ignore"):
        precision = np.where(tp + fp > 0, tp / (tp + fp), 0.0)
        recall_step = np.diff(np.c_[np.zeros(len(weights)), tp], axis=1) / positives
    return np.where(positives[:, 0] > 0, (recall_step * precision).sum(axis=1), np.nan)


def average_precision(y_true: np.ndarray, scores: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Weighted average precision of one label for each row of `weights` (R, N): what
    scikit-learn's `average_precision_score` gives with `sample_weight` (equal scores form one
    step), here for many bootstrap replicates over one sort. (R,) float64; NaN where a row of
    weights holds no positive."""
    order, y, last_of_tie = ranking(y_true, scores)
    return ranked_average_precision(y, last_of_tie, weights[:, order])


def blocks_of(videos: np.ndarray, block_frames: int) -> np.ndarray:
    """(N,) each row's block: the rows of each video (contiguous in `videos`) cut into blocks of
    `block_frames` consecutive rows, numbered in row order."""
    starts = np.r_[True, videos[1:] != videos[:-1]]
    video_index = np.cumsum(starts) - 1
    offset = np.arange(len(videos)) - np.flatnonzero(starts)[video_index]  # row within its video
    return np.cumsum(offset % block_frames == 0) - 1  # a block starts every block_frames rows of a video


def bootstrap_blocks(videos: np.ndarray, rule: RouteRule) -> tuple[np.ndarray, np.ndarray]:
    """Block bootstrap of the rows: (N,) each row's block (`blocks_of`), (replicates, blocks)
    each replicate's count of each block; a replicate draws as many blocks with replacement."""
    block = blocks_of(videos, rule.block_frames)
    n_blocks = int(block[-1]) + 1
    counts = np.random.default_rng(rule.seed).multinomial(n_blocks, np.full(n_blocks, 1 / n_blocks),
                                                           size=rule.replicates)
    return block, counts


def bootstrap_gains(y: np.ndarray, scores: dict[str, np.ndarray], block: np.ndarray, counts: np.ndarray,
                    chunk: int = 8) -> dict[str, np.ndarray]:
    """Per route other than `frame`, (replicates,) its AP minus the frame route's AP on the same
    (paired) replicate. Replicates are expanded to frame weights `chunk` at a time: (chunk, N)."""
    ranked = {route: ranking(y, values) for route, values in scores.items()}  # one sort per route
    aps = {route: [] for route in scores}
    for start in range(0, len(counts), chunk):
        draw = counts[start:start + chunk]
        for route, (order, y_ranked, last_of_tie) in ranked.items():
            weights = draw[:, block[order]].astype(np.float64)  # (chunk, N) in the route's order
            aps[route].append(ranked_average_precision(y_ranked, last_of_tie, weights))
    frame = np.concatenate(aps.pop("frame"))
    return {route: np.concatenate(values) - frame for route, values in aps.items()}


def route_units(rule: RouteRule) -> list[tuple[str, tuple[str, ...]]]:
    """The groups of labels that share one route: the five regions together when
    `rule.regions_together` (the score engine and the Viterbi decoder read them as one monotone
    path from their joint probabilities, so their columns must come from one model), every
    other label alone."""
    together = [("regions", REGIONS)] if rule.regions_together else []
    grouped = {label for _, members in together for label in members}
    return together + [(label, (label,)) for label in LABELS if label not in grouped]


def choose_routes(labels: np.ndarray, frame_probs: np.ndarray, temporal_probs: np.ndarray,
                  videos: np.ndarray | None, rule: RouteRule) -> RouteChoice:
    """Per label the route of `rule` (`post.route_*`, `vce.infer.temporal_fit.route_rule`): `frame` unless another route's
    AP gain on (N, 17) validation labels beats `rule.min_gain` at its bootstrap lower bound (for a
    group of `route_units`, the mean gain over its labels with validation positives in at least
    `rule.min_positive_blocks` bootstrap blocks; a label with fewer gives no evidence). `videos`
    (N,) gives each row's video, rows of a video contiguous (None: one video)."""
    candidates = {"frame": frame_probs, "blend": blend(frame_probs, temporal_probs), "temporal": temporal_probs}
    # The rows every candidate scores (a paired comparison): an invalid frame is NaN in either model.
    valid = np.all([np.isfinite(p).all(axis=1) for p in candidates.values()], axis=0)
    scored = {route: frame_metrics(labels[valid], np.asarray(probs)[valid])["per_label"]
              for route, probs in candidates.items()}
    videos = np.zeros(len(labels)) if videos is None else np.asarray(videos)
    blocks = bootstrap_blocks(videos[valid], rule) if valid.any() and rule.replicates else None
    block = blocks_of(videos[valid], rule.block_frames) if valid.any() else np.zeros(0, np.int64)
    routes, evidence, gains, observed = {}, {}, {}, {}
    for k, label in enumerate(LABELS):
        aps = {route: scored[route][label]["ap"] for route in ROUTES}
        positive_blocks = len(np.unique(block[labels[valid, k] > 0]))
        evidence[label] = {"support": scored["frame"][label]["support"], "positive_blocks": positive_blocks,
                           **{f"{route}_ap": None if ap is None else round(ap, 6) for route, ap in aps.items()}}
        if any(ap is None for ap in aps.values()) or positive_blocks < rule.min_positive_blocks:
            continue
        observed[label] = {route: aps[route] - aps["frame"] for route in ROUTES[1:]}
        gains[label] = {route: np.array([observed[label][route]]) for route in ROUTES[1:]}
        if blocks is not None:
            gains[label] = bootstrap_gains(labels[valid, k], {route: np.asarray(p, np.float64)[valid, k]
                                                              for route, p in candidates.items()}, *blocks)
    for unit, members in route_units(rule):
        scored_members = [label for label in members if label in gains]
        route = "frame"
        if scored_members:
            passing = {}
            for other in ROUTES[1:]:
                # (replicates,) the unit's mean gain; a replicate may draw no positive of a label
                with np.errstate(invalid="ignore"), warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN replicate: dropped below
                    unit_gain = np.nanmean([gains[label][other] for label in scored_members], axis=0)
                finite = unit_gain[np.isfinite(unit_gain)]
                low = float(np.quantile(finite, 1 - rule.confidence)) if len(finite) else None
                for label in scored_members:
                    evidence[label][f"{other}_gain_low"] = None if low is None else round(low, 6)
                if low is not None and low > rule.min_gain:
                    passing[other] = float(np.mean([observed[label][other] for label in scored_members]))
            if passing:  # max() keeps the first of equal values: ROUTES order is the tie-break
                route = max(passing, key=passing.get)
        for label in members:
            routes[label] = route
            if len(members) > 1:
                evidence[label]["route_group"] = unit
    return RouteChoice(routes, evidence)


def mix(frame_probs: np.ndarray, temporal_probs: np.ndarray | None, routes: dict[str, str]) -> np.ndarray:
    """(N, 17) float32: each label's column from its route. `temporal_probs` may be None only when
    every route is `frame`."""
    out = np.array(frame_probs, np.float32, copy=True)
    if temporal_probs is None:
        if any(routes[label] != "frame" for label in LABELS):
            raise DataError("a label is routed to the temporal model but there are no temporal probabilities")
        return out
    mean = blend(frame_probs, temporal_probs)
    for k, label in enumerate(LABELS):
        if routes[label] == "temporal":
            out[:, k] = temporal_probs[:, k]
        elif routes[label] == "blend":
            out[:, k] = mean[:, k]
    return out
