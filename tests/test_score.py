import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vce.core.labels import LABELS
from vce.eval.score import SubmissionError, check_submission, main, score
from vce.eval.score_reference import score_reference, shifted_submission

FIXTURES = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures"
GALAR_GT = FIXTURES / "galar_gt_events.json"
EMPTY_GALAR = 0.42426470588235


@pytest.fixture(scope="module")
def galar_gt():
    return json.loads(GALAR_GT.read_text())


def sub(*videos):
    """sub(("v1", [(start, end, [labels]), ...]), ...) -> submission dict."""
    return {
        "videos": [
            {"video_id": vid, "events": [{"start": s, "end": e, "label": list(ls)} for s, e, ls in events]}
            for vid, events in videos
        ]
    }


def ap_of(result, threshold, video="v", label="mouth"):
    """AP of one label in a one-video result, recovered from per_label (one video: mean = AP)."""
    return result[f"per_label@{threshold}"][label]


# ----------------------------------------------------------------------------- public checks


def test_galar_scored_against_itself_is_one(galar_gt):
    result = score(galar_gt, galar_gt)
    assert result["map@0.5"] == 1.0 and result["map@0.95"] == 1.0


def test_galar_empty_submission_scores_official_value(galar_gt):
    empty = {"videos": [{"video_id": v["video_id"], "events": []} for v in galar_gt["videos"]]}
    result = score(galar_gt, empty)
    assert result["map@0.5"] == pytest.approx(EMPTY_GALAR, abs=1e-13)
    assert result["map@0.95"] == pytest.approx(EMPTY_GALAR, abs=1e-13)
    assert len(result["per_video@0.5"]) == 80


def test_galar_shifted_matches_reference_on_a_few_videos(galar_gt):
    gt = {"videos": galar_gt["videos"][:6]}
    pred = shifted_submission(gt, seed=1, shuffle=True)
    fast, reference = score(gt, pred), score_reference(gt, pred)
    for key in ("map@0.5", "map@0.95"):
        assert fast[key] == pytest.approx(reference[key], abs=1e-12)
    assert fast["per_video@0.95"] == pytest.approx(reference["per_video@0.95"], abs=1e-12)
    assert fast["per_label@0.5"] == pytest.approx(reference["per_label@0.5"], abs=1e-12)


# ----------------------------------------------------------------------------- hand-built cases


def test_tiou_exactly_half_matches_at_05_only():
    gt = sub(("v", [(0, 9, ["mouth"])]))
    pred = sub(("v", [(0, 4, ["mouth"])]))  # intersection 5, union 10
    result = score(gt, pred)
    assert ap_of(result, 0.5) == 1.0 and ap_of(result, 0.95) == 0.0
    assert result["map@0.5"] == pytest.approx(1.0)
    assert result["map@0.95"] == pytest.approx(16 / 17)


def test_tiou_exactly_095_matches_and_just_below_does_not():
    gt = sub(("v", [(0, 19, ["mouth"])]))
    assert ap_of(score(gt, sub(("v", [(1, 19, ["mouth"])]))), 0.95) == 1.0  # 19 / 20
    assert ap_of(score(gt, sub(("v", [(0, 17, ["mouth"])]))), 0.95) == 0.0  # 18 / 20


def test_a_ground_truth_starting_as_far_before_the_prediction_as_a_match_allows_still_matches():
    """The candidate search reaches GT starts up to (1/tIoU - 1) x the prediction's length away:
    at that distance exactly the tIoU is the threshold itself."""
    gt = sub(("v", [(0, 3, ["mouth"])]))
    assert ap_of(score(gt, sub(("v", [(2, 3, ["mouth"])]))), 0.5) == 1.0  # 2 / 4, starts 2 = 1 x 2 frames apart
    gt = sub(("v", [(0, 20, ["mouth"])]))
    assert ap_of(score(gt, sub(("v", [(1, 20, ["mouth"])]))), 0.95) == 1.0  # 20 / 21, 1 = floor(20 / 19) apart


