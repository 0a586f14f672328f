"""Which probabilities each label uses: the frame model's, the temporal model's, or their mean.

`post.probs: auto` chooses per label on **cross-fitted** validation evidence: every temporal
probability compared here comes from a temporal model that never trained on that video
(`vce.infer.temporal_fit`), and the frame model never trained on validation videos, so the
three candidates are compared on equal, out-of-sample terms.

The evidence is pooled frame AP (`vce.eval.frame_metrics`), not temporal mAP. Temporal mAP is
what is scored, but it needs the thresholds/engine fit per candidate (minutes each) and, with
the few validation videos a split holds, rests on a handful of events per label; frame AP
ranks every validation frame and moves smoothly. Ties (and labels without a validation
positive) go to `frame`, then `blend`: auto is never worse than `frame` on the evidence.

Torch-free: detect and the stages import it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vce.core.errors import DataError
from vce.core.labels import LABELS
from vce.eval.frame_metrics import frame_metrics

ROUTES = ("frame", "blend", "temporal")  # in tie-break order: the frame model wins a tie
EVIDENCE = "frame AP on cross-fitted validation frames (vce.eval.frame_metrics)"


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


def choose_routes(labels: np.ndarray, frame_probs: np.ndarray, temporal_probs: np.ndarray) -> RouteChoice:
    """Per label the route of highest frame AP on (N, 17) validation labels; ties to `ROUTES` order."""
    candidates = {"frame": frame_probs, "blend": blend(frame_probs, temporal_probs), "temporal": temporal_probs}
    scored = {route: frame_metrics(labels, probs)["per_label"] for route, probs in candidates.items()}
    routes, evidence = {}, {}
    for label in LABELS:
        aps = {route: scored[route][label]["ap"] for route in ROUTES}
        defined = {route: ap for route, ap in aps.items() if ap is not None}
        # max() keeps the first of equal values: ROUTES order is the tie-break.
        routes[label] = max(defined, key=defined.get) if len(defined) == len(ROUTES) else "frame"
        evidence[label] = {"support": scored["frame"][label]["support"],
                           **{f"{route}_ap": None if ap is None else round(ap, 6) for route, ap in aps.items()}}
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
