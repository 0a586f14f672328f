"""The exam viewer: pages that cover the submission, the official matching, capped thumbnails, reasons."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import section_params
from PIL import Image
from viewer_check import check_viewer, parse

from vce.core.labels import LABEL_INDEX, LABELS
from vce.eval.explain import decision, drawn_threshold, silence_reason
from vce.eval.report import ReportParams, ViewerParams
from vce.eval.score import THRESHOLDS, average_precisions, event_matches
from vce.eval.timelines import ranked_hits_ap
from vce.viewer.build import ViewerSet, trace_bins, write_viewer
from vce.viewer.thumbnails import Request, event_frames, plan_thumbnails

GT = {"videos": [
    {"video_id": "7", "events": [{"start": 0, "end": 99, "label": ["stomach"]},
                                 {"start": 100, "end": 149, "label": ["small intestine"]},
                                 {"start": 150, "end": 157, "label": ["small intestine", "ulcer"]},
                                 {"start": 158, "end": 299, "label": ["small intestine"]}]},
    {"video_id": "12", "events": [{"start": 0, "end": 149, "label": ["stomach"]},
                                  {"start": 150, "end": 299, "label": ["small intestine"]}]}]}
# Video 7: stomach cut short (TP at 0.5 only), a two-label event, an FP ulcer candidate ranked
# first over the true one, a duplicate that finds its GT taken; video 12: one false ulcer.
PRED = {"videos": [
    {"video_id": "7", "events": [{"start": 0, "end": 89, "label": ["stomach"]},
                                 {"start": 140, "end": 170, "label": ["ulcer", "small intestine"]},
                                 {"start": 150, "end": 157, "label": ["ulcer"]},
                                 {"start": 150, "end": 157, "label": ["ulcer"]},
                                 {"start": 158, "end": 299, "label": ["small intestine"]}]},
    {"video_id": "12", "events": [{"start": 0, "end": 149, "label": ["stomach"]},
                                  {"start": 10, "end": 14, "label": ["ulcer"]}]}]}
CLINICAL = {"videos": [{"video_id": "7", "events": [{"start": 0, "end": 89, "label": ["stomach"]},
                                                    {"start": 150, "end": 157, "label": ["ulcer"]}]},
                       {"video_id": "12", "events": []}]}
EXAM = {"videos": [{"video_id": "ukdd_navi_1", "events": [{"start": 10, "end": 60, "label": ["colon", "blood"]}]}]}


def _video(tmp_path, video_id: str, n: int, step: int, rng):
    """n PNG frames at times 0, step, 2 step ... and random probabilities (one invalid frame)."""
    folder = tmp_path / "frames" / video_id
    folder.mkdir(parents=True)
    t = np.arange(n) * step
    for value in t:
        Image.fromarray(rng.integers(0, 255, (40, 32, 3), dtype=np.uint8)).save(folder / f"frame_{value}.png")
    probs = pd.DataFrame(rng.uniform(0, 1, (n, len(LABELS))), columns=list(LABELS))
    probs.iloc[5] = np.nan
    probs.insert(0, "t", t)
    probs.insert(0, "video_id", video_id)
    files = pd.DataFrame({"video_id": video_id, "t": t, "path": [str(folder / f"frame_{v}.png") for v in t]})
    return probs, files


def _params(**overrides) -> ViewerParams:
    """The repository's report.viewer knobs with `overrides`."""
    return section_params(ReportParams, "report").viewer.replace(**overrides)


SAVED = {"method": "f1", "thresholds": {**{label: 0.5 for label in LABELS}, "polyp": 1.01}}


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("viewer")
    rng = np.random.default_rng(0)
    (p7, f7), (p12, f12) = _video(tmp_path, "7", 300, 1, rng), _video(tmp_path, "12", 300, 1, rng)
    pt, ft = _video(tmp_path, "ukdd_navi_1", 100, 5, rng)
    params = _params(thumbnail_px=24, events_per_label=2)
    sets = [ViewerSet("validation", PRED, CLINICAL, pd.concat([p7, p12]), pd.concat([f7, f12]),
                      {"7": "index", "12": "index"}, GT),
            ViewerSet("test", EXAM, EXAM, pt, ft, {"ukdd_navi_1": "frame"}, None)]
    summary = write_viewer(tmp_path / "viewer", sets, SAVED, params, 2, 0.158, {"presence": "max"})
    return tmp_path / "viewer", summary, params


