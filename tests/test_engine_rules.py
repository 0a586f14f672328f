"""Rules of the score engine that a mutation sweep (each comparison and offset of
vce/post/engine.py, now the vce/post/engine package, flipped, the engine tests run) found no test held."""

import numpy as np
import pandas as pd
import pytest
from test_engine import _engine_params, _table, _videos

from vce.core.labels import LABELS
from vce.post.engine import cross_fit, engine_submission, fit_engine, tuning_timeline
from vce.post.engine.candidates import _pieces, anchored_candidates, region_candidates, run_candidates
from vce.post.engine.fit import timeline_of_videos
from vce.post.engine.gate import fit_presence_model
from vce.post.engine.variants import RUN, learn_anchors, learn_variants
from vce.post.timeline import build_timeline

POLYP = LABELS.index("polyp")
PATH_REGIONS = np.repeat([0, 1, 2, 3, 4], [10, 10, 30, 40, 10])  # the small intestine starts at 50


def _timeline_and_path(extra=None, video_id="v"):
    timeline = build_timeline(_table(PATH_REGIONS, video_id, extra), max_reach=1)
    path = np.full(len(timeline.observed), -1)
    path[timeline.observed] = PATH_REGIONS
    return timeline, path


def test_anchored_events_take_offset_and_length_from_the_boundary():
    timeline, path = _timeline_and_path()
    c = anchored_candidates(timeline, path, "pylorus", [(-2, 3), (0, 1)])
    assert c.events[0] == [(48, 50), (50, 50)] and c.clinical[0] == [(48, 50)]


def test_one_frame_landmarks_are_learned_with_their_length():
    timeline = build_timeline(pd.concat([_table(PATH_REGIONS, f"v{v}") for v in range(3)], ignore_index=True), max_reach=1)
    path = np.full(len(timeline.observed), -1)
    path[timeline.observed] = np.tile(PATH_REGIONS, 3)
    gt = {"videos": [{"video_id": f"v{v}", "events": [{"start": 48, "end": 48, "label": ["pylorus"]}]} for v in range(3)]}
    assert learn_anchors(timeline, path, gt, "pylorus", 3) == [[-2, 1]]


def test_at_most_top_k_runs_per_video_strongest_first_and_top3_is_the_mean_of_the_three_strongest():
    polyp = np.full(len(PATH_REGIONS), 0.02)
    for start, p in ((55, 0.6), (62, 0.9), (70, 0.7), (78, 0.8)):
        polyp[start:start + 3] = p
    timeline, _ = _timeline_and_path({"polyp": polyp})
    c = run_candidates(timeline, POLYP, 0.5, 1, 1, 2)
    assert c.events[0] == [(62, 64), (78, 80)]
    assert c.features["count"][0] == 4 and c.features["frames"][0] == 12
    assert c.features["top3"][0] == pytest.approx((0.9 + 0.8 + 0.7) / 3, abs=1e-6)


def test_a_one_frame_variant_and_a_cut_at_the_runs_last_frame_are_kept():
    timeline, path = _timeline_and_path()
    c = region_candidates(timeline, path, 3, [(RUN, 39, 0)], {0: [89]})  # the run is 50-89
    assert c.events[0] == [(50, 89), (89, 89), (50, 88)]
    assert _pieces(50, 89, [89]) == [(50, 88), (89, 89)]
    assert _pieces(50, 89, [60, 70, 75], "shortest") == [(70, 74), (50, 59), (60, 69), (75, 89)]  # ties in time order
    assert _pieces(50, 89, [60, 70, 75], "longest") == [(75, 89), (50, 59), (60, 69), (70, 74)]
    # A variant that repeats the run or inverts it is dropped.
    assert region_candidates(timeline, path, 3, [(RUN, 0, 0), (RUN, 50, 0)], None).events[0] == [(50, 89)]


def _fragment_gt(videos, fragment_videos):
    """Small intestine runs 50-89 in each video; in `fragment_videos` the ground truth ends it 3
    frames early (86-89 another label's)."""
    out = []
    for v in range(videos):
        end = 86 if v in fragment_videos else 89
        out.append({"video_id": f"v{v}", "events": [{"start": 50, "end": end, "label": ["small intestine"]}]})
    return {"videos": out}


