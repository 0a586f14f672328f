import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import repo_params, section_params

from vce.core.labels import LABELS
from vce.core.params import ParamsError, from_dict
from vce.eval.score import check_submission, score
from vce.post.events import (
    EventParams,
    labels_to_submission,
    probs_to_submission,
    write_xlsx,
)
from vce.post.timeline import event_time, labels_on_time

FIXTURES = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures"
OFF = {label: 0.5 for label in LABELS}
RAW = dict(median_window=1, fill_gap=0, min_length=1, presence="none")


def frames(n, video_id="v", t0=0, **label_values):
    """n frames of one video; label_values: label -> per-frame probabilities (others 0)."""
    table = pd.DataFrame({"video_id": video_id, "t": np.arange(t0, t0 + n, dtype=np.int64)})
    for label in LABELS:
        table[label] = np.asarray(label_values.get(label.replace(" ", "_"), np.zeros(n)), dtype=np.float32)
    return table


def pattern(n, *spans, value=0.9):
    probs = np.zeros(n)
    for start, end in spans:
        probs[start : end + 1] = value
    return probs


def events_of(sub, video="v"):
    video = next(v for v in sub["videos"] if v["video_id"] == video)
    return [(e["start"], e["end"], e["label"]) for e in video["events"]]


def test_threshold_and_runs_without_smoothing():
    table = frames(30, mouth=pattern(30, (3, 7), (20, 21)))
    sub = probs_to_submission(table, OFF, section_params(EventParams, "events", **RAW))
    assert sorted(events_of(sub)) == [(3, 7, ["mouth"]), (20, 21, ["mouth"])]
    check_submission(sub)


def test_median_filter_removes_spikes_and_fills_holes():
    probs = pattern(40, (10, 25))
    probs[3] = 0.9  # isolated spike
    probs[15] = 0.0  # one-frame hole
    table = frames(40, mouth=probs)
    sub = probs_to_submission(table, OFF, section_params(EventParams, "events", **{**RAW, "median_window": 3}))
    assert events_of(sub) == [(10, 25, ["mouth"])]


def test_fill_gap_bridges_short_gaps_only():
    table = frames(60, colon=pattern(60, (0, 9), (15, 24), (31, 40)))  # gaps of 5 and 6 frames
    sub = probs_to_submission(table, OFF, section_params(EventParams, "events", **{**RAW, "fill_gap": 5}))
    assert sorted(events_of(sub)) == [(0, 24, ["colon"]), (31, 40, ["colon"])]


def test_min_length_drops_short_runs():
    table = frames(40, polyp=pattern(40, (2, 3), (10, 12)))
    sub = probs_to_submission(table, OFF, section_params(EventParams, "events", **{**RAW, "min_length": 3}))
    assert events_of(sub) == [(10, 12, ["polyp"])]


def test_tuple_style_cuts_where_the_label_set_changes():
    table = frames(30, stomach=pattern(30, (0, 19)), blood=pattern(30, (5, 9)))
    tuple_sub = probs_to_submission(table, OFF, section_params(EventParams, "events", **RAW, style="tuple"))
    assert sorted(events_of(tuple_sub)) == [(0, 4, ["stomach"]), (5, 9, ["blood", "stomach"]), (10, 19, ["stomach"])]
    per_label = probs_to_submission(table, OFF, section_params(EventParams, "events", **RAW, style="per_label"))
    assert sorted(events_of(per_label)) == [(0, 19, ["stomach"]), (5, 9, ["blood"])]
    split = probs_to_submission(table, OFF, section_params(EventParams, "events", **RAW, style="tuple", multi_label=False))
    assert sorted(events_of(split)) == [(0, 4, ["stomach"]), (5, 9, ["blood"]), (5, 9, ["stomach"]), (10, 19, ["stomach"])]


