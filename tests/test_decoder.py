"""`vce.post.decoder`: each `thresholds.method` fitted and applied as the stages did before it held the dispatch.

Small simulated validation videos (`bench.simulate`'s error model on real Galar timelines, cut
short); each method's fit is compared with its fitter called directly, each saved decoder's
events with its decoding called directly (the engine's, or the thresholds' under the events
post-processing, tuned or not).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import repo_params, section_params

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.simulate import FIXTURE, frame_labels_from_events, restrict, simulate_probs  # noqa: E402
from vce.core.labels import LABELS  # noqa: E402
from vce.core.params import ParamsError, from_dict  # noqa: E402
from vce.post.decoder import decode, fit_decoder, read_decoder  # noqa: E402
from vce.post.engine import Engine, engine_submission, fit_engine, presence_rates, tuning_timeline  # noqa: E402
from vce.post.events import EventParams, labels_to_submission, probs_to_submission  # noqa: E402
from vce.post.thresholds import ThresholdParams, f1_thresholds, tune_on_map  # noqa: E402
from vce.post.thresholds_file import write_thresholds  # noqa: E402
from vce.post.timeline import labels_on_time  # noqa: E402

DEMO_ENGINE = ROOT / "tests" / "golden" / "demo_engine.json"
FRAMES_PER_VIDEO = 1500


@pytest.fixture(scope="module")
def validation():
    """(frame probabilities as `join_probs` gives them, their (N, 17) labels, the labelled index)."""
    gt = json.loads(FIXTURE.read_text())
    gt = restrict(gt, set(sorted(v["video_id"] for v in gt["videos"])[:3]))
    frame_labels = frame_labels_from_events(gt)
    frame_labels = frame_labels[frame_labels["t"] < FRAMES_PER_VIDEO].reset_index(drop=True)
    probs = simulate_probs(frame_labels, 0.9, np.random.default_rng(0)).assign(valid=True)
    frames = frame_labels.assign(event_unit="index", index=frame_labels["t"], frame=frame_labels["t"])
    return probs, frame_labels[list(LABELS)].to_numpy(), frames


BROKEN_EVENTS = {**repo_params()["events"], "median_window": 4}  # even: refused wherever it is read


def _params(method: str, **engine) -> ThresholdParams:
    # map: a small search (one style, one value per knob, no refinement) keeps the test in seconds.
    return section_params(ThresholdParams, "thresholds", method=method, coarse_grid=[0.5, 1.01], rounds=0,
                          styles=["tuple"], median_windows=[1], fill_gaps=[0], min_lengths=[1],
                          presence_thresholds=[0.5], **({"engine": engine} if engine else {}))


def test_f1_is_the_frame_f1_thresholds_alone_without_reading_events(validation):
    probs, labels, frames = validation
    fitted = fit_decoder(probs, labels, frames, _params("f1"), BROKEN_EVENTS, seed=0)
    assert fitted.thresholds == f1_thresholds(labels, probs[list(LABELS)].to_numpy(), _params("f1"))
    assert (fitted.method, fitted.events, fitted.engine, fitted.report) == ("f1", None, None, {})


def test_map_tunes_from_the_f1_thresholds_and_params_events(validation):
    probs, labels, frames = validation
    params = _params("map")
    fitted = fit_decoder(probs, labels, frames, params, repo_params()["events"], seed=0)
    gt = labels_to_submission(labels_on_time(frames))
    start = f1_thresholds(labels, probs[list(LABELS)].to_numpy(), params)
    thresholds, tuned, report = tune_on_map(probs, gt, start, section_params(EventParams, "events"), params)
    assert (fitted.method, fitted.thresholds, fitted.events, fitted.engine) == ("map", thresholds, tuned.model_dump(), None)
    assert fitted.report == report and isinstance(report["best"], float)
    with pytest.raises(ParamsError, match="events.median_window"):
        fit_decoder(probs, labels, frames, params, BROKEN_EVENTS, seed=0)


def test_engine_is_fitted_with_the_presence_rates_of_every_labelled_video_without_reading_events(validation):
    probs, labels, frames = validation
    params = _params("engine", cross_fit=False, detector_choice="in_sample", ar_runs=False)
    fitted = fit_decoder(probs, labels, frames, params, BROKEN_EVENTS, seed=3)
    engine = fit_engine(tuning_timeline(probs, params.engine), labels_to_submission(labels_on_time(frames)),
                        params.engine, 3, presence_rates(frames))
    assert (fitted.method, fitted.events, fitted.engine) == ("engine", None, engine.to_dict())
    assert {**fitted.report, "seconds": None} == {**engine.report, "seconds": None}  # wall-clock seconds differ
    assert fitted.thresholds == f1_thresholds(labels, probs[list(LABELS)].to_numpy(), params)


def _saved(tmp_path, method: str, events: dict | None = None):
    thresholds = {label: 0.5 for label in LABELS}
    engine = json.loads(DEMO_ENGINE.read_text()) if method == "engine" else None
    path = tmp_path / "thresholds.json"
    write_thresholds(path, method, "frame", thresholds, events, engine)
    return path, thresholds


def test_the_engine_decodes_its_submission_and_clinical_list(tmp_path, validation):
    probs = validation[0]
    path, _ = _saved(tmp_path, "engine")
    submission, clinical = decode(read_decoder(path, repo_params()["events"]), probs)
    assert (submission, clinical) == engine_submission(probs, Engine.from_dict(json.loads(DEMO_ENGINE.read_text())))
    assert submission != clinical  # candidates appended per label in the one, one event per run in the other


def test_thresholds_decode_under_params_events_or_the_tuned_block(tmp_path, validation):
    probs = validation[0]
    path, thresholds = _saved(tmp_path, "f1")
    events = repo_params()["events"]
    expected = probs_to_submission(probs, thresholds, from_dict(EventParams, events, "events"))
    assert decode(read_decoder(path, events), probs) == (expected, expected)
    tuned = {**events, "median_window": 1, "min_length": 1, "presence": "none"}
    path, thresholds = _saved(tmp_path, "map", tuned)
    expected = probs_to_submission(probs, thresholds, from_dict(EventParams, tuned, "tuned"))
    assert decode(read_decoder(path, events), probs) == (expected, expected)
    assert expected != probs_to_submission(probs, thresholds, from_dict(EventParams, events, "events"))


def test_read_decoder_checks_params_events_even_where_the_tuned_block_replaces_it(tmp_path):
    path, _ = _saved(tmp_path, "map", repo_params()["events"])
    with pytest.raises(ParamsError, match="events.median_window"):
        read_decoder(path, BROKEN_EVENTS)
    broken = tmp_path / "broken.json"
    saved = json.loads(path.read_text())
    broken.write_text(json.dumps({**saved, "events": {**saved["events"], "median_window": 4}}))
    with pytest.raises(ParamsError, match=f"{broken}:events.median_window"):
        read_decoder(broken, repo_params()["events"])