def _data(folder, name: str) -> dict:
    return json.loads(parse(folder / name).data_text)


def test_every_event_has_its_entry_and_every_link_resolves(case):
    folder, summary, _ = case
    counts = check_viewer(folder, {"validation": (PRED, CLINICAL), "test": (EXAM, EXAM)})
    assert counts["events"] == summary["events"] == 8 + 2  # (event, label) pairs of both submissions
    assert counts["thumbnails"] > 0 and summary["thumbnails"] == len(list((folder / "thumbs").rglob("*.jpg")))
    assert summary["videos"] == 3 and (folder / "viewer.js").is_file() and (folder / "viewer.css").is_file()
    # Thumbnails are never upscaled past the frame, and shrink to thumbnail_px on the long side.
    with Image.open(next((folder / "thumbs" / "7").glob("*.jpg"))) as image:
        assert image.size == (19, 24)  # 32 x 40 frames


def test_the_check_fails_on_a_missing_thumbnail_a_network_url_and_a_lost_event(case, tmp_path):
    import shutil

    folder, _, _ = case
    sets = {"validation": (PRED, CLINICAL), "test": (EXAM, EXAM)}
    for breakage in ("thumbnail", "network", "event"):
        broken = tmp_path / breakage
        shutil.copytree(folder, broken)
        if breakage == "thumbnail":
            next((broken / "thumbs" / "7").glob("*.jpg")).unlink()
        elif breakage == "network":
            (broken / "viewer.css").write_text("@import url(https://example.org/x.css);")
        else:
            page = broken / "validation_7.html"
            page.write_text(page.read_text().replace('"pred":[[0,89,2,0,', '"pred":[[0,88,2,0,'))
        with pytest.raises(AssertionError):
            check_viewer(broken, sets)


def _reference_match(gt: list, pred: list, threshold: float) -> list[int]:
    """The evaluator's greedy matching, written out: the first free GT (file order) with tIoU >= thr."""
    free, out = [True] * len(gt), []
    for s, e in pred:
        found = -1
        for g, (gs, ge) in enumerate(gt):
            inter = max(0, min(e, ge) - max(s, gs) + 1)
            if free[g] and inter / ((e - s + 1) + (ge - gs + 1) - inter) >= threshold:
                found, free[g] = g, False
                break
        out.append(found)
    return out


def test_marks_are_the_official_matching(case):
    folder, _, _ = case
    data = _data(folder, "validation_7.html")
    _, aps = average_precisions(GT, PRED)
    for k, label in enumerate(LABELS):
        rows = sorted((r for r in data["pred"] if r[2] == k), key=lambda r: r[3])
        gt = [(r[0], r[1]) for r in sorted((r for r in data["gt"] if r[2] == k), key=lambda r: r[3])]
        for i, threshold in enumerate(THRESHOLDS):
            assert [r[4 + i] for r in rows] == _reference_match(gt, [(r[0], r[1]) for r in rows], threshold), label
            hits = [int(r[4 + i] >= 0) for r in rows]
            assert math.isclose(ranked_hits_ap(hits, len(gt), len(rows)), aps[threshold][0, k]), label
            assert math.isclose(data["ap"][k][i], round(aps[threshold][0, k], 4))
            taken = {r[4 + i] for r in rows if r[4 + i] >= 0}
            assert [r[4 + i] for r in sorted((r for r in data["gt"] if r[2] == k), key=lambda r: r[3])] == \
                [int(g in taken) for g in range(len(gt))]
    ulcer = sorted((r for r in data["pred"] if r[2] == LABEL_INDEX["ulcer"]), key=lambda r: r[3])
    assert [r[4] for r in ulcer] == [-1, 0, -1]  # the wide FP first, then the TP, then its duplicate
    assert [r[4:6] for r in data["pred"] if r[2] == LABEL_INDEX["stomach"]] == [[0, -1]]  # tIoU 0.9
    assert all(r[4:6] == [-2, -2] for r in _data(folder, "test_ukdd_navi_1.html")["pred"])  # no truth: no marks