def test_file_order_is_the_ranking():
    gt = sub(("v", [(0, 9, ["polyp"]), (20, 29, ["polyp"])]))
    good_first = sub(("v", [(0, 9, ["polyp"]), (50, 59, ["polyp"])]))
    false_first = sub(("v", [(50, 59, ["polyp"]), (0, 9, ["polyp"])]))
    assert ap_of(score(gt, good_first), 0.5, label="polyp") == pytest.approx(0.5)
    assert ap_of(score(gt, false_first), 0.5, label="polyp") == pytest.approx(0.25)


def test_greedy_takes_first_unmatched_gt_in_gt_order():
    # p1 reaches both g1 and g2 and takes g1 (first in GT order); p2 reaches only g1: a miss.
    # At tIoU 0.95: p1-g1 20/20, p1-g2 20/21, p2-g1 19/20, p2-g2 19/21 (< 0.95).
    g1, g2 = (0, 19, ["ulcer"]), (0, 20, ["ulcer"])
    p1, p2 = (0, 19, ["ulcer"]), (1, 19, ["ulcer"])
    first = score(sub(("v", [g1, g2])), sub(("v", [p1, p2])))
    assert ap_of(first, 0.95, label="ulcer") == pytest.approx(0.5)  # tp = [1, 0]
    swapped = score(sub(("v", [g2, g1])), sub(("v", [p1, p2])))
    assert ap_of(swapped, 0.95, label="ulcer") == pytest.approx(1.0)  # p1 -> g2, p2 -> g1


def test_multi_label_event_counts_once_per_label():
    gt = sub(("v", [(0, 9, ["stomach"]), (10, 19, ["blood", "stomach"])]))
    pred = sub(("v", [(10, 19, ["blood", "stomach"]), (0, 9, ["stomach"])]))
    result = score(gt, pred)
    assert result["map@0.5"] == 1.0
    assert result["per_label@0.5"]["blood"] == 1.0


def test_absent_labels_are_worth_one_until_predicted():
    gt = sub(("v", [(0, 9, ["mouth"])]))
    assert score(gt, sub(("v", [])))["map@0.5"] == pytest.approx(16 / 17)
    assert score(gt, sub(("v", [(0, 9, ["mouth"])])))["map@0.5"] == 1.0
    one_false = score(gt, sub(("v", [(0, 9, ["mouth"]), (50, 50, ["polyp"])])))
    assert one_false["map@0.5"] == pytest.approx(16 / 17)
    assert one_false["per_label@0.5"]["polyp"] == 0.0


def test_per_video_and_overall_means():
    gt = sub(("a", [(0, 9, ["mouth"])]), ("b", [(0, 9, ["colon"])]))
    pred = sub(("a", [(0, 9, ["mouth"])]), ("b", []))
    result = score(gt, pred)
    assert result["per_video@0.5"] == {"a": 1.0, "b": pytest.approx(16 / 17)}
    assert result["map@0.5"] == pytest.approx((1 + 16 / 17) / 2)


def test_ground_truth_video_without_events_is_not_averaged():
    # The official evaluator builds its video list from events, so such a video adds nothing.
    gt = sub(("a", [(0, 9, ["mouth"])]), ("b", []))
    pred = sub(("a", [(0, 9, ["mouth"])]), ("b", [(0, 5, ["polyp"])]))
    result = score(gt, pred)
    assert result["per_video@0.5"] == {"a": 1.0}
    assert result == score_reference(gt, pred)


def test_appended_false_positives_do_not_lower_ap():
    gt = sub(("v", [(0, 9, ["erosion"])]))
    pred = sub(("v", [(0, 9, ["erosion"]), (40, 49, ["erosion"]), (60, 69, ["erosion"])]))
    assert ap_of(score(gt, pred), 0.5, label="erosion") == 1.0