def test_variants_need_two_tuning_videos_and_stop_at_n():
    timeline = build_timeline(pd.concat([_table(PATH_REGIONS, f"v{v}") for v in range(4)], ignore_index=True), max_reach=1)
    path = np.full(len(timeline.observed), -1)
    path[timeline.observed] = np.tile(PATH_REGIONS, 4)
    assert learn_variants(timeline, path, _fragment_gt(4, {0}), 3, 5, 100) == []  # one video only: not learned
    assert learn_variants(timeline, path, _fragment_gt(4, {0, 1}), 3, 5, 100)[0] == [RUN, 0, -3]
    gt = _fragment_gt(4, {0, 1})
    gt["videos"][2]["events"][0]["start"] = 53  # a second pattern, in videos 2 and 3
    gt["videos"][3]["events"][0]["start"] = 53
    assert len(learn_variants(timeline, path, gt, 3, 1, 100)) == 1
    assert len(learn_variants(timeline, path, gt, 3, 5, 100)) == 2


def test_presence_model_needs_two_videos_on_each_side_and_two_are_enough():
    x = np.array([[0.0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0], [2, 0, 0, 0, 0, 0], [3, 0, 0, 0, 0, 0.0]])
    assert fit_presence_model(x, np.array([1.0, 1.0, -1.0, -1.0])) is not None
    assert fit_presence_model(x, np.array([1.0, -1.0, -1.0, -1.0])) is None
    # A video where the decision changes nothing (gain 0) is on neither side.
    assert fit_presence_model(x, np.array([1.0, 1.0, 0.0, -1.0])) is None
    assert fit_presence_model(x, np.array([1.0, 0.0, -1.0, -1.0])) is None


def test_recentre_off_leaves_the_probabilities_as_they_are():
    frame_probs, gt = _videos(4, seed=2)
    off = _engine_params(recentre=False)
    assert fit_engine(tuning_timeline(frame_probs, off), gt, off).centres is None
    on = _engine_params(recentre=True)
    assert fit_engine(tuning_timeline(frame_probs, on), gt, on).centres is not None


def test_without_region_cuts_the_shadow_runs_cut_nothing():
    frame_probs, gt = _videos(2, seed=3, polyp_every=1)
    params = _engine_params(min_gain_sqrt_videos=1.5, shadow_cuts=True, region_variants=0, region_cuts=False)
    engine = fit_engine(tuning_timeline(frame_probs, params), gt, params)
    assert engine.policies["polyp"].shadow is not None
    submission, _ = engine_submission(frame_probs, engine)
    for video in submission["videos"]:
        intestine = [e for e in video["events"] if e["label"] == ["small intestine"]]
        assert len(intestine) == 1  # the run alone


def test_cross_fit_needs_two_videos():
    frame_probs, gt = _videos(2, seed=9)
    params = _engine_params(cross_fit=False)
    timeline = tuning_timeline(frame_probs, params)
    assert set(cross_fit(timeline, gt, params)) == {"map@0.5", "map@0.95", "empty"}
    assert cross_fit(timeline_of_videos(timeline, [0]), gt, params) is None


def test_the_tuning_timeline_reaches_half_the_widest_median_window():
    frame_probs, _ = _videos(2, seed=1)
    assert tuning_timeline(frame_probs, _engine_params(median_windows=[1, 7, 31])).max_reach == 15
    assert tuning_timeline(frame_probs, _engine_params(median_windows=[1])).max_reach == 1


def test_each_half_of_the_duration_prior_works_alone_and_an_unseen_region_is_free():
    from vce.post.engine.regions import learn_durations, region_truth

    frame_probs, gt = _videos(4, seed=5)
    timeline = tuning_timeline(frame_probs, _engine_params())
    truth = region_truth(timeline, gt)
    low, high = learn_durations(timeline, truth, 0.0, 2.0)  # a maximum only
    assert low == [1] * 5 and all(h > 1 for h in high)
    low, high = learn_durations(timeline, truth, 0.5, 0.0)  # a minimum only
    assert all(lo > 1 for lo in low) and high == [len(truth) + 1] * 5
    truth[truth == 4] = -1  # no colon in the training truth: not constrained
    low, high = learn_durations(timeline, truth, 0.5, 2.0)
    assert low[4] == 1 and high[4] == len(truth) + 1


