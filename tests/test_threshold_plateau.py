"""bench.threshold_plateau: the plateau of equal tuning objective around a pick, and its middle."""

from __future__ import annotations

import numpy as np

from bench.threshold_plateau import logit_middle, plateau


def test_the_plateau_spans_every_level_with_the_picks_value_and_stops_where_it_changes():
    levels = np.array([0.1, 0.2, 0.4, 0.6, 0.8, 0.9])
    # The value of a threshold t: what the frames >= t give; equal for t in (0.1, 0.6], lower beyond.
    value = lambda t: 1.0 if 0.1 < t <= 0.6 else 0.5  # noqa: E731
    assert plateau(levels, value, 0.5) == (0.1, 0.6)
    assert plateau(levels, value, 0.3) == (0.1, 0.6)  # any pick on the plateau finds the same one


def test_a_plateau_reaching_past_every_level_ends_at_the_outermost_one():
    levels = np.array([0.2, 0.5, 0.7])
    assert plateau(levels, lambda t: 1.0, 0.5) == (0.2, 0.7)


def test_the_middle_is_halfway_in_logit():
    assert abs(logit_middle(0.2, 0.8) - 0.5) < 1e-12
    low, high = 0.1, 0.6
    middle = logit_middle(low, high)
    logit = lambda p: np.log(p / (1 - p))  # noqa: E731
    assert abs((logit(middle) - logit(low)) - (logit(high) - logit(middle))) < 1e-12
