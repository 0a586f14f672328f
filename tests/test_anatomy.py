import itertools

import numpy as np
import pandas as pd
import pytest
from conftest import repo_params, section_params

from vce.core.labels import LABELS, REGIONS
from vce.core.params import ParamsError, from_dict
from vce.post.anatomy import boundaries, monotone_path, region_scores
from vce.post.events import EventParams, probs_to_submission

ON = {label: 0.5 for label in LABELS}
VITERBI = dict(style="per_label", median_window=1, fill_gap=0, min_length=1, presence="none", anatomy="viterbi", switch_penalty=2.0)


def brute_force(scores, penalty):
    """Best non-decreasing path by enumeration (small T, K only)."""
    n_frames, n_states = scores.shape
    best = (-np.inf, None)
    for path in itertools.combinations_with_replacement(range(n_states), n_frames):
        value = scores[np.arange(n_frames), path].sum() - penalty * np.count_nonzero(np.diff(path))
        best = max(best, (value, path), key=lambda item: item[0])
    return best


@pytest.mark.parametrize("seed", range(12))
def test_monotone_path_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    n_frames, n_states = int(rng.integers(1, 8)), int(rng.integers(1, 6))
    scores = rng.normal(size=(n_frames, n_states)) * 3
    penalty = float(rng.choice([0.0, 0.5, 2.0, 10.0]))
    path, total = monotone_path(scores, penalty)
    expected, _ = brute_force(scores, penalty)
    assert total == pytest.approx(expected)
    # The returned path achieves the returned total and never goes back.
    achieved = scores[np.arange(n_frames), path].sum() - penalty * np.count_nonzero(np.diff(path))
    assert achieved == pytest.approx(total)
    assert (np.diff(path) >= 0).all()


def brute_force_durations(scores, penalty, low, high):
    """Best non-decreasing path whose every visited state lasts low[k]..high[k] frames (enumeration)."""
    n_frames, n_states = scores.shape
    best = (-np.inf, None)
    for path in itertools.combinations_with_replacement(range(n_states), n_frames):
        counts = np.bincount(path, minlength=n_states)
        if any(c and not low[k] <= c <= high[k] for k, c in enumerate(counts)):
            continue
        value = scores[np.arange(n_frames), path].sum() - penalty * np.count_nonzero(np.diff(path))
        best = max(best, (value, path), key=lambda item: item[0])
    return best


@pytest.mark.parametrize("seed", range(12))
def test_duration_prior_path_matches_brute_force(seed):
    rng = np.random.default_rng(100 + seed)
    n_frames, n_states = int(rng.integers(2, 8)), 3
    scores = rng.normal(size=(n_frames, n_states)) * 3
    low = rng.integers(1, 4, n_states)
    high = low + rng.integers(0, 4, n_states)
    expected, best_path = brute_force_durations(scores, 0.5, low, high)
    path, total = monotone_path(scores, 0.5, low, high)
    if best_path is None:  # nothing fits: decoded without the prior
        assert path.tolist() == monotone_path(scores, 0.5)[0].tolist()
        return
    assert total == pytest.approx(expected)
    counts = np.bincount(path, minlength=n_states)
    assert all(not c or low[k] <= c <= high[k] for k, c in enumerate(counts)) and (np.diff(path) >= 0).all()


def test_duration_prior_changes_the_decoded_path():
    # A 2-frame blip of state 1 between 0 and 2: decoded as it is, dropped (skipped) when state 1
    # must last 4 frames, and a state capped at 3 frames ends early.
    scores = np.full((10, 3), -2.0)
    scores[:4, 0] = 0.0
    scores[4:6, 1] = 0.0
    scores[6:, 2] = 0.0
    scores[4:6, 2] = -1.0  # the blip's frames lean to state 2 over state 0
    assert monotone_path(scores, 0.1)[0].tolist() == [0, 0, 0, 0, 1, 1, 2, 2, 2, 2]
    assert monotone_path(scores, 0.1, [1, 4, 1])[0].tolist() == [0, 0, 0, 0, 2, 2, 2, 2, 2, 2]
    capped = monotone_path(scores, 0.1, None, [3, 10, 10])[0].tolist()
    assert capped.count(0) == 3 and capped[3] == 1
    # A video shorter than every minimum is decoded without the prior.
    assert monotone_path(scores, 0.1, [20, 20, 20])[0].tolist() == monotone_path(scores, 0.1)[0].tolist()


