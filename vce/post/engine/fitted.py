"""The fitted score engine as data: `Engine` (the region calibration and penalty, one policy per
label) and its JSON in `models/thresholds.json`, every number checked as it is read.

The policies themselves, their JSON and how each decodes: `vce.post.engine.policies`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from vce.core.errors import DataError
from vce.core.labels import LABELS, REGIONS
from vce.post.engine.policies import Policy, check_finite_array, policy_from_dict


@dataclass
class Engine:
    """The fitted decoder: region calibration and penalty, one policy per label (JSON via `to_dict`)."""

    coef: list  # (5, 5) multinomial logistic regression weights on the region logits
    intercept: list  # (5,)
    switch_penalty: float
    region_cuts: bool
    top_k: int
    policies: dict[str, Policy] = field(default_factory=dict)  # label -> its policy, in LABELS order
    centres: list | None = None  # per label: the tuning videos' median logit (recentre), None for regions / off
    durations: list | None = None  # [min (5,), max (5,)] region run lengths in frames (the duration prior), None: any
    temperatures: list | None = None  # per label: [slope, offset] on the logit (finding_calibration), None: as it is
    report: dict = field(default_factory=dict)  # what the fit measured (thresholds stage metrics), not saved here

    def to_dict(self) -> dict:
        return {"coef": self.coef, "intercept": self.intercept, "switch_penalty": self.switch_penalty,
                "region_cuts": self.region_cuts, "top_k": self.top_k,
                "policies": {label: policy.to_dict() for label, policy in self.policies.items()},
                "centres": self.centres, "durations": self.durations, "temperatures": self.temperatures}

    @classmethod
    def from_dict(cls, data: dict, where: str = "engine") -> Engine:
        try:
            values = {f.name: data[f.name] for f in fields(cls) if f.name != "report"}
            policies = dict(values.pop("policies"))
        except (KeyError, TypeError, ValueError) as err:
            raise DataError(f"{where}: not a fitted score engine ({err})") from None
        missing = [label for label in LABELS if label not in policies]
        if missing:
            raise DataError(f"{where}: no policy for label(s) {missing}")
        policies = {label: policy_from_dict(policy, label, where) for label, policy in policies.items()}
        _check_numbers(values, where)
        for label, policy in policies.items():
            policy.check_numbers(f"{where}.policies[{label!r}]")
        return cls(**values, policies=policies)


def _check_numbers(values: dict, where: str) -> None:
    """The engine's numbers are finite and of the fitted shapes: a NaN coefficient would make
    every region path score NaN (no path to decode), a wrong shape a matmul traceback."""
    n = len(REGIONS)
    check_finite_array(values["coef"], (n, n), f"{where}.coef")
    check_finite_array(values["intercept"], (n,), f"{where}.intercept")
    check_finite_array(values["switch_penalty"], (), f"{where}.switch_penalty")
    if values["durations"] is not None:
        check_finite_array(values["durations"], (2, n), f"{where}.durations")
    for key in ("centres", "temperatures"):
        per_label = values[key]
        if per_label is None:
            continue
        if not isinstance(per_label, list) or len(per_label) != len(LABELS):
            raise DataError(f"{where}.{key}: expected a list of {len(LABELS)} (one per label) or null")
        for label, value in zip(LABELS, per_label):
            if value is not None:
                check_finite_array(value, () if key == "centres" else (2,), f"{where}.{key}[{label!r}]")