def test_event_matches_agrees_with_a_written_out_matching():
    matches = event_matches(GT, PRED)
    for (video_id, label), entry in matches.items():
        for threshold in THRESHOLDS:
            expected = _reference_match(entry["gt"].tolist(), entry["pred"].tolist(), threshold)
            assert entry[threshold].tolist() == expected, (video_id, label, threshold)
    assert matches[("7", "ulcer")][0.5].tolist() == [-1, 0, -1]
    # Contested: each prediction takes the first free ground-truth segment in file order.
    twice = {"videos": [{"video_id": "v", "events": [{"start": 10, "end": 20, "label": ["polyp"]},
                                                     {"start": 11, "end": 20, "label": ["polyp"]}]}]}
    pred = {"videos": [{"video_id": "v", "events": [{"start": 10, "end": 20, "label": ["polyp"]}] * 3}]}
    assert event_matches(twice, pred)[("v", "polyp")][0.5].tolist() == [0, 1, -1]


def test_error_pages_rank_false_alarms_and_list_misses(case):
    folder, _, _ = case
    page = (folder / "label_validation_ulcer.html").read_text()
    false_alarms = page[page.index("<h2>False alarms"):page.index("<h2>Missed")]
    # Rank 1 false alarms (video 7's wide candidate, video 12's) before the rank 3 duplicate.
    assert false_alarms.count("validation_7.html#pred-") == 2 and false_alarms.count("validation_12.html#pred-1-16") == 1
    assert false_alarms.index("rank 1") < false_alarms.index("rank 3")
    stomach = (folder / "label_validation_stomach.html").read_text()
    assert "validation_7.html#pred-0-2" in stomach[stomach.index("<h2>Matched at 0.5"):]  # 0-89 against 0-99
    assert "None." in stomach[stomach.index("<h2>Missed"):stomach.index("<h2>Matched at 0.5")]
    assert not (folder / "label_test_ulcer.html").exists()  # no truth, no error pages


def test_index_tables_say_why_a_label_is_silent(case):
    folder, _, _ = case
    index = (folder / "index.html").read_text()
    assert "threshold off (1.01)" in index  # polyp
    assert "peak frame probability per video" in index
    assert 'href="validation_7.html"' in index and 'href="test_ukdd_navi_1.html"' in index


def test_caps_bound_the_thumbnails(tmp_path):
    rng = np.random.default_rng(1)
    probs, files = _video(tmp_path, "7", 300, 1, rng)
    many = {"videos": [{"video_id": "7", "events": [{"start": 3 * i, "end": 3 * i + 20, "label": ["ulcer"]}
                                                    for i in range(40)]}]}
    gt = {"videos": [{"video_id": "7", "events": [{"start": 0, "end": 20, "label": ["ulcer"]}]}]}
    sets = [ViewerSet("validation", many, {"videos": [{"video_id": "7", "events": []}]}, probs, files, {}, gt)]
    params = _params(events_per_label=3, errors_per_label=0, frames_per_event=4, max_thumbnails=1000)
    write_viewer(tmp_path / "v", sets, SAVED, params, 1, 0.158, None)
    data = _data(tmp_path / "v", "validation_7.html")
    assert len(data["pred"]) == 40 and sorted(data["thumbsOf"]) == ["gt-0-16", "pred-0-16", "pred-1-16", "pred-2-16"]
    assert all(len(ids) == 4 for ids in data["thumbsOf"].values())
    params = params.replace(max_thumbnails=9, errors_per_label=5)  # whole events only: 2 of 4 frames each
    summary = write_viewer(tmp_path / "w", sets, SAVED, params, 1, 0.158, None)
    data = _data(tmp_path / "w", "validation_7.html")
    assert summary["thumbnails"] == len(list((tmp_path / "w" / "thumbs").rglob("*.jpg"))) <= 9
    # Two events fit (8 frames): the error page's first false alarms (ranks 2 and 3) come first.
    assert sorted(data["thumbsOf"]) == ["pred-1-16", "pred-2-16"]
    assert all(len(ids) == 4 for ids in data["thumbsOf"].values()) and summary["thumbnails"] == 8
    params = params.replace(errors_per_label=0)  # then the lists' first events; the GT shares its TP's frames
    write_viewer(tmp_path / "x", sets, SAVED, params, 1, 0.158, None)
    assert sorted(_data(tmp_path / "x", "validation_7.html")["thumbsOf"]) == ["gt-0-16", "pred-0-16", "pred-1-16"]