def test_monotone_path_ignores_a_noise_burst_that_would_go_back():
    truth = np.repeat([0, 2, 3, 4], [20, 30, 100, 50])
    probs = np.full((len(truth), 5), 0.05)
    probs[np.arange(len(truth)), truth] = 0.9
    probs[80:86] = 0.05
    probs[80:86, 4] = 0.9  # a colon burst inside the small intestine
    path, _ = monotone_path(region_scores(probs), switch_penalty=5.0)
    assert (path == truth).all()
    assert list(boundaries(path, 3)) == [50]  # stomach -> small intestine


def video(n, truth, video_id="v", **label_probs):
    table = pd.DataFrame({"video_id": video_id, "t": np.arange(n, dtype=np.int64)})
    rng = np.random.default_rng(0)
    for label in LABELS:
        table[label] = np.float32(0.05)
    for k, region in enumerate(REGIONS):
        table[region] = np.where(truth == k, 0.8, 0.1).astype(np.float32) + rng.random(n).astype(np.float32) * 0.15
    for label, values in label_probs.items():
        table[label.replace("_", " ")] = np.asarray(values, np.float32)
    return table


def events_by_label(sub, video_id="v"):
    found = {}
    for event in next(v for v in sub["videos"] if v["video_id"] == video_id)["events"]:
        for label in event["label"]:
            found.setdefault(label, []).append((event["start"], event["end"]))
    return {label: sorted(spans) for label, spans in found.items()}


def test_viterbi_gives_one_region_per_frame_in_order():
    n = 300
    truth = np.repeat([0, 1, 2, 3, 4], [10, 20, 70, 120, 80])
    table = video(n, truth)
    noisy = table["colon"].to_numpy().copy()
    noisy[100:110] = 0.95  # would fire colon inside the small intestine without decoding
    table["colon"] = noisy
    free = events_by_label(probs_to_submission(table, ON, section_params(EventParams, "events", **{**VITERBI, "anatomy": "none"})))
    assert len(free["colon"]) == 2
    decoded = events_by_label(probs_to_submission(table, ON, section_params(EventParams, "events", **VITERBI)))
    spans = [decoded[region] for region in REGIONS]
    assert spans == [[(0, 9)], [(10, 29)], [(30, 99)], [(100, 219)], [(220, 299)]]
    # Exactly one region per frame, in anatomical order.
    covered = np.zeros(n, int)
    last_end = -1
    for region in REGIONS:
        for start, end in decoded[region]:
            assert start == last_end + 1
            covered[start : end + 1] += 1
            last_end = end
    assert (covered == 1).all()


def test_landmarks_fire_only_near_their_boundary():
    n = 300
    truth = np.repeat([0, 1, 2, 3, 4], [10, 20, 70, 120, 80])  # pylorus boundary at 100
    pylorus = np.full(n, 0.05)
    pylorus[98:102] = 0.9  # at the boundary
    pylorus[250:254] = 0.9  # far away inside the colon: a false event
    table = video(n, truth, pylorus=pylorus)
    free = events_by_label(probs_to_submission(table, ON, section_params(EventParams, "events", **{**VITERBI, "anatomy": "none"})))
    assert free["pylorus"] == [(98, 101), (250, 253)]
    window = events_by_label(probs_to_submission(table, ON, section_params(EventParams, "events", **VITERBI, landmark_window=10)))
    assert window["pylorus"] == [(98, 101)]
    peak = events_by_label(probs_to_submission(table, ON, section_params(EventParams, "events", **VITERBI, landmarks="peak", landmark_window=10, landmark_length=5)))
    assert len(peak["pylorus"]) == 1 and 96 <= peak["pylorus"][0][0] <= 100
    assert peak["pylorus"][0][1] - peak["pylorus"][0][0] == 4
    # No decoded stomach -> small intestine crossing within reach: no pylorus at all.
    # A zero window is the crossing frame alone (100): the run 98-101 covers it and stays.
    far = events_by_label(probs_to_submission(table, ON, section_params(EventParams, "events", **VITERBI, landmark_window=0)))
    assert far["pylorus"] == [(98, 101)]


def test_landmark_window_edge_is_exact():
    # Crossing at 100, window 5: [95, 105]. A run ending at 94 or starting at 106 is outside.
    n = 300
    truth = np.repeat([0, 1, 2, 3, 4], [10, 20, 70, 120, 80])
    for span, kept in (((90, 94), False), ((106, 109), False), ((91, 95), True), ((105, 108), True)):
        pylorus = np.full(n, 0.05)
        pylorus[span[0] : span[1] + 1] = 0.9
        found = events_by_label(probs_to_submission(video(n, truth, pylorus=pylorus), ON,
                                                    section_params(EventParams, "events", **VITERBI, landmark_window=5)))
        assert found.get("pylorus") == ([span] if kept else None), span


