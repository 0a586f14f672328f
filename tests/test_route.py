"""The route rule (`vce.infer.route`): a label leaves the frame route only on evidence beating noise."""

import numpy as np
import pytest
from sklearn.metrics import average_precision_score

from vce.core.labels import LABELS, NUM_LABELS
from vce.infer.route import RouteRule, average_precision, bootstrap_blocks, choose_routes


def test_weighted_average_precision_is_scikit_learns_with_ties_and_weights():
    rng = np.random.default_rng(1)
    y = (rng.random(600) < 0.2).astype(int)
    scores = np.round(rng.random(600) + 0.3 * y, 2)  # rounded: many equal scores
    weights = np.vstack([np.ones(600), rng.integers(0, 4, (5, 600))]).astype(float)
    expected = [average_precision_score(y, scores, sample_weight=w) for w in weights]
    np.testing.assert_allclose(average_precision(y, scores, weights), expected, rtol=1e-12)
    assert np.isnan(average_precision(y, scores, (1 - y)[None].astype(float)))[0]  # no positive weighed: undefined


def test_bootstrap_blocks_stay_inside_a_video_and_draw_as_many_blocks_as_there_are():
    videos = np.repeat(["a", "b", "c"], [7, 12, 3])
    block, counts = bootstrap_blocks(videos, RouteRule(block_frames=5, replicates=50, seed=3))
    # a: 5 + 2, b: 5 + 5 + 2, c: 3 → 6 blocks, numbered in row order
    assert block.tolist() == [0] * 5 + [1] * 2 + [2] * 5 + [3] * 5 + [4] * 2 + [5] * 3
    assert counts.shape == (50, 6) and (counts.sum(axis=1) == 6).all()
    np.testing.assert_array_equal(counts, bootstrap_blocks(videos, RouteRule(block_frames=5, replicates=50, seed=3))[1])
    assert not np.array_equal(counts, bootstrap_blocks(videos, RouteRule(block_frames=5, replicates=50, seed=4))[1])


def _one_lucky_video(n_videos: int = 20, per_video: int = 100):
    """Label 0: the temporal route equals the frame route but in one video, where it ranks that
    video's positives first: a real AP gain that rests on one video only. Label 1: the temporal
    route is better everywhere. (labels, frame, temporal, videos)."""
    rng = np.random.default_rng(0)
    n = n_videos * per_video
    videos = np.repeat([f"v{i:02d}" for i in range(n_videos)], per_video)
    labels = np.zeros((n, NUM_LABELS), np.uint8)
    labels[:, :2] = rng.random((n, 2)) < 0.1
    frame = np.full((n, NUM_LABELS), 0.5, np.float32)
    frame[:, :2] = 1 / (1 + np.exp(-(labels[:, :2] * 1.5 + rng.normal(0, 1, (n, 2)) - 2)))
    temporal = frame.copy()
    lucky = videos == "v07"
    temporal[lucky, 0] = np.where(labels[lucky, 0] == 1, 0.999, frame[lucky, 0])
    temporal[:, 1] = 1 / (1 + np.exp(-(labels[:, 1] * 4 + rng.normal(0, 1, n) - 3)))
    return labels, frame, temporal, videos


def test_a_gain_resting_on_one_video_stays_on_frame_a_broad_gain_moves():
    labels, frame, temporal, videos = _one_lucky_video()
    plain = choose_routes(labels, frame, temporal, videos, RouteRule(min_gain=0.02, replicates=0))
    lucky_gain = plain.evidence[LABELS[0]]["temporal_ap"] - plain.evidence[LABELS[0]]["frame_ap"]
    assert lucky_gain > 0.03 and plain.routes[LABELS[0]] != "frame"  # the plain gain clears the margin ...
    boot = choose_routes(labels, frame, temporal, videos, RouteRule(min_gain=0.02, block_frames=100))
    assert boot.routes[LABELS[0]] == "frame"  # ... its bootstrap lower bound does not
    assert boot.evidence[LABELS[0]]["temporal_gain_low"] <= 0.02
    assert boot.routes[LABELS[1]] == "temporal" and boot.evidence[LABELS[1]]["temporal_gain_low"] > 0.02
    assert all(boot.routes[label] == "frame" for label in LABELS[2:])  # no positive: frame
    # the median replicate is about the observed gain: the lower quantile is what holds it back
    median = choose_routes(labels, frame, temporal, videos, RouteRule(min_gain=0.02, confidence=0.5, block_frames=100))
    assert median.routes[LABELS[0]] != "frame"


@pytest.mark.parametrize("min_gain, moves", [(0.0, True), (0.5, False)])
def test_the_margin_is_the_gain_a_route_must_clear(min_gain, moves):
    labels, frame, temporal, videos = _one_lucky_video()
    choice = choose_routes(labels, frame, temporal, videos, RouteRule(min_gain=min_gain, block_frames=100))
    low = choice.evidence[LABELS[1]]["temporal_gain_low"]
    assert 0.0 < low < 0.5 and (choice.routes[LABELS[1]] == "temporal") == moves


def test_invalid_rows_are_left_out_of_the_evidence_and_the_bootstrap():
    labels, frame, temporal, videos = _one_lucky_video()
    gapped = temporal.copy()
    gapped[:50] = np.nan  # invalid frames: NaN in every label
    rule = RouteRule(min_gain=0.02, block_frames=100)
    choice = choose_routes(labels, frame, gapped, videos, rule)
    kept = choose_routes(labels[50:], frame[50:], temporal[50:], videos[50:], rule)
    assert choice.evidence == kept.evidence and choice.routes == kept.routes