def test_events_are_ordered_by_confidence():
    probs = pattern(50, (0, 4), value=0.6) + pattern(50, (20, 24), value=0.95) + pattern(50, (40, 44), value=0.8)
    sub = probs_to_submission(frames(50, ulcer=probs), OFF, section_params(EventParams, "events", **RAW))
    assert [e[0] for e in events_of(sub)] == [20, 40, 0]


def test_multi_label_events_rank_by_mean_confidence():
    # Segment 0-4 holds ulcer (0.95) and polyp (0.55): mean 0.75, below the lone polyp run at
    # 20-24 (0.85); ranked by the strongest label instead it would come first.
    ulcer = pattern(40, (0, 4), value=0.95)
    polyp = pattern(40, (0, 4), value=0.55) + pattern(40, (20, 24), value=0.85)
    sub = probs_to_submission(frames(40, ulcer=ulcer, polyp=polyp), OFF,
                              section_params(EventParams, "events", **RAW, style="tuple", multi_label=True))
    assert events_of(sub) == [(20, 24, ["polyp"]), (0, 4, ["polyp", "ulcer"])]


def test_galar_events_are_timed_by_index_test_events_by_frame():
    index = pd.DataFrame({"video_id": ["g", "g", "g", "n", "n"], "index": [0, 1, 2, 0, 1],
                          "frame": [10, 15, 20, 49, 50], "event_unit": ["index"] * 3 + ["frame"] * 2})
    assert event_time(index).tolist() == [0, 1, 2, 49, 50]
    for label in LABELS:
        index[label] = 0
    index["blood"] = [0, 1, 1, 1, 0]
    gt = labels_to_submission(labels_on_time(index))
    assert {v["video_id"]: v["events"] for v in gt["videos"]} == {
        "g": [{"start": 1, "end": 2, "label": ["blood"]}], "n": [{"start": 49, "end": 49, "label": ["blood"]}]}


def test_presence_max_drops_weak_labels_per_video():
    strong = frames(20, "a", mouth=pattern(20, (0, 9), value=0.95))
    weak = frames(20, "b", mouth=pattern(20, (0, 9), value=0.6))
    table = pd.concat([strong, weak], ignore_index=True)
    params = section_params(EventParams, "events", **{**RAW, "presence": "max", "presence_threshold": 0.8})
    sub = probs_to_submission(table, OFF, params)
    assert events_of(sub, "a") == [(0, 9, ["mouth"])]
    assert events_of(sub, "b") == []  # the video is still present, without events
    per_label = section_params(EventParams, "events", **{**RAW, "presence": "max", "presence_threshold": 0.8, "per_label": {"mouth": {"presence_threshold": 0.5}}})
    assert events_of(probs_to_submission(table, OFF, per_label), "b") == [(0, 9, ["mouth"])]


def test_presence_frames_needs_enough_event_frames():
    table = frames(40, erosion=pattern(40, (0, 3), (10, 12)))
    sub = probs_to_submission(table, OFF, section_params(EventParams, "events", **{**RAW, "presence": "frames", "presence_min_frames": 8}))
    assert events_of(sub) == []
    sub = probs_to_submission(table, OFF, section_params(EventParams, "events", **{**RAW, "presence": "frames", "presence_min_frames": 7}))
    assert len(events_of(sub)) == 2


def test_invalid_frames_and_missing_times_are_gaps():
    table = frames(30, blood=pattern(30, (0, 29)))
    table.loc[10:11, "valid"] = False
    table["valid"] = table["valid"].fillna(True).astype(bool)
    table.loc[10:11, "blood"] = np.nan
    sub = probs_to_submission(table, OFF, section_params(EventParams, "events", **RAW))
    assert sorted(events_of(sub)) == [(0, 9, ["blood"]), (12, 29, ["blood"])]
    bridged = probs_to_submission(table, OFF, section_params(EventParams, "events", **{**RAW, "fill_gap": 2}))
    assert events_of(bridged) == [(0, 29, ["blood"])]
    # Missing times (a step of 4 between rows) are a gap of 3 frames.
    stepped = frames(20, blood=pattern(20, (0, 19))).drop(index=[7, 8, 9]).sample(frac=1, random_state=0)
    assert sorted(events_of(probs_to_submission(stepped, OFF, section_params(EventParams, "events", **RAW)))) == [(0, 6, ["blood"]), (10, 19, ["blood"])]
    assert events_of(probs_to_submission(stepped, OFF, section_params(EventParams, "events", **{**RAW, "fill_gap": 3}))) == [(0, 19, ["blood"])]


