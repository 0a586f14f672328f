"""The score engine's policies: one typed policy per label, its JSON, and how it decodes.

A policy says how the engine emits one label: `off` (never), `runs` (decoded runs of its
probabilities, gated per video), `anchored` (landmark events at learned offsets from a decoded
boundary), `boundary` (landmark events ranked by the posterior of the boundary it marks,
`vce.post.engine.landmarks`), `region` (a region's decoded run, its learned variants and cut pieces) or `head`
(the mouth and the esophagus from the head posterior, `vce.post.head`). Each `to_dict` writes
the keys, in the order, that its `from_dict` reads back; a file written by an older version
that lacks a key is refused naming the label and the key. Each kind decodes itself in the
phase it belongs to (`decode_label`, `decode_region`, `decode_head`; `BasePolicy` answers None
for the others), so `vce.post.engine.apply` never asks which kind a policy is and a new kind is
one class here. The engine that holds them: `vce.post.engine.fitted`.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, dataclass, field, fields
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from vce.core.errors import DataError
from vce.core.labels import LABEL_INDEX, REGIONS
from vce.post.arhmm import AR_MODEL_KEYS, ar_posterior_runs, ar_run_strength, ar_runs
from vce.post.engine.candidates import (
    Candidates,
    anchored_candidates,
    head_candidates,
    region_candidates,
    run_candidates,
)
from vce.post.engine.gate import gate_evidence
from vce.post.engine.params import PRESENCE_FEATURES
from vce.post.engine.quantile_runs import quantile_runs
from vce.post.timeline import Timeline

if TYPE_CHECKING:
    from vce.post.engine.apply import Decoding


class _Lacking(Exception):
    """The keys a policy's JSON lacks (`policy_from_dict` names them with the label)."""


def _required(cls) -> list[str]:
    """The fields of dataclass `cls` without a default, in declaration order (base class first)."""
    return [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]


def _build(cls, data: dict, lacking: list[str], **parsed):
    """`cls` from the JSON `data` (`parsed`: fields already read); raises `_Lacking` if keys are missing."""
    lacking = [key for key in _required(cls) if key not in data] + lacking
    if lacking:
        raise _Lacking(lacking)
    known = {f.name for f in fields(cls)}
    return cls(**{key: value for key, value in data.items() if key in known}, **parsed)


def _tuning(policy) -> dict:
    out = {} if policy.tuning_ap is None else {"tuning_ap": policy.tuning_ap}
    if getattr(policy, "detectors", None) is not None:
        out["detectors"] = policy.detectors
    return out


@dataclass(kw_only=True)
class BasePolicy:
    """What every kind of policy answers; each kind overrides what concerns it (so the engine's
    phases ask the policy, and a new kind is one class here)."""

    kind: ClassVar[str]
    silent: ClassVar[bool] = False  # never emits its label (off)

    @property
    def emitted_runs(self) -> RunSpec | None:
        """The runs decoding whose runs it emits (runs), else None."""
        return None

    @property
    def shadow_runs(self) -> RunSpec | None:
        """The runs decoding that only cuts the regions (a silent label's `shadow_cuts`), else None."""
        return None

    def check_numbers(self, where: str) -> None:
        """Its fitted numbers are usable (`Engine.from_dict`): a `DataError` naming `where` if not."""

    def decode_label(self, label: str, decoding: Decoding) -> Candidates | None:
        """The label phase (findings and landmarks): its ungated candidates, or None (not emitted here)."""
        return None

    def decode_region(self, region: str, decoding: Decoding, cuts: dict | None, shadow: dict | None,
                      order: str | None = None) -> Candidates | None:
        """The region phase: its region's ungated candidates, cut at the label phase's `cuts` and
        `shadow` times, its pieces in `order` (None: its own), or None (not emitted here)."""
        return None

    def decode_head(self, region: str, decoding: Decoding) -> Candidates | None:
        """The head phase (the mouth and the esophagus): its region's ungated candidates, or None."""
        return None


