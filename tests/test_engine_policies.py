"""The fitted engine's JSON (models/thresholds.json `engine`): typed policies that write back the
keys, in the order, they were read from, and refuse a policy that lacks one by label and key."""

import copy
import json

import pytest

from vce.core.errors import DataError
from vce.core.labels import LABELS
from vce.post.engine import Engine
from vce.post.engine.policies import AnchoredPolicy, HeadPolicy, OffPolicy, RegionPolicy, RunSpec, RunsPolicy

AR_MODEL = {"a": 0.1, "b": 2.0, "g": -1.0, "rho": 0.5, "sigma": 0.3, "p01": 0.01, "p10": 0.2, "separation": 6.7,
            "off_phases": [[1.0, 0.01]], "on_phases": [[1.0, 0.2]]}
POLICIES = {
    "mouth": {"kind": "head", "gate": 0.5, "temperature": 0.3, "candidates": 30, "length_priors": [[0.0], [0.0]],
              "tuning_ap": 0.9},
    "esophagus": {"kind": "off", "tuning_ap": 1.0},
    "stomach": {"kind": "region", "gate": None, "variants": [[0, 0, -2]], "cut_order": "shortest", "tuning_ap": 0.4},
    "pylorus": {"kind": "anchored", "anchors": [[-2, 3]], "gate": 0.0, "tuning_ap": 0.2},
    "blood": {"kind": "runs", "detector": "ar", "threshold": None, "ratio": 1.0, "median_window": 1,
              "ar_model": AR_MODEL, "ar_bias": 0.0, "ar_levels": [0.5], "min_length": 1, "regions": None,
              "shares": [0.0, 0.0, 0.1, 0.8, 0.1], "gate": 0.7, "evidence": "joint",
              "presence_model": {"mean": [0.0] * 6, "scale": [1.0] * 6, "coef": [1.0] + [0.0] * 5,
                                 "intercept": 0.0}, "tuning_ap": 0.5,
              "detectors": {"chosen": "ar", "held_out": {"threshold": 3.5, "ar": 4.0}}},
    "polyp": {"kind": "runs", "detector": "threshold", "threshold": 0.9, "ratio": 1.0, "median_window": 7,
              "min_length": 3, "regions": [3], "shares": None, "gate": None, "evidence": "max", "tuning_ap": 0.6},
    "ulcer": {"kind": "off", "tuning_ap": 0.95, "shadow": {"detector": "threshold", "threshold": 0.5, "ratio": 1.0,
                                                           "median_window": 1, "min_length": 1, "regions": None}},
}
TYPES = {"mouth": HeadPolicy, "esophagus": OffPolicy, "stomach": RegionPolicy, "pylorus": AnchoredPolicy,
         "blood": RunsPolicy, "polyp": RunsPolicy, "ulcer": OffPolicy}


def _engine_json(policies=None) -> dict:
    policies = copy.deepcopy({**{label: {"kind": "off", "tuning_ap": 1.0} for label in LABELS}, **POLICIES,
                              **(policies or {})})
    identity = [[float(i == j) for j in range(5)] for i in range(5)]  # (5, 5): Engine.from_dict checks the shapes
    return {"coef": identity, "intercept": [0.0] * 5, "switch_penalty": 0.3, "region_cuts": True, "top_k": 10,
            "policies": {label: policies[label] for label in LABELS}, "centres": None, "durations": None,
            "temperatures": None}


def test_every_kind_of_policy_writes_back_the_json_it_was_read_from():
    data = _engine_json()
    engine = Engine.from_dict(json.loads(json.dumps(data)))
    assert {label: type(engine.policies[label]) for label in TYPES} == TYPES
    assert json.dumps(engine.to_dict()) == json.dumps(data)  # same keys, same order, same values
    assert isinstance(engine.policies["ulcer"].shadow, RunSpec) and engine.policies["blood"].ar_model == AR_MODEL


@pytest.mark.parametrize(("label", "key", "named"), [
    ("pylorus", "anchors", "anchors"),
    ("polyp", "evidence", "evidence"),
    ("blood", "presence_model", "presence_model"),
    ("blood", "ar_bias", "ar_bias"),
    ("stomach", "variants", "variants"),
    ("mouth", "temperature", "temperature"),
])
def test_a_policy_lacking_a_key_is_refused_by_label_and_key(label, key, named):
    data = _engine_json()
    del data["policies"][label][key]
    with pytest.raises(DataError, match=rf"thresholds.json:engine: the '{label}' policy lacks \['{named}'\]: "
                                        "fitted by an older version, rerun the thresholds stage"):
        Engine.from_dict(data, "thresholds.json:engine")


def test_an_unknown_kind_of_policy_is_refused_with_the_kinds_allowed():
    with pytest.raises(DataError, match=r"the 'polyp' policy has kind 'peaks'; allowed: \['off', 'runs', "):
        Engine.from_dict(_engine_json({"polyp": {"kind": "peaks"}}))