def test_a_two_region_calibration_is_one_logistic_split_in_two():
    """With only two regions in the tuning truth, the binary regression's weights w give the two
    rows -w/2 and +w/2 (a softmax over two classes), the regions never seen an almost-never intercept."""
    from vce.post.anatomy import EMISSION_FLOOR
    from vce.post.engine.regions import fit_calibration

    regions = np.repeat([2, 3], [300, 300])
    table = _table(regions, "v")
    timeline = build_timeline(table, max_reach=1)
    truth = np.full(len(timeline.observed), -1)
    truth[timeline.observed] = regions
    coef, intercept = fit_calibration(timeline, truth, n_frames=1000)
    coef, intercept = np.asarray(coef), np.asarray(intercept)
    assert coef[2] == pytest.approx(-coef[3]) and np.abs(coef[3]).max() > 0.1
    assert intercept[2] == pytest.approx(-intercept[3])
    assert (coef[[0, 1, 4]] == 0).all() and intercept[[0, 1, 4]] == pytest.approx([np.log(EMISSION_FLOOR)] * 3)


def test_cut_times_are_each_videos_distinct_event_edges_sorted_from_lists_and_span_arrays():
    from vce.post.engine.apply import _cut_times
    from vce.post.engine.candidates import Candidates, SpanLists

    lists = Candidates([], [[(10, 19), (40, 49)], [], [(5, 5)]], np.zeros(3))
    # Video 0: (20, 29) and (10, 19) again; video 2: nothing; video 1: (7, 8).
    arrays = Candidates([], SpanLists(np.array([0, 2, 3, 3]), np.array([20, 10, 7]), np.array([29, 19, 8])), np.zeros(3))
    cuts = _cut_times([lists, arrays])
    assert sorted(cuts) == [0, 1, 2]
    assert cuts[0].tolist() == [10, 20, 30, 40, 50] and cuts[1].tolist() == [7, 9] and cuts[2].tolist() == [5, 6]


def test_gated_span_lists_keep_the_spans_of_the_passing_videos_only():
    from vce.post.engine.candidates import Candidates, SpanLists
    from vce.post.engine.gate import gated

    spans = SpanLists(np.array([0, 2, 3, 5]), np.array([1, 5, 9, 20, 30]), np.array([2, 6, 9, 25, 31]))
    assert spans.only(np.array([True, False, True])) == [[(1, 2), (5, 6)], [], [(20, 25), (30, 31)]]
    video, starts, ends = spans.arrays()
    assert video.tolist() == [0, 0, 1, 2, 2] and starts.tolist() == [1, 5, 9, 20, 30] and ends.tolist() == [2, 6, 9, 25, 31]
    c = gated(Candidates(spans, spans, np.array([0.9, 0.1, -np.inf])), 0.5)
    assert isinstance(c.events, SpanLists)
    assert list(c.events) == [[(1, 2), (5, 6)], [], []] and list(c.clinical) == list(c.events)
    assert list(gated(Candidates(spans, spans, np.array([0.9, 0.1, -np.inf])), None).events) == [[(1, 2), (5, 6)], [(9, 9)], []]


def test_many_cut_pieces_of_equal_length_stay_in_time_order():
    """Ties among more pieces than numpy's insertion-sort cut-off (16): an unstable sort reorders them."""
    lengths = np.random.default_rng(0).choice([2, 3], 40)
    edges = np.cumsum(np.r_[0, lengths])
    pieces = [(int(a), int(b) - 1) for a, b in zip(edges[:-1], edges[1:])]
    want = sorted(pieces, key=lambda p: -(p[1] - p[0]))  # Python's sort is stable: time order within a length
    assert _pieces(0, int(edges[-1]) - 1, edges[1:-1].tolist()) == want
    assert _pieces(0, int(edges[-1]) - 1, edges[1:-1], "shortest") == sorted(pieces, key=lambda p: p[1] - p[0])
