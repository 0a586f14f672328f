"""The oracle ceilings `bench.simulate2` prints next to the engine."""

import numpy as np

from bench.simulate2 import cut_at_true_events, jittered


def _gt():
    return {"videos": [{"video_id": "v", "events": [
        {"start": 0, "end": 99, "label": ["small intestine"]},
        {"start": 40, "end": 44, "label": ["small intestine", "blood"]},
        {"start": 60, "end": 61, "label": ["small intestine", "polyp"]}]}]}


def test_region_runs_are_followed_by_their_pieces_cut_at_the_true_events_in_the_engines_order():
    runs = {"videos": [{"video_id": "v", "events": [{"start": 10, "end": 90, "label": ["small intestine"]}]}]}
    out = cut_at_true_events(_gt(), runs, {"blood"})["videos"][0]["events"]
    assert [(e["start"], e["end"]) for e in out] == [(10, 90), (40, 44), (10, 39), (45, 90)]  # shortest first
    longest = cut_at_true_events(_gt(), runs, {"blood"}, "longest")["videos"][0]["events"]
    assert [(e["start"], e["end"]) for e in longest] == [(10, 90), (45, 90), (10, 39), (40, 44)]
    assert all(e["label"] == ["small intestine"] for e in out)
    # No event of the labels inside the run: the run alone.
    alone = cut_at_true_events(_gt(), runs, {"ulcer"})["videos"][0]["events"]
    assert [(e["start"], e["end"]) for e in alone] == [(10, 90)]


def test_jitter_moves_only_the_chosen_labels_events():
    moved = jittered(_gt(), {"blood"}, 5.0, np.random.default_rng(0))["videos"][0]["events"]
    original = _gt()["videos"][0]["events"]
    assert moved[0] == original[0] and moved[2] == original[2]
    assert (moved[1]["start"], moved[1]["end"]) != (40, 44) and moved[1]["end"] >= moved[1]["start"]
    assert jittered(_gt(), {"blood"}, 0.0, np.random.default_rng(0)) == _gt()