# ----------------------------------------------------------------------------- property test


interval = st.tuples(st.integers(0, 60), st.integers(0, 25)).map(lambda se: (se[0], se[0] + se[1]))
few_labels = st.lists(st.sampled_from(["mouth", "blood", "colon"]), min_size=1, max_size=2, unique=True)
event = st.tuples(interval, few_labels).map(lambda x: (x[0][0], x[0][1], x[1]))
video_events = st.lists(event, max_size=12)


@settings(max_examples=200, deadline=None)
@given(gt_a=video_events, gt_b=video_events, pred_a=video_events, pred_b=video_events)
def test_fast_equals_reference(gt_a, gt_b, pred_a, pred_b):
    gt = sub(("a", gt_a), ("b", gt_b))
    pred = sub(("b", pred_b), ("a", pred_a))
    fast, reference = score(gt, pred), score_reference(gt, pred)
    assert fast.keys() == reference.keys()
    for key, value in reference.items():
        if isinstance(value, dict):
            assert fast[key].keys() == value.keys()
            assert all(abs(fast[key][k] - value[k]) <= 1e-12 for k in value)
        else:
            assert abs(fast[key] - value) <= 1e-12


# ----------------------------------------------------------------------------- checks and CLI


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"video": []}, "'videos' list"),
        ({"videos": [{"events": []}]}, "video #0 has no 'video_id'"),
        ({"videos": [{"video_id": "v"}]}, "video 'v' has no 'events' list"),
        (sub(("v", [(5, 3, ["mouth"])])), "video 'v' event #0: start 5 > end 3"),
        ({"videos": [{"video_id": "v", "events": [{"start": 1.0, "end": 3, "label": ["mouth"]}]}]}, "'start' must be an integer"),
        ({"videos": [{"video_id": "v", "events": [{"start": True, "end": 3, "label": ["mouth"]}]}]}, "'start' must be an integer"),
        ({"videos": [{"video_id": "v", "events": [{"start": 1, "end": 3, "label": "mouth"}]}]}, "'label' must be a list"),
        (sub(("v", [(1, 3, ["mouth"]), (4, 5, ["Polyp"])])), "video 'v' event #1: unknown label(s) ['Polyp']"),
        ({"videos": [{"video_id": True, "events": []}]}, "video #0: video_id True must be a string or an integer"),
        ({"videos": [{"video_id": 1.5, "events": []}]}, "video #0: video_id 1.5 must be a string or an integer"),
    ],
)
def test_check_submission_names_the_problem(bad, message):
    with pytest.raises(SubmissionError) as err:
        check_submission(bad)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_check_submission_video_ids_must_equal_gt():
    gt = sub(("a", []), ("b", []))
    with pytest.raises(SubmissionError, match=r"missing: \['b'\]; extra: \['c'\]"):
        check_submission(sub(("a", []), ("c", [])), gt)
    check_submission(sub(("b", []), ("a", [])), gt)
    with pytest.raises(SubmissionError):
        score(gt, sub(("a", [])))


