import itertools
import json

import numpy as np
import pandas as pd
import pytest
from conftest import section_params

from vce.core.errors import DataError
from vce.core.labels import LABELS, REGIONS
from vce.eval.score import score
from vce.post.engine import Engine, engine_submission, fit_engine, tuning_timeline
from vce.post.engine.candidates import head_candidates
from vce.post.events import labels_to_submission
from vce.post.head import ESOPHAGUS, MOUTH, head_lengths, head_posterior, head_profiles, length_prior, ranked_cells
from vce.post.thresholds import ThresholdParams
from vce.post.timeline import build_timeline

# ----------------------------------------------------------------------------- the posterior


def _brute_force(scores, path, n, priors, temperature):
    """The head posterior by enumerating every cell (a, b): mouth [0, a), esophagus [a, b), then
    the path's region (the stomach where the path says mouth or esophagus)."""
    width = len(priors[0]) - 1
    out = np.zeros((width + 1, width + 1))
    for a, b in itertools.product(range(width + 1), repeat=2):
        if a <= b <= n:
            rest = [scores[t, max(path[t], 2)] for t in range(n)]
            evidence = sum(scores[t, 0] - rest[t] for t in range(a)) + sum(scores[t, 1] - rest[t] for t in range(a, b))
            out[a, b] = np.exp(temperature * evidence + priors[0][a] + priors[1][b - a])
    return out / out.sum()


@pytest.mark.parametrize("n", [7, 4])  # the whole window, and a video shorter than it
@pytest.mark.parametrize("temperature", [0.3, 1.0])
def test_head_posterior_sums_every_cells_evidence_and_prior(n, temperature):
    rng = np.random.default_rng(n)
    width = 7
    scores = rng.normal(size=(width, 5))
    path = np.array([0, 0, 1, 2, 2, 3, 4])  # mouth and esophagus read as the stomach; 3 and 4 as themselves
    priors = (np.log(rng.dirichlet(np.ones(width + 1))), np.log(rng.dirichlet(np.ones(width + 1))))
    mouth, esophagus, seen = head_profiles(scores, path, np.array([0]), np.array([n]), width)
    assert seen.tolist() == [n]
    got = head_posterior(mouth[0], esophagus[0], n, priors, temperature)
    np.testing.assert_allclose(got, _brute_force(scores, path, n, priors, temperature), rtol=1e-9, atol=1e-15)


def test_ranked_cells_rank_mouth_ends_by_marginal_and_esophagus_cells_by_their_own():
    posterior = np.array([[0.05, 0.10, 0.00],  # a = 0: no mouth; esophagus [0, 0] in cell (0, 1)
                          [0.00, 0.30, 0.25],  # a = 1: mouth [0, 0]; esophagus [1, 1] in cell (1, 2)
                          [0.00, 0.00, 0.30]])  # a = 2: mouth [0, 1], no esophagus
    spans, presence = ranked_cells(posterior, MOUTH, 5)
    assert spans == [(0, 0), (0, 1)] and presence == pytest.approx(0.85)  # marginals 0.55 and 0.30
    spans, presence = ranked_cells(posterior, ESOPHAGUS, 5)
    assert spans == [(1, 1), (0, 0)] and presence == pytest.approx(0.35)
    assert ranked_cells(posterior, ESOPHAGUS, 1)[0] == [(1, 1)]


def test_length_prior_holds_the_absent_share_and_peaks_at_the_common_length():
    prior = np.exp(length_prior(np.array([0, 10, 10, 10, 0]), 40, 0.4))
    assert prior.sum() == pytest.approx(1.0) and prior[0] == pytest.approx(0.4)
    assert int(np.argmax(prior[1:])) + 1 == 10  # where the lengths are, even with a wide bandwidth
    assert prior[10] > prior[11] > prior[9] > prior[15] > prior[30]  # symmetric in log length
    # Never seen absent: the share is floored at half a video, not 0 (no length is impossible).
    assert np.exp(length_prior(np.array([10, 10, 10, 10]), 40, 0.2))[0] == pytest.approx(0.125)


def test_head_lengths_span_the_first_to_the_last_event_of_the_label():
    gt = {"videos": [{"video_id": "a", "events": [{"start": 5, "end": 9, "label": ["mouth"]},
                                                  {"start": 10, "end": 12, "label": ["mouth", "z-line"]}]},
                     {"video_id": "b", "events": [{"start": 0, "end": 3, "label": ["stomach"]}]}]}
    assert head_lengths(gt, ["a", "b", "c"], "mouth").tolist() == [8, 0, 0]


# ----------------------------------------------------------------------------- in the engine


def _head_table(video_id, mouth, esophagus, rest=60, first=0, clear=False):
    """Region probabilities of one video: a mouth the frame scores cannot tell from the esophagus
    (both read as the esophagus) unless `clear`, then a stomach, small intestine and colon each clear."""
    lengths = [mouth, esophagus, rest, rest, rest]
    regions = np.repeat(np.arange(5), lengths)
    table = pd.DataFrame({"video_id": video_id, "t": np.arange(first, first + len(regions), dtype=np.int64)})
    for label in LABELS:
        table[label] = np.float32(0.02)
    for k, region in enumerate(REGIONS):
        table[region] = np.where(regions == k, 0.9, 0.05).astype(np.float32)
    if not clear:
        table.loc[regions == 0, ["mouth", "esophagus"]] = np.float32([0.05, 0.9])
    truth = pd.DataFrame({"video_id": video_id, "t": table["t"]})
    for k, label in enumerate(LABELS):
        truth[label] = (regions == k).astype(np.uint8) if label in REGIONS else np.uint8(0)
    return table, labels_to_submission(truth)["videos"]