def test_videos_are_decoded_separately():
    n = 120
    first = video(n, np.repeat([3, 4], [60, 60]), video_id="a")
    second = video(n, np.repeat([2, 3], [40, 80]), video_id="b")
    sub = probs_to_submission(pd.concat([first, second], ignore_index=True), ON, section_params(EventParams, "events", **VITERBI))
    assert events_by_label(sub, "a")["colon"] == [(60, 119)]
    assert events_by_label(sub, "b")["stomach"] == [(0, 39)]
    assert "colon" not in events_by_label(sub, "b")


def test_anatomy_params_are_checked():
    with pytest.raises(ParamsError, match="events.anatomy"):
        from_dict(EventParams, {**repo_params()["events"], "anatomy": "hmm"}, "events")
    with pytest.raises(ParamsError, match="events.landmarks"):
        from_dict(EventParams, {**repo_params()["events"], "landmarks": "everywhere"}, "events")
    with pytest.raises(ParamsError, match="events.emission"):
        from_dict(EventParams, {**repo_params()["events"], "emission": "labels"}, "events")
    with pytest.raises(ParamsError, match="events.landmark_length"):
        from_dict(EventParams, {**repo_params()["events"], "landmark_length": 0}, "events")


def test_decoding_a_galar_sized_video_returns_the_path_it_scores():
    # 400,000 frames (a long Galar video) in one vectorised pass (no timing assert on a shared
    # machine): the path never goes back and achieves the total it reports.
    n = 400_000
    rng = np.random.default_rng(0)
    scores = region_scores(rng.random((n, 5)))
    path, total = monotone_path(scores, 10.0)
    assert (np.diff(path) >= 0).all()
    achieved = scores[np.arange(n), path].sum() - 10.0 * np.count_nonzero(np.diff(path))
    assert achieved == pytest.approx(total)


def test_thresholds_still_decide_whether_a_region_fires():
    n = 300
    truth = np.repeat([0, 1, 2, 3, 4], [10, 20, 70, 120, 80])
    table = video(n, truth)
    off = {**ON, "mouth": 1.01}  # switched off (as threshold tuning does for absent labels)
    decoded = events_by_label(probs_to_submission(table, off, section_params(EventParams, "events", **VITERBI)))
    assert "mouth" not in decoded and decoded["esophagus"] == [(10, 29)]


def test_runs_emission_follows_the_thresholded_decisions():
    # Mouth is under-confident (0.35 on its frames, esophagus 0.4 there): renormalised
    # probabilities decode it as esophagus, its own threshold (0.3) does not.
    n = 200
    truth = np.repeat([0, 1, 2, 3], [30, 30, 60, 80])
    table = video(n, truth)
    table["mouth"] = np.where(truth == 0, 0.35, 0.05).astype(np.float32)
    table["esophagus"] = np.where(truth == 1, 0.8, np.where(truth == 0, 0.4, 0.1)).astype(np.float32)
    thresholds = {**ON, "mouth": 0.3, "esophagus": 0.6}
    by_probs = events_by_label(probs_to_submission(table, thresholds, section_params(EventParams, "events", **VITERBI)))
    assert "mouth" not in by_probs  # decoded as esophagus, and mouth's runs never overlap a mouth segment
    by_runs = events_by_label(probs_to_submission(table, thresholds, section_params(EventParams, "events", **VITERBI, emission="runs")))
    assert by_runs["mouth"] == [(0, 29)] and by_runs["esophagus"] == [(30, 59)]


def test_a_boundary_is_where_the_path_first_reaches_the_region_even_from_the_mouth():
    assert boundaries(np.array([0, 0, 2, 2, 3]), 2).tolist() == [2]  # mouth straight to the stomach
    assert boundaries(np.array([0, 1, 1, 3, 4]), 2).tolist() == [3]  # the stomach skipped: still crossed
    assert boundaries(np.array([1, -1, 2, 2]), 2).tolist() == []  # after a separator: not a crossing


def test_a_peak_landmark_is_centred_on_the_windows_most_probable_frame():
    n = 300
    truth = np.repeat([0, 1, 2, 3, 4], [10, 20, 70, 120, 80])  # pylorus boundary at 100, window [90, 110]
    peak_params = section_params(EventParams, "events", **VITERBI, landmarks="peak", landmark_window=10, landmark_length=5)
    for run, peak, expected in (((98, 101), 99, (97, 101)), ((108, 110), 110, (108, 110))):
        pylorus = np.full(n, 0.05)
        pylorus[run[0] : run[1] + 1] = 0.9
        pylorus[peak] = 0.95
        found = events_by_label(probs_to_submission(video(n, truth, pylorus=pylorus), ON, peak_params))
        assert found["pylorus"] == [expected], run  # 5 frames centred on the peak, clipped to the window