def test_an_unreadable_frame_leaves_a_gap_not_a_broken_link(tmp_path):
    rng = np.random.default_rng(3)
    probs, files = _video(tmp_path, "7", 300, 1, rng)
    (tmp_path / "frames" / "7" / "frame_0.png").write_bytes(b"\x89PNG\r\n\x1a\ntruncated")
    (tmp_path / "frames" / "7" / "frame_89.png").unlink()
    video = {"videos": [v for v in PRED["videos"] if v["video_id"] == "7"]}
    sets = [ViewerSet("validation", video, video, probs, files, {}, {"videos": GT["videos"][:1]})]
    summary = write_viewer(tmp_path / "v", sets, SAVED, _params(), 1, 0.158, None)
    check_viewer(tmp_path / "v", {"validation": (video, video)})
    data = _data(tmp_path / "v", "validation_7.html")
    shown = [data["thumbs"][i][0] for i in data["thumbsOf"]["pred-0-2"]]
    assert shown == [22, 44, 67] and summary["thumbnails"] == len(data["thumbs"])  # 0 and 89 unreadable


def test_without_the_frame_files_the_viewer_is_written_and_says_frames_are_unavailable(tmp_path):
    """A machine that pulled the outputs but has no frames (issue 50): every page, no thumbnail, each
    granted entry marked unavailable (not "past the cap"), the index page counting them."""
    rng = np.random.default_rng(4)
    probs, files = _video(tmp_path, "7", 300, 1, rng)
    files["path"] = [str(tmp_path / "elsewhere" / Path(p).name) for p in files["path"]]  # the frames are not here
    video = {"videos": [v for v in PRED["videos"] if v["video_id"] == "7"]}
    sets = [ViewerSet("validation", video, video, probs, files, {}, {"videos": GT["videos"][:1]})]
    summary = write_viewer(tmp_path / "v", sets, SAVED, _params(events_per_label=1, max_thumbnails=40), 1, 0.158, None)
    check_viewer(tmp_path / "v", {"validation": (video, video)})
    data = _data(tmp_path / "v", "validation_7.html")
    assert summary["thumbnails"] == 0 and data["thumbs"] == [] and not list((tmp_path / "v").rglob("*.jpg"))
    assert summary["unavailable"] > 0 and data["thumbsOf"] and all(ids == [] for ids in data["thumbsOf"].values())
    page = (tmp_path / "v" / "validation_7.html").read_text()
    clinical_events = {ref.split("-")[1] for ref in data["thumbsOf"] if ref.startswith("clin-")}  # one row each
    assert page.count("frames unavailable here") == len(clinical_events) > 0
    assert f"{summary['unavailable']} of {summary['unavailable']} thumbnails unavailable" in (tmp_path / "v" / "index.html").read_text()


def test_event_frames_and_the_plan():
    times = np.array([0, 5, 10, 15, 20, 25, 30])
    assert event_frames(times, 0, 30, 5) == [0, 10, 15, 20, 30]  # first, last, middle, between
    assert event_frames(times, 4, 16, 5) == [5, 10, 15]  # only frames that exist, none twice
    assert event_frames(times, 6, 9, 3) == [] and event_frames(times, 0, 30, 1) == [15]
    requests = [Request((1, 0), "v", ("pred", 1, 0), (1, 2, 3)), Request((0, 0), "v", ("pred", 0, 0), (3, 4)),
                Request((0, 1), "v", ("gt", 0, 0), (4,)), Request((2, 0), "v", ("pred", 2, 0), (9,))]
    granted, frames = plan_thumbnails(requests, 3)
    assert granted == {("v", ("pred", 0, 0)), ("v", ("gt", 0, 0)), ("v", ("pred", 2, 0))}  # (1, 2, 3) does not fit
    assert frames == {("v", 3), ("v", 4), ("v", 9)}