def test_cli_prints_json(tmp_path, capsys):
    gt = sub(("v", [(0, 9, ["mouth"])]))
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    (tmp_path / "pred.json").write_text(json.dumps(gt))
    assert main([str(tmp_path / "gt.json"), str(tmp_path / "pred.json")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["map@0.5"] == 1.0 and out["map@0.95"] == 1.0
    assert out["per_video@0.5"] == {"v": 1.0} and "per_video@0.95" in out


def test_cli_failed_check_exits_2_with_one_line(tmp_path, capsys):
    (tmp_path / "gt.json").write_text(json.dumps(sub(("v", [(0, 9, ["mouth"])]))))
    (tmp_path / "pred.json").write_text(json.dumps(sub(("v", [(0, 9, ["tumour"])]))))
    assert main([str(tmp_path / "gt.json"), str(tmp_path / "pred.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "tumour" in err


def test_cli_missing_file_exits_2_naming_it(tmp_path, capsys):
    (tmp_path / "gt.json").write_text(json.dumps(sub(("v", []))))
    missing = tmp_path / "nope.json"
    assert main([str(tmp_path / "gt.json"), str(missing)]) == 2
    assert str(missing) in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{not json")
    assert main([str(tmp_path / "gt.json"), str(tmp_path / "bad.json")]) == 2
    assert "not valid JSON" in capsys.readouterr().err


def test_all_labels_reported():
    result = score(sub(("v", [(0, 1, ["mouth"])])), sub(("v", [])))
    assert list(result["per_label@0.5"]) == list(LABELS)


# ----------------------------------------------------------------------------- what the official evaluator accepts

LENIENT_CASES = {
    "start > end": sub(("v", [(9, 0, ["mouth"]), (20, 29, ["mouth"])])),
    "float frames": {"videos": [{"video_id": "v", "events": [
        {"start": 0.0, "end": 9.0, "label": ["mouth"]}, {"start": 20.5, "end": 29, "label": ["colon"]}]}]},
    "bool frames": {"videos": [{"video_id": "v", "events": [{"start": False, "end": 9, "label": ["mouth"]}]}]},
}


def test_frames_past_int64_are_scored_not_an_overflow_traceback():
    gt = sub(("v", [(0, 9, ["mouth"]), (2**64, 2**64 + 9, ["colon"])]))
    pred = sub(("v", [(2**63, 2**63 + 9, ["mouth"]), (0, 9, ["mouth"]), (2**64, 2**64 + 9, ["colon"])]))
    result = score(gt, pred)  # integers: valid in both modes
    assert result == score_reference(gt, pred) == score(gt, pred, strict=False)
    assert result["per_label@0.95"]["colon"] == 1.0 and result["per_label@0.5"]["mouth"] == 0.5


@pytest.mark.parametrize("case", LENIENT_CASES)
def test_lenient_scoring_equals_the_definition(case):
    """What the official code scores, we score the same (its arithmetic: the reference)."""
    gt = sub(("v", [(0, 9, ["mouth"]), (20, 29, ["mouth", "colon"])]))
    pred = LENIENT_CASES[case]
    with pytest.raises(SubmissionError):
        score(gt, pred)  # our writer's rules stay strict by default
    result = score(gt, pred, strict=False)
    assert result == score_reference(gt, pred)
    assert 0 < result["map@0.5"] <= 1


def test_lenient_float_frames_are_not_truncated():
    gt = sub(("v", [(0, 9, ["mouth"])]))
    pred = {"videos": [{"video_id": "v", "events": [{"start": 5.5, "end": 9, "label": ["mouth"]}]}]}
    # tIoU = 4.5 / 10 < 0.5: a miss (truncated to 5..9 it would be 5 / 10, a hit)
    assert score(gt, pred, strict=False)["per_label@0.5"]["mouth"] == 0.0
    exact = score(gt, {"videos": [{"video_id": "v", "events": [{"start": 0.0, "end": 9.0, "label": ["mouth"]}]}]},
                  strict=False)
    assert exact["per_label@0.95"]["mouth"] == 1.0


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16", "utf-16-le", "utf-32"])
def test_cli_reads_bom_and_utf16_files(tmp_path, capsys, encoding):
    gt = sub(("v", [(0, 9, ["mouth"])]))
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    (tmp_path / "pred.json").write_bytes(json.dumps(gt).encode(encoding))
    assert main([str(tmp_path / "gt.json"), str(tmp_path / "pred.json")]) == 0
    assert json.loads(capsys.readouterr().out)["map@0.5"] == 1.0


@pytest.mark.parametrize("case", LENIENT_CASES)
def test_cli_scores_what_the_evaluator_scores_with_a_warning_and_strict_refuses(tmp_path, capsys, case):
    gt = sub(("v", [(0, 9, ["mouth"]), (20, 29, ["mouth", "colon"])]))
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    (tmp_path / "pred.json").write_text(json.dumps(LENIENT_CASES[case]))
    args = [str(tmp_path / "gt.json"), str(tmp_path / "pred.json")]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["map@0.5"] == score_reference(gt, LENIENT_CASES[case])["map@0.5"]
    assert captured.err.startswith("warning: ") and "--strict" in captured.err
    assert main([*args, "--strict"]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_int_and_string_video_ids_are_named_as_a_type_mismatch():
    gt = sub(("1", []), ("2", []))
    with pytest.raises(SubmissionError, match=r"video id\(s\) 1 are of another type than the ground truth's"):
        check_submission(sub((1, []), ("2", [])), gt)


# ----------------------------------------------------------------------------- hostile files, closed pipes (issue 32)

def _cli(*args, close_stdout=False):
    import subprocess
    import sys

    from conftest import ROOT

    process = subprocess.Popen([sys.executable, "-m", "vce.eval.score", *map(str, args)], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if close_stdout:  # a reader that stopped before the first byte (`| head -c 0`)
        process.stdout.close()
        err = process.stderr.read()
        return process.wait(timeout=120), "", err
    out, err = process.communicate(timeout=120)
    return process.returncode, out, err


def test_a_deeply_nested_json_is_one_line_not_a_recursion_error(tmp_path):
    """Mutation killed: dropping the RecursionError catch in `_read_json` (a 10-line traceback)."""
    deep = tmp_path / "deep.json"
    deep.write_text('{"videos": ' + "[" * 100_000 + "]" * 100_000 + "}")
    empty = tmp_path / "empty.json"
    empty.write_text('{"videos": []}')
    code, _, err = _cli(empty, deep)
    assert code == 2 and err.count("Traceback") == 0, err
    assert err == f"error: submission {deep}: JSON nested too deeply to be a submission\n"
    from vce.core.errors import DataError
    from vce.core.io import read_json

    with pytest.raises(DataError, match="nested too deeply"):
        read_json(deep, "validation events")


def test_output_piped_to_a_reader_that_stops_exits_quietly(tmp_path):
    """`python -m vce.eval.score gt pred | head -c 0` used to end in a BrokenPipeError traceback."""
    empty = tmp_path / "empty.json"
    empty.write_text('{"videos": []}')
    code, _, err = _cli(empty, empty, close_stdout=True)
    assert (code, err) == (0, "")
    code, out, _ = _cli(empty, empty)
    assert code == 0 and json.loads(out)["map@0.5"] is not None


def test_a_submission_past_the_truths_end_is_scored_with_a_plausibility_warning(tmp_path, capsys):
    """Issue 48, WEAK: every event past the truth's end (frame numbers against index-unit
    truth) was rated 0.324, the empty submission's score, without a word. Mutation killed: no
    warning."""
    gt = {"videos": [{"video_id": "a", "events": [{"start": 0, "end": 99, "label": ["colon"]}]}]}
    pred = {"videos": [{"video_id": "a", "events": [{"start": 500, "end": 900, "label": ["colon"]},
                                                    {"start": 10, "end": 20, "label": ["ulcer"]}]}]}
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    (tmp_path / "pred.json").write_text(json.dumps(pred))
    assert main([str(tmp_path / "gt.json"), str(tmp_path / "pred.json")]) == 0
    err = capsys.readouterr().err
    assert err == ("warning: 1 of 2 event(s) start after the last ground-truth frame of their video (e.g. video a "
                   "event 500-900, truth ends at 99): other units or an offset? (frame numbers against index-unit "
                   "truth)\n")
    (tmp_path / "pred.json").write_text(json.dumps(gt))
    assert main([str(tmp_path / "gt.json"), str(tmp_path / "pred.json")]) == 0
    assert capsys.readouterr().err == ""