def test_videos_do_not_bleed_into_each_other_and_all_are_present():
    a = frames(10, "a", colon=pattern(10, (5, 9)))
    b = frames(10, "b", t0=10, colon=pattern(10, (0, 4)))
    quiet = frames(10, "c")
    sub = probs_to_submission(pd.concat([a, b, quiet]), OFF, section_params(EventParams, "events", median_window=7, fill_gap=5, min_length=1, presence="none"))
    assert [v["video_id"] for v in sub["videos"]] == ["a", "b", "c"]
    assert events_of(sub, "a") == [(5, 9, ["colon"])] and events_of(sub, "b") == [(10, 14, ["colon"])]
    assert events_of(sub, "c") == []


def test_labels_to_submission_round_trips_galar_ground_truth():
    gt = json.loads((FIXTURES / "galar_gt_events.json").read_text())
    gt = {"videos": [v for v in gt["videos"] if v["video_id"] in ("2", "6", "9")]}
    rows = []
    for video in gt["videos"]:
        first, last = video["events"][0]["start"], video["events"][-1]["end"]
        table = frames(last - first + 1, video["video_id"], t0=first)
        for event in video["events"]:
            for label in event["label"]:
                table.loc[event["start"] - first : event["end"] - first, label] = 1.0
        rows.append(table)
    rebuilt = labels_to_submission(pd.concat(rows, ignore_index=True))
    # The official file holds one event with an empty label list (video 6, frame 0): no labels, no event.
    expected = {"videos": [{**v, "events": [e for e in v["events"] if e["label"]]} for v in gt["videos"]]}
    assert rebuilt == expected
    result = score(gt, rebuilt)
    assert result["map@0.5"] == 1.0 and result["map@0.95"] == 1.0


def test_write_xlsx_columns(tmp_path):
    sub = {"videos": [{"video_id": "v", "events": [{"start": 1, "end": 4, "label": ["blood", "stomach"]}]}, {"video_id": "w", "events": []}]}
    write_xlsx(sub, tmp_path / "out.xlsx")
    table = pd.read_excel(tmp_path / "out.xlsx", dtype={"video_id": str})
    assert list(table.columns) == ["video_id", "start", "end", "label"]
    assert table.iloc[0].tolist() == ["v", 1, 4, "blood,stomach"]
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())


@pytest.mark.parametrize(
    "values, message",
    [
        ({"median_window": 4}, "events.median_window = 4: must be an odd integer"),
        ({"fill_gap": -1}, "events.fill_gap = -1: must be >= 0"),
        ({"min_length": 0}, "events.min_length = 0: must be >= 1"),
        ({"style": "segments"}, "events.style = 'segments': must be one of 'tuple' or 'per_label'"),
        ({"presence_threshold": 1.5}, "events.presence_threshold = 1.5: must be <= 1"),
        ({"per_label": {"tumour": {}}}, "events.per_label.tumour = {}: unknown label"),
        ({"per_label": {"mouth": {"median_window": 2}}}, "events.per_label.mouth.median_window = 2: must be an odd"),
        ({"per_label": {"mouth": {"colour": 2}}}, "events.per_label.mouth.colour = 2: unknown knob"),
    ],
)
def test_event_params_check_names_the_key(values, message):
    with pytest.raises(ParamsError) as err:
        from_dict(EventParams, {**repo_params()["events"], **values}, "events")
    assert str(err.value).startswith(message)


