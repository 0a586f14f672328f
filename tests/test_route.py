"""The route rule (`vce.infer.route`): a label leaves the frame route only on evidence beating noise."""

import numpy as np
import pytest
from conftest import route_rule_of
from sklearn.metrics import average_precision_score

from vce.core.labels import LABEL_INDEX, LABELS, NUM_LABELS, REGIONS
from vce.infer.route import average_precision, bootstrap_blocks, choose_routes


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
    block, counts = bootstrap_blocks(videos, route_rule_of(block_frames=5, replicates=50, seed=3))
    # a: 5 + 2, b: 5 + 5 + 2, c: 3 → 6 blocks, numbered in row order
    assert block.tolist() == [0] * 5 + [1] * 2 + [2] * 5 + [3] * 5 + [4] * 2 + [5] * 3
    assert counts.shape == (50, 6) and (counts.sum(axis=1) == 6).all()
    np.testing.assert_array_equal(counts, bootstrap_blocks(videos, route_rule_of(block_frames=5, replicates=50, seed=3))[1])
    assert not np.array_equal(counts, bootstrap_blocks(videos, route_rule_of(block_frames=5, replicates=50, seed=4))[1])


LUCKY, BROAD = LABEL_INDEX["blood"], LABEL_INDEX["ulcer"]  # findings: each label its own route


def _noisy(truth: np.ndarray, lift: float, rng, offset: float = 2.0) -> np.ndarray:
    """Probabilities that rank `truth` by `lift` logits above unit noise."""
    return 1 / (1 + np.exp(-(truth.astype(float) * lift + rng.normal(0, 1, truth.shape) - offset)))


def _one_lucky_video(n_videos: int = 20, per_video: int = 100):
    """Blood: the temporal route equals the frame route but in one video, where it ranks that
    video's positives first: a real AP gain that rests on one video only. Ulcer: the temporal
    route is better everywhere. (labels, frame, temporal, videos)."""
    rng = np.random.default_rng(0)
    n = n_videos * per_video
    videos = np.repeat([f"v{i:02d}" for i in range(n_videos)], per_video)
    labels = np.zeros((n, NUM_LABELS), np.uint8)
    labels[:, [LUCKY, BROAD]] = rng.random((n, 2)) < 0.1
    frame = np.full((n, NUM_LABELS), 0.5, np.float32)
    frame[:, [LUCKY, BROAD]] = _noisy(labels[:, [LUCKY, BROAD]], 1.5, rng)
    temporal = frame.copy()
    lucky = videos == "v07"
    temporal[lucky, LUCKY] = np.where(labels[lucky, LUCKY] == 1, 0.999, frame[lucky, LUCKY])
    temporal[:, BROAD] = _noisy(labels[:, BROAD], 4, rng, 3)
    return labels, frame, temporal, videos


def test_a_gain_resting_on_one_video_stays_on_frame_a_broad_gain_moves():
    labels, frame, temporal, videos = _one_lucky_video()
    lucky, broad = LABELS[LUCKY], LABELS[BROAD]
    plain = choose_routes(labels, frame, temporal, videos, route_rule_of(min_gain=0.02, replicates=0))
    lucky_gain = plain.evidence[lucky]["temporal_ap"] - plain.evidence[lucky]["frame_ap"]
    assert lucky_gain > 0.03 and plain.routes[lucky] != "frame"  # the plain gain clears the margin ...
    boot = choose_routes(labels, frame, temporal, videos, route_rule_of(min_gain=0.02, block_frames=100))
    assert boot.routes[lucky] == "frame"  # ... its bootstrap lower bound does not
    assert boot.evidence[lucky]["temporal_gain_low"] <= 0.02
    assert boot.routes[broad] == "temporal" and boot.evidence[broad]["temporal_gain_low"] > 0.02
    assert all(boot.routes[label] == "frame" for label in LABELS if label != broad)  # no positive: frame
    # the median replicate is about the observed gain: the lower quantile is what holds it back
    median = choose_routes(labels, frame, temporal, videos, route_rule_of(min_gain=0.02, confidence=0.5, block_frames=100))
    assert median.routes[lucky] != "frame"


@pytest.mark.parametrize("min_gain, moves", [(0.0, True), (0.5, False)])
def test_the_margin_is_the_gain_a_route_must_clear(min_gain, moves):
    labels, frame, temporal, videos = _one_lucky_video()
    choice = choose_routes(labels, frame, temporal, videos, route_rule_of(min_gain=min_gain, block_frames=100))
    low = choice.evidence[LABELS[BROAD]]["temporal_gain_low"]
    assert 0.0 < low < 0.5 and (choice.routes[LABELS[BROAD]] == "temporal") == moves