def test_head_candidates_place_both_ends_in_each_videos_own_time():
    tables = [_head_table("a", 10, 12, clear=True), _head_table("b", 10, 12, first=500, clear=True)]
    timeline = build_timeline(pd.concat([t for t, _ in tables], ignore_index=True), max_reach=1)
    scores = np.zeros((len(timeline.observed), 5))
    rows = np.flatnonzero(timeline.observed)
    scores[rows] = np.log(timeline.probs[[0, 1, 2, 3, 4]][:, rows].T)
    path = np.full(len(timeline.observed), 2)  # a path that skipped the mouth and the esophagus
    priors = [length_prior(np.array([10, 10, 10]), 40, 0.1), length_prior(np.array([12, 12, 12]), 40, 0.1)]
    heads = head_candidates(timeline, path, scores, priors, 1.0, 3)
    assert [events[0] for events in heads["mouth"].events] == [(0, 9), (500, 509)]
    assert [events[0] for events in heads["esophagus"].events] == [(10, 21), (510, 521)]
    assert all(len(events) == 3 for events in heads["mouth"].events)
    assert heads["mouth"].clinical == [[(0, 9)], [(500, 509)]]
    assert (heads["mouth"].evidence > 0.9).all() and (heads["esophagus"].evidence > 0.9).all()
    # A video shorter than the priors' lengths: its spans stay inside it, though the prior pulls longer.
    short = _head_table("c", 5, 0, rest=0, clear=True)[0]
    both = build_timeline(pd.concat([short, tables[1][0]], ignore_index=True), max_reach=1)
    scores = np.zeros((len(both.observed), 5))
    scores[both.observed] = np.log(both.probs[[0, 1, 2, 3, 4]][:, both.observed].T)
    heads = head_candidates(both, np.full(len(both.observed), 2), scores, priors, 1.0, 3)
    assert heads["mouth"].events[0][0] == (0, 4) and max(e for _, e in heads["mouth"].events[0]) == 4
    assert heads["mouth"].events[1][0] == (500, 509)
    # Without an observed frame in its head, a video gets nothing from the prior alone.
    blind = build_timeline(tables[0][0].assign(valid=False), max_reach=1)
    nothing = head_candidates(blind, np.full(len(blind.observed), 2), np.zeros((len(blind.observed), 5)), priors, 1.0, 3)
    assert nothing["mouth"].events == [[]] and nothing["mouth"].evidence.tolist() == [-np.inf]


def _engine_params(**overrides):
    return section_params(ThresholdParams, "thresholds", engine=overrides).engine


def test_the_engine_takes_the_head_where_it_beats_the_decoded_run():
    # Where the mouth ends only the lengths in the tuning ground truth can say: its frames read
    # as the esophagus's, and as many of each make the calibrated evidence even between the two.
    tune = [_head_table(f"v{i}", 12, 12) for i in range(4)]
    test = [_head_table(f"w{i}", 12, 12) for i in range(2)]
    frames = pd.concat([t for t, _ in tune], ignore_index=True)
    gt = {"videos": [video for _, videos in tune for video in videos]}
    gt_test = {"videos": [video for _, videos in test for video in videos]}
    test_frames = pd.concat([t for t, _ in test], ignore_index=True)

    params = _engine_params()
    engine = fit_engine(tuning_timeline(frames, params), gt, params)
    assert engine.policies["mouth"].kind == "head" and engine.policies["esophagus"].kind == "head"
    submission, clinical = engine_submission(test_frames, engine)
    result = score(gt_test, submission)
    assert result["per_label@0.95"]["mouth"] == 1.0 and result["per_label@0.95"]["esophagus"] == 1.0
    mouths = [e for e in submission["videos"][0]["events"] if e["label"] == ["mouth"]]
    assert (mouths[0]["start"], mouths[0]["end"]) == (0, 11) and len(mouths) == params.head_candidates
    assert sum(e["label"] == ["mouth"] for e in clinical["videos"][0]["events"]) == 1
    # The fitted head survives thresholds.json; one without its length priors is refused by name.
    data = json.loads(json.dumps(engine.to_dict()))
    assert engine_submission(test_frames, Engine.from_dict(data)) == (submission, clinical)
    del data["policies"]["mouth"]["length_priors"]
    with pytest.raises(DataError, match="'mouth' policy lacks \\['length_priors'\\]"):
        Engine.from_dict(data)

    # Without the head the decoded path cannot tell where the mouth ends: no exact mouth at 0.95.
    plain = _engine_params(head_candidates=0)
    engine = fit_engine(tuning_timeline(frames, plain), gt, plain)
    assert engine.policies["mouth"].kind == "region"
    assert score(gt_test, engine_submission(test_frames, engine)[0])["per_label@0.95"]["mouth"] < 1.0


def test_the_decoded_run_keeps_a_region_the_head_only_ties():
    tune = [_head_table(f"v{i}", 12, 12, clear=True) for i in range(3)]  # scores that place both ends
    frames = pd.concat([t for t, _ in tune], ignore_index=True)
    params = _engine_params()
    engine = fit_engine(tuning_timeline(frames, params), {"videos": [v for _, videos in tune for v in videos]}, params)
    assert engine.policies["mouth"].kind == "region" and engine.policies["mouth"].tuning_ap == 1.0
