"""bench.landmark_oracle's leave-one-out presence gate: the bound quoted in docs/engine_measurements.md."""

import numpy as np

from bench.landmark_oracle import gains_over_silence, loo_gate_gain


def test_a_feature_that_separates_held_from_not_held_videos_admits_exactly_the_held_ones_either_way_up():
    gain = np.array([0.5, 0.25, 0.75, -1.0, -1.0, -1.0, 0.5, -1.0])
    feature = np.array([9.0, 8.0, 7.0, 1.0, 2.0, 3.0, 6.0, 0.0])  # the held videos (gain > 0) are the long ones
    # Without the weakest held video (6) the others' gate sits midway between 7 and 3 (fit_gate),
    # so it is still admitted: every held video earns, no other loses its silence.
    assert loo_gate_gain(gain, feature) == 2.0
    assert loo_gate_gain(gain, -feature) == 2.0  # the direction is chosen, not assumed


def test_a_feature_without_information_stays_silent_and_a_held_out_video_is_judged_by_the_others_rule():
    assert loo_gate_gain(np.array([0.5, -1.0, 0.5, -1.0]), np.zeros(4)) == 0.0  # one tie group: silence wins
    # Alternating held (0, 2, 4) and not (1, 3): without video 1 or 3 the others' best gate admits
    # it (-1 each); without a held one it is left out. In sample the best gate earns 0.5, held out -2.
    assert loo_gate_gain(np.array([0.5, -1.0, 0.5, -1.0, 0.5]), np.arange(5.0)) == -2.0


def test_each_threshold_gains_its_own_ap_where_held_and_loses_the_silence_credit_elsewhere():
    holds = np.array([True, False, True])
    gains = gains_over_silence(holds, {0.5: np.array([0.5, 0.0, 1.0]), 0.95: np.array([0.25, 0.0, 0.0])})
    assert gains[0.5].tolist() == [0.5, -1.0, 1.0]
    assert gains[0.95].tolist() == [0.25, -1.0, 0.0]  # 0.95 scored by its own APs, not 0.5's
    assert gains["mean"].tolist() == [0.375, -1.0, 0.5]