@dataclass(kw_only=True)
class RunSpec:
    """How a label's runs are decoded: `detector` "threshold" (`hysteresis_runs` at `threshold`
    with low/high `ratio`, median-filtered over `median_window`), "rank" (`quantile_runs`: each
    video's top `share` of frames, median-filtered) or "ar" (`vce.post.arhmm`'s
    `ar_model` at `ar_bias`, its posterior runs at `ar_levels` appended), runs of at least
    `min_length` frames whose middle lies in `regions` of the decoded path (None: anywhere).
    On its own: the shadow runs of a label left silent, which only cut the regions."""

    detector: str
    threshold: float | None
    ratio: float
    median_window: int
    min_length: int
    regions: list | None
    ar_model: dict | None = None
    ar_bias: float | None = None
    ar_levels: list | None = None
    share: float | None = None

    def _ar(self) -> dict:
        if self.detector == "rank":
            return {"share": self.share}
        if self.detector != "ar":
            return {}
        return {"ar_model": self.ar_model, "ar_bias": self.ar_bias, "ar_levels": self.ar_levels}

    def spec(self) -> RunSpec:
        """The decoding alone (a runs policy's, without its gate)."""
        return RunSpec(**{f.name: getattr(self, f.name) for f in fields(RunSpec)})

    def _gate_shares(self) -> list | None:
        """The label's `region_shares` for the "region" gate feature (a runs policy's; None: 1 for every run)."""
        return None

    def decode_runs(self, timeline: Timeline, label: str, top_k: int, path: np.ndarray,
                    appended: bool = True) -> Candidates:
        """These runs' candidates on `timeline` (`path`: the decoded regions); `appended` False:
        without the AR posterior runs (a shadow only cuts; the fit's cuts are the decoded runs)."""
        k = LABEL_INDEX[label]
        runs = strength = alternatives = None
        if self.detector == "rank":
            runs = quantile_runs(timeline, k, self.share, self.median_window)
        if self.detector == "ar":
            runs = ar_runs(timeline, k, self.ar_model, self.ar_bias)
            strength = ar_run_strength(timeline, k, self.ar_model, self.ar_bias)
            if appended and self.ar_levels:  # the posterior runs appended after the decoded ones
                alternatives = ar_posterior_runs(timeline, k, self.ar_model, self.ar_bias, self.ar_levels)
        return run_candidates(timeline, k, self.threshold, self.median_window, self.min_length, top_k, runs,
                              ratio=self.ratio, path=path, regions=self.regions, shares=self._gate_shares(),
                              strength=strength, alternatives=alternatives)

    def to_dict(self) -> dict:
        return {"detector": self.detector, "threshold": self.threshold, "ratio": self.ratio,
                "median_window": self.median_window, "min_length": self.min_length, "regions": self.regions,
                **self._ar()}

    @classmethod
    def from_dict(cls, data: dict, lacking: list[str] | None = None):
        lacking = list(lacking or [])
        if data.get("detector") == "rank" and "share" not in data:
            lacking.append("share")
        if data.get("detector") == "ar":
            lacking += [key for key in ("ar_model", "ar_bias", "ar_levels") if key not in data]
            if isinstance(data.get("ar_model"), dict):
                lacking += [f"ar_model.{key}" for key in AR_MODEL_KEYS if key not in data["ar_model"]]
        return _build(cls, data, lacking)


@dataclass(kw_only=True)
class BoundaryPolicy(BasePolicy):
    """A landmark's events from the posterior of the boundary it marks (`vce.post.engine.landmarks`):
    the crossing within `width` positions of the decoded one, tempered by `temperature`, each
    [offset, length, weight] of `spans` placed at it, scored by their summed probability times
    the event's mean landmark probability to the power `prob_weight`, the `candidates` best per
    video, where the video's `evidence` (a `BOUNDARY_FEATURES` name) reaches `gate` (None: every
    video with a decoded boundary)."""

    kind: ClassVar[str] = "boundary"
    temperature: float
    width: int
    spans: list
    prob_weight: float
    candidates: int
    evidence: str
    gate: float | None
    tuning_ap: float | None = None
    detectors: dict | None = None  # the detector choice's cross-fitted evidence (`findings._detector_family`)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "temperature": self.temperature, "width": self.width, "spans": self.spans,
                "prob_weight": self.prob_weight, "candidates": self.candidates, "evidence": self.evidence,
                "gate": self.gate, **_tuning(self)}

    @classmethod
    def from_dict(cls, data: dict):
        return _build(cls, data, [])

    def decode_label(self, label: str, decoding: Decoding) -> Candidates:
        from vce.post.engine.landmarks import apply_boundary  # landmarks fits these policies: it imports this module

        return apply_boundary(decoding.timeline, decoding.region_scores(), decoding.path, label, self)