def test_trace_bins_are_exact_up_to_the_bin_count_and_an_envelope_past_it():
    times = np.arange(10) * 5
    probs = np.linspace(0, 1, 170).reshape(10, 17)
    probs[3] = np.nan
    exact = trace_bins(times, probs, 16)
    lo = np.frombuffer(__import__("base64").b64decode(exact["lo"]), np.uint8).reshape(17, 10)
    assert exact["t"] == times.tolist() and exact["end"] == 45
    assert lo[:, 3].tolist() == [255] * 17 and lo[0, 9] == round(probs[9, 0] * 254)
    binned = trace_bins(np.arange(40), np.tile(np.linspace(0, 1, 40)[:, None], (1, 17)), 16)
    lo = np.frombuffer(__import__("base64").b64decode(binned["lo"]), np.uint8).reshape(17, 16)
    hi = np.frombuffer(__import__("base64").b64decode(binned["hi"]), np.uint8).reshape(17, 16)
    assert len(binned["t"]) == 16 and (hi > lo).all() and lo[0, 0] == 0 and hi[0, -1] == 254


ENGINE = {"method": "engine", "thresholds": {label: 0.4 for label in LABELS}, "engine": {"centres": [None] * 17, "policies": {
    "blood": {"kind": "off", "tuning_ap": 0.5, "shadow": {"detector": "threshold", "threshold": 0.5, "ratio": 1.0,
                                                          "median_window": 1, "min_length": 1, "regions": None}},
    "ulcer": {"kind": "runs", "detector": "threshold", "threshold": 0.3, "median_window": 15, "min_length": 1,
              "gate": 0.42028960356345546, "evidence": "max", "tuning_ap": 0.625},
    "mouth": {"kind": "off", "tuning_ap": 0.25}}}}


def test_silence_reasons_name_the_rule_and_its_numbers():
    peaks = {"1": 0.61, "3": float("nan")}
    blood = silence_reason(ENGINE, "blood", peaks, 2, 0.158, None)
    assert "tuning AP 0.500" in blood and "0.158 x sqrt(2) = 0.223" in blood and "threshold 0.5" in blood
    ulcer = silence_reason(ENGINE, "ulcer", peaks, 2, 0.158, None)
    assert "max evidence >= 0.420" in ulcer and "0.61 (1)" in ulcer
    assert "region's presence gate admits no tuning video" in silence_reason(ENGINE, "mouth", peaks, 2, 0.158, None)
    assert drawn_threshold(ENGINE, "ulcer") == 0.3 and drawn_threshold(ENGINE, "blood") is None
    assert decision(ENGINE, "blood") == "engine: off" and "median window 15" in decision(ENGINE, "ulcer")
    f1 = {"method": "f1", "thresholds": {label: 0.7 for label in LABELS}}
    assert "no frame reached the threshold 0.70" in silence_reason(f1, "blood", peaks, 2, 0.158, {})
    events = {"presence": "max", "presence_threshold": 0.9, "per_label": {"blood": {"presence_threshold": 0.95}}}
    f1["thresholds"]["blood"] = 0.5
    assert "presence threshold 0.95" in silence_reason(f1, "blood", peaks, 2, 0.158, events)


def test_a_rerun_replaces_the_folder(case, tmp_path):
    from vce.core.io import OWN_MARK

    folder, _, params = case
    stale = copy.deepcopy(EXAM)
    rng = np.random.default_rng(2)
    probs, files = _video(tmp_path, "ukdd_navi_1", 100, 5, rng)
    out = tmp_path / "viewer"
    out.mkdir()
    (out / "old_page.html").write_text("stale")
    (out / OWN_MARK).write_text("a previous run's viewer")  # a user's own folder is refused (test_io)
    write_viewer(out, [ViewerSet("exam", stale, stale, probs, files, {}, None)], SAVED, params, 1, 0.158, None)
    assert not (out / "old_page.html").exists()
    check_viewer(out, {"exam": (stale, stale)})
