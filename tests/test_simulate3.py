"""bench.simulate3: the error model outside the AR(1) family holds what its docstring says."""

import numpy as np
from scipy.special import expit

from bench.simulate import SEED_AUC
from bench.simulate3 import CHANCE_AUC, confused_regions, defaults, label_levels
from vce.core.labels import LABELS, REGIONS


def _regions(states):
    return np.eye(len(REGIONS))[states]


def test_confusions_mix_only_the_two_regions_of_a_boundary_near_it():
    # mouth 12 frames, esophagus 12, stomach 600, small intestine 600, every boundary confused
    # within 150 frames: a frame reads as its own region or a neighbour across a boundary, never
    # a region two steps away (the mouth never reads as the stomach), and far from every
    # boundary as itself.
    states = np.r_[[0] * 12, [1] * 12, [2] * 600, [3] * 600]
    read = confused_regions(_regions(states), np.random.default_rng(0), 0.0, 150)
    assert (np.abs(read - states) <= 1).all()
    assert (read != states).any()
    far = np.r_[24 + 150:624 - 150, 624 + 150:len(states)]
    assert (read[far] == states[far]).all()
    near = np.r_[624 - 150:624 + 150]
    assert set(read[near]) == {2, 3}


def test_findings_sit_near_zero_and_chance_labels_have_no_step():
    negative, positive = label_levels(np.random.default_rng(0), defaults())
    for k, label in enumerate(LABELS):
        if label in REGIONS:
            continue
        assert 0.002 <= expit(negative[k]) <= 0.03
        if SEED_AUC[label] <= CHANCE_AUC:
            assert positive[k] == negative[k]
        else:
            assert 0.03 <= expit(positive[k]) <= 0.4