@dataclass(kw_only=True)
class RunsPolicy(RunSpec, BasePolicy):
    """Emit the decoded runs where the video's `evidence` (a `PRESENCE_FEATURES` name, or
    "joint": the `presence_model`'s score) reaches `gate` (None: every video with a run);
    `shares`: the label's `region_shares`, for the "region" feature; `boundary` (a landmark):
    that policy's candidates appended after the runs where they are emitted (its own gate unused)."""

    kind: ClassVar[str] = "runs"
    shares: list | None
    gate: float | None
    evidence: str
    presence_model: dict | None = None
    boundary: BoundaryPolicy | None = None
    tuning_ap: float | None = None
    detectors: dict | None = None  # the detector choice's cross-fitted evidence (`findings._detector_family`)

    def to_dict(self) -> dict:
        joint = {"presence_model": self.presence_model} if self.evidence == "joint" else {}
        boundary = {} if self.boundary is None else {"boundary": self.boundary.to_dict()}
        return {"kind": self.kind, "detector": self.detector, "threshold": self.threshold, "ratio": self.ratio,
                "median_window": self.median_window, **self._ar(), "min_length": self.min_length,
                "regions": self.regions, "shares": self.shares, "gate": self.gate, "evidence": self.evidence,
                **joint, **boundary, **_tuning(self)}

    @classmethod
    def from_dict(cls, data: dict, lacking: list[str] | None = None):
        joint = ["presence_model"] if data.get("evidence") == "joint" and "presence_model" not in data else []
        policy = super().from_dict({key: value for key, value in data.items() if key != "boundary"}, joint)
        if data.get("boundary") is not None:
            policy.boundary = BoundaryPolicy.from_dict(data["boundary"])
        return policy

    @property
    def emitted_runs(self) -> RunSpec:
        return self

    def decode_label(self, label: str, decoding: Decoding) -> Candidates:
        """Its runs, their gate's evidence, a landmark's boundary candidates appended (not while
        fitting the cuts: `decoding.appended` False)."""
        from vce.post.engine.landmarks import appended_events  # landmarks fits these policies: it imports this module

        c = self.decode_runs(decoding.timeline, label, decoding.engine.top_k, decoding.path, decoding.appended)
        c.evidence = gate_evidence(c.features, self)
        if self.boundary is not None and decoding.appended:  # a landmark's boundary candidates after its runs
            extra = self.boundary.decode_label(label, decoding).events
            c.events, c.spans = appended_events(c.events, extra, decoding.engine.top_k), None
        return c

    def _gate_shares(self) -> list | None:
        return self.shares

    def check_numbers(self, where: str) -> None:
        if self.presence_model is not None:
            _check_presence_model(self.presence_model, f"{where}.presence_model")


@dataclass(kw_only=True)
class OffPolicy(BasePolicy):
    """Never emit the label (`shadow`: its best runs, which still cut the regions: `shadow_cuts`)."""

    kind: ClassVar[str] = "off"
    silent: ClassVar[bool] = True
    tuning_ap: float | None = None
    detectors: dict | None = None  # the detector choice's cross-fitted evidence (`findings._detector_family`)
    shadow: RunSpec | None = None

    @property
    def shadow_runs(self) -> RunSpec | None:
        return self.shadow

    def to_dict(self) -> dict:
        return {"kind": self.kind, **_tuning(self), **({} if self.shadow is None else {"shadow": self.shadow.to_dict()})}

    @classmethod
    def from_dict(cls, data: dict):
        shadow = RunSpec.from_dict(data["shadow"]) if "shadow" in data else None
        return _build(cls, {key: value for key, value in data.items() if key != "shadow"}, [], shadow=shadow)


@dataclass(kw_only=True)
class AnchoredPolicy(BasePolicy):
    """A landmark's events at (offset, length) `anchors` from the decoded boundary it marks."""

    kind: ClassVar[str] = "anchored"
    anchors: list
    gate: float | None
    tuning_ap: float | None = None
    detectors: dict | None = None  # the detector choice's cross-fitted evidence (`findings._detector_family`)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "anchors": self.anchors, "gate": self.gate, **_tuning(self)}

    @classmethod
    def from_dict(cls, data: dict):
        return _build(cls, data, [])

    def decode_label(self, label: str, decoding: Decoding) -> Candidates:
        return anchored_candidates(decoding.timeline, decoding.path, label, [tuple(a) for a in self.anchors])