def test_xlsx_bytes_repeat_for_the_same_events(tmp_path):
    """Same events, same bytes: the DVC hash of the events folder only changes with the events."""
    import time

    from vce.post.events import write_xlsx

    sub = {"videos": [{"video_id": "1", "events": [{"start": 1, "end": 4, "label": ["blood", "colon"]}]}]}
    write_xlsx(sub, tmp_path / "a.xlsx")
    time.sleep(1.1)
    write_xlsx(sub, tmp_path / "b.xlsx")
    assert (tmp_path / "a.xlsx").read_bytes() == (tmp_path / "b.xlsx").read_bytes()


def test_median_window_wider_than_the_whole_timeline():
    """An empty test set (or a timeline built with a smaller reach) is shorter than the window:
    no exception, and the clipped window still takes the majority of what it sees."""
    from vce.post.events import smooth_runs
    from vce.post.timeline import build_timeline

    empty = build_timeline(pd.DataFrame({"video_id": [], "t": [], **{label: [] for label in LABELS}}), max_reach=3)
    starts, ends = smooth_runs(empty, np.zeros(len(empty.observed), bool), 15, 7, 1)
    assert len(starts) == len(ends) == 0
    probs = pd.DataFrame({"video_id": ["a"] * 5, "t": np.arange(5), **{label: [0.0] * 5 for label in LABELS}})
    short = build_timeline(probs, max_reach=1)
    active = short.observed.copy()
    active[np.flatnonzero(short.observed)[0]] = False  # 4 of 5 frames active: the majority everywhere
    starts, ends = smooth_runs(short, active, 15, 0, 1)
    observed = np.flatnonzero(short.observed)
    assert (starts.tolist(), ends.tolist()) == ([observed[0]], [observed[-1]])


def test_the_seeds_median_window_of_7_keeps_a_run_of_4_and_drops_one_of_3():
    """A frame stays active when more than half of the 7 observed frames around it are."""
    table = frames(60, polyp=pattern(60, (10, 12), (30, 33)))
    sub = probs_to_submission(table, OFF, section_params(EventParams, "events", **{**RAW, "median_window": 7}))
    assert events_of(sub) == [(30, 33, ["polyp"])]


def test_a_median_tie_keeps_the_frames_own_state():
    """Beside a missing frame the window of 3 sees 2 observed frames: 1 of 2 active is a tie, and
    the frame keeps its own state (active stays active, inactive stays inactive)."""
    table = frames(10, polyp=pattern(10, (1, 1))).drop(index=[3])  # 1 active (1 of 3 around it), 2 inactive, 3 missing
    sub = probs_to_submission(table, OFF, section_params(EventParams, "events", **{**RAW, "median_window": 3}))
    assert events_of(sub) == []  # frame 2 sees 1 of 2 active: a tie, it stays inactive
    table = frames(10, polyp=pattern(10, (2, 2), (5, 5))).drop(index=[3, 4])  # 2 active beside a 2-frame gap
    sub = probs_to_submission(table, OFF, section_params(EventParams, "events", **{**RAW, "median_window": 3}))
    assert sorted(events_of(sub)) == [(2, 2, ["polyp"]), (5, 5, ["polyp"])]


def test_presence_reads_the_mean_probability_over_the_runs_frames():
    probs = np.zeros(20)
    probs[5:8] = [0.9, 0.7, 0.5]  # one run of 3 frames, mean 0.7
    table = frames(20, mouth=probs)
    for presence_threshold, kept in ((0.69, True), (0.71, False)):
        params = section_params(EventParams, "events",
                                **{**RAW, "presence": "max", "presence_threshold": presence_threshold})
        thresholds = {**OFF, "mouth": 0.4}
        assert (events_of(probs_to_submission(table, thresholds, params)) == [(5, 7, ["mouth"])]) == kept


def test_the_reach_a_timeline_needs_is_the_longest_half_window_or_gap_fill():
    params = section_params(EventParams, "events", **{**RAW, "median_window": 7, "fill_gap": 2})
    assert params.max_reach() == 3
    assert params.replace(fill_gap=5).max_reach() == 5
    assert params.replace(per_label={"polyp": {"median_window": 15}}).max_reach() == 7


