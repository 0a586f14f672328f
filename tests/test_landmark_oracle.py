"""bench.landmark_oracle's leave-one-out presence gate: the bound quoted in docs/engine_measurements.md."""

import numpy as np

from bench.landmark_oracle import loo_gate_gain


def test_a_feature_that_separates_held_from_not_held_videos_admits_exactly_the_held_ones_either_way_up():
    gain = np.array([0.5, 0.25, 0.75, -1.0, -1.0, -1.0, 0.5, -1.0])
    feature = np.array([9.0, 8.0, 7.0, 1.0, 2.0, 3.0, 6.0, 0.0])  # the held videos (gain > 0) are the long ones
    # Every held video is admitted by the others' rule except the weakest one (feature 6): without
    # it the others' best bar is 7, an observed value, so it is left out (0.5 of the 2.0 lost).
    assert loo_gate_gain(gain, feature) == 1.5
    assert loo_gate_gain(gain, -feature) == 1.5  # the direction is chosen, not assumed


def test_a_feature_without_information_stays_silent_and_a_held_out_video_is_judged_by_the_others_rule():
    gain = np.array([0.5, -1.0, 0.5, -1.0])
    assert loo_gate_gain(gain, np.zeros(4)) == 0.0  # one tie group: emitting everywhere loses on the others
    # Alternating: leaving a held video out, the others' best rule admits the *other* parity, so it
    # is judged by a rule learned without it and the gate pays for its own overfitting.
    # Without video 1 or 3 (not held) the others' best bar admits it (-1 each); without a held
    # one the others' best rule leaves it out: in sample the best gate earns 0.5, held out -2.
    assert loo_gate_gain(np.array([0.5, -1.0, 0.5, -1.0, 0.5]), np.arange(5.0)) == -2.0