def _regions(colon_lift: float, stomach_lift: float):
    """Colon ranked far better by the temporal route; stomach by it with `stomach_lift` (frame: 1.5)."""
    rng = np.random.default_rng(5)
    n = 2000
    videos = np.repeat([f"v{i:02d}" for i in range(20)], 100)
    labels = np.zeros((n, NUM_LABELS), np.uint8)
    colon, stomach = LABEL_INDEX["colon"], LABEL_INDEX["stomach"]
    labels[:, [colon, stomach]] = rng.random((n, 2)) < 0.3
    frame = np.full((n, NUM_LABELS), 0.5, np.float32)
    frame[:, [colon, stomach]] = _noisy(labels[:, [colon, stomach]], 1.5, rng, 1)
    temporal = frame.copy()
    temporal[:, colon] = _noisy(labels[:, colon], colon_lift, rng, 1)
    temporal[:, stomach] = _noisy(labels[:, stomach], stomach_lift, rng, 1)
    return labels, frame, temporal, videos


def test_the_regions_share_one_route_chosen_on_their_mean_gain():
    rule = route_rule_of(min_gain=0.02, block_frames=100)
    labels, frame, temporal, videos = _regions(colon_lift=6, stomach_lift=1.5)  # stomach: equal on average
    grouped = choose_routes(labels, frame, temporal, videos, rule)
    shared = {grouped.routes[label] for label in REGIONS}  # mouth, no positive, goes along
    assert len(shared) == 1 and shared != {"frame"}
    assert grouped.evidence["colon"]["route_group"] == "regions"
    alone = choose_routes(labels, frame, temporal, videos, route_rule_of(min_gain=0.02, block_frames=100,
                                                                     regions_together=False))
    assert alone.routes["colon"] == "temporal" and alone.routes["mouth"] == "frame"
    # the mean, not the best member: a stomach the temporal route ranks backwards holds the group back
    labels, frame, temporal, videos = _regions(colon_lift=6, stomach_lift=-6)
    assert {choose_routes(labels, frame, temporal, videos, rule).routes[label] for label in REGIONS} == {"frame"}
    assert choose_routes(labels, frame, temporal, videos, route_rule_of(min_gain=0.02, block_frames=100,
                                                                    regions_together=False)).routes["colon"] == "temporal"


def test_invalid_rows_are_left_out_of_the_evidence_and_the_bootstrap():
    labels, frame, temporal, videos = _one_lucky_video()
    gapped = temporal.copy()
    gapped[:50] = np.nan  # invalid frames: NaN in every label
    rule = route_rule_of(min_gain=0.02, block_frames=100)
    choice = choose_routes(labels, frame, gapped, videos, rule)
    kept = choose_routes(labels[50:], frame[50:], temporal[50:], videos[50:], rule)
    assert choice.evidence == kept.evidence and choice.routes == kept.routes


def _one_event(n_videos: int = 20, per_video: int = 100, events: int = 1):
    """Hematin: positives in `events` runs of 10 frames (in the first `events` videos); the
    temporal route ranks them first, the frame route ranks them at chance. (labels, frame,
    temporal, videos)."""
    rng = np.random.default_rng(2)
    n = n_videos * per_video
    videos = np.repeat([f"v{i:02d}" for i in range(n_videos)], per_video)
    labels = np.zeros((n, NUM_LABELS), np.uint8)
    k = LABEL_INDEX["hematin"]
    for e in range(events):
        labels[e * per_video + 40: e * per_video + 50, k] = 1
    frame = np.full((n, NUM_LABELS), 0.5, np.float32)
    frame[:, k] = rng.random(n)
    temporal = frame.copy()
    temporal[labels[:, k] == 1, k] = 0.999
    return labels, frame, temporal, videos


@pytest.mark.parametrize("events, moves", [(1, False), (4, False), (5, True), (8, True)])
def test_a_gain_on_fewer_positive_blocks_than_the_minimum_is_no_evidence(events, moves):
    labels, frame, temporal, videos = _one_event(events=events)
    rule = route_rule_of(min_gain=0.02, block_frames=100)
    choice = choose_routes(labels, frame, temporal, videos, rule)
    evidence = choice.evidence["hematin"]
    assert evidence["positive_blocks"] == events
    assert evidence["temporal_ap"] - evidence["frame_ap"] > 0.5  # a large observed gain either way
    assert (choice.routes["hematin"] != "frame") == moves
    # one event: the bootstrap alone, over the replicates that draw it, passes it
    assert choose_routes(labels, frame, temporal, videos, route_rule_of(min_gain=0.02, block_frames=100,
                                                                    min_positive_blocks=1)).routes["hematin"] != "frame"
    # a block stops at its video's end: blocks longer than a video still count one per video
    assert choose_routes(labels, frame, temporal, videos,
                         route_rule_of(block_frames=200)).evidence["hematin"]["positive_blocks"] == events
    # ... and two events in one block are one
    assert choose_routes(labels, frame, temporal, np.zeros(len(labels)),
                         route_rule_of(block_frames=10_000)).evidence["hematin"]["positive_blocks"] == 1