def test_a_timeline_with_other_probabilities_forgets_the_old_ones_caches():
    from vce.post.runs import mean_probs
    from vce.post.timeline import build_timeline

    timeline = build_timeline(frames(10, polyp=np.full(10, 0.2)), max_reach=1)
    k = LABELS.index("polyp")
    seen = np.flatnonzero(timeline.observed)
    starts, ends = seen[:1], seen[-1:]
    assert mean_probs(timeline, k, starts, ends)[0] == pytest.approx(0.2)
    timeline.region_paths["key"] = np.zeros(3)
    other = timeline.with_probs(np.where(timeline.observed, np.float32(0.6), np.nan).astype(np.float32)[None].repeat(17, 0))
    assert mean_probs(other, k, starts, ends)[0] == pytest.approx(0.6)
    assert other.region_paths == {} and other.time is timeline.time


# ----------------------------------------------------------------------------- boundaries the tuning relies on


def test_a_frame_at_the_tuned_threshold_is_active_as_the_f1_search_counts_it():
    """The F1 search counts a frame as fired when its probability >= the threshold, so it picks
    the positives' own probability; the decoder must fire there too, or the tuned threshold drops
    exactly the frames it was tuned on. 0.75 is exact in float32 (0.6 would round above 0.6)."""
    from vce.post.thresholds import ThresholdParams, f1_thresholds

    probs = pattern(30, (5, 9), value=0.75) + pattern(30, (20, 22), value=0.74)  # negatives just below
    truth = np.zeros((30, len(LABELS)), np.uint8)
    truth[5:10, LABELS.index("mouth")] = 1
    y_prob = np.zeros((30, len(LABELS)))
    y_prob[:, LABELS.index("mouth")] = probs
    thresholds = f1_thresholds(truth, y_prob, section_params(ThresholdParams, "thresholds"))
    assert thresholds["mouth"] == 0.75
    sub = probs_to_submission(frames(30, mouth=probs), thresholds, section_params(EventParams, "events", **RAW))
    assert events_of(sub) == [(5, 9, ["mouth"])]


def test_an_events_confidence_is_its_mean_over_observed_frames_only():
    """An invalid frame bridged inside an event has no probability: it must not count as a 0.
    Event 0-9 (9 observed frames at 0.75, frame 5 invalid) is worth 0.75, above event 20-29
    (0.72) and above a presence threshold of 0.74; over all 10 positions it would be 0.675."""
    probs = pattern(40, (0, 9), value=0.75) + pattern(40, (20, 29), value=0.72)
    table = frames(40, mouth=probs)
    table["valid"] = True
    table.loc[5, "valid"] = False
    table.loc[5, "mouth"] = np.nan
    bridged = {**RAW, "fill_gap": 1}
    ranked = probs_to_submission(table, OFF, section_params(EventParams, "events", **bridged))
    assert events_of(ranked) == [(0, 9, ["mouth"]), (20, 29, ["mouth"])]  # most confident first
    gated = section_params(EventParams, "events", **{**bridged, "presence": "max", "presence_threshold": 0.74})
    assert events_of(probs_to_submission(table, OFF, gated)) == [(0, 9, ["mouth"]), (20, 29, ["mouth"])]


def test_presence_max_keeps_a_label_whose_best_event_equals_the_threshold():
    """`presence_threshold` is what the best event's mean probability must reach (params.yaml):
    equal to it is enough. 0.75 is exact in float32, so the mean is exactly 0.75."""
    table = frames(20, mouth=pattern(20, (3, 7), value=0.75))
    at = section_params(EventParams, "events", **{**RAW, "presence": "max", "presence_threshold": 0.75})
    assert events_of(probs_to_submission(table, OFF, at)) == [(3, 7, ["mouth"])]
    above = at.replace(presence_threshold=0.76)
    assert events_of(probs_to_submission(table, OFF, above)) == []