@dataclass(kw_only=True)
class RegionPolicy(BasePolicy):
    """A region's decoded run, its learned `variants` ((mode, a, b), `place_variant`), then its
    pieces cut at other labels' events, `cut_order` ("longest" or "shortest") first, where the
    run's length reaches `gate`."""

    kind: ClassVar[str] = "region"
    gate: float | None
    variants: list = field(default_factory=list)
    cut_order: str | None = None
    tuning_ap: float | None = None

    def to_dict(self) -> dict:
        return {"kind": self.kind, "gate": self.gate, "variants": self.variants, "cut_order": self.cut_order,
                **_tuning(self)}

    @classmethod
    def from_dict(cls, data: dict):
        return _build(cls, data, [key for key in ("variants", "cut_order") if key not in data])

    def decode_region(self, region: str, decoding: Decoding, cuts: dict | None, shadow: dict | None,
                      order: str | None = None) -> Candidates:
        return region_candidates(decoding.timeline, decoding.path, REGIONS.index(region),
                                 [tuple(v) for v in self.variants], cuts, shadow, order or self.cut_order)


@dataclass(kw_only=True)
class HeadPolicy(BasePolicy):
    """The mouth or the esophagus from the head posterior (`vce.post.head`) at `temperature`
    under the `length_priors`, its `candidates` best spans, where its probability of being in
    the video reaches `gate`."""

    kind: ClassVar[str] = "head"
    gate: float | None
    temperature: float
    candidates: int
    length_priors: list
    tuning_ap: float | None = None

    def to_dict(self) -> dict:
        return {"kind": self.kind, "gate": self.gate, "temperature": self.temperature, "candidates": self.candidates,
                "length_priors": self.length_priors, **_tuning(self)}

    @classmethod
    def from_dict(cls, data: dict):
        return _build(cls, data, [])

    def decode_head(self, region: str, decoding: Decoding) -> Candidates:
        # One posterior per (temperature, count, priors): both head regions read it.
        key = (self.temperature, self.candidates, json.dumps(self.length_priors))
        if key not in decoding.heads:
            decoding.heads[key] = head_candidates(decoding.timeline, decoding.path, decoding.region_scores(),
                                                  self.length_priors, self.temperature, self.candidates)
        return decoding.heads[key][region]


Policy = OffPolicy | RunsPolicy | AnchoredPolicy | BoundaryPolicy | RegionPolicy | HeadPolicy
POLICY_KINDS = {cls.kind: cls for cls in (OffPolicy, RunsPolicy, AnchoredPolicy, BoundaryPolicy, RegionPolicy,
                                          HeadPolicy)}


def policy_from_dict(data, label: str, where: str) -> Policy:
    """One label's policy from its JSON, or a DataError naming the label and what is wrong."""
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind not in POLICY_KINDS:
        raise DataError(f"{where}: the {label!r} policy has kind {kind!r}; allowed: {list(POLICY_KINDS)}")
    try:
        return POLICY_KINDS[kind].from_dict(data)
    except _Lacking as err:
        raise DataError(f"{where}: the {label!r} policy lacks {err.args[0]}: fitted by an older version, "
                        "rerun the thresholds stage") from None


def check_finite_array(value, shape: tuple, key: str) -> None:
    """`value` as float64 has `shape` and is finite, or a `DataError` naming `key`."""
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise DataError(f"{key}: not numbers ({str(value)[:80]})") from None
    if array.shape != shape:
        raise DataError(f"{key}: shape {array.shape}, expected {shape}")
    if not np.isfinite(array).all():
        raise DataError(f"{key}: not finite ({str(value)[:80]}): rerun the thresholds stage")


def _check_presence_model(model, key: str) -> None:
    """The joint presence gate's logistic model: one finite weight per `PRESENCE_FEATURES`."""
    if not isinstance(model, dict) or not {"mean", "scale", "coef", "intercept"} <= set(model):
        raise DataError(f"{key}: expected a mapping with mean, scale, coef and intercept")
    for name in ("mean", "scale", "coef"):
        check_finite_array(model[name], (len(PRESENCE_FEATURES),), f"{key}.{name}")
    check_finite_array(model["intercept"], (), f"{key}.intercept")
