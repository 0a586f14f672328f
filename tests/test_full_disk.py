"""A full disk at every write of every stage (issue 32): the stage exits 2 with one line naming
the output, and the previous run's outputs survive byte for byte, nothing half-written beside
them (`vce.core.io`: every output of a stage is one set, renamed only when its main returns).

The stages `test_faults` does not cover (events, thresholds, index, predict there), on one tiny
pipeline built once in the DVC layout (dvc.yaml) and copied per test. Each test pins the number
of writes (`_complete` calls) it expects: a write that bypasses `vce.core.io`, which the fault
cannot reach, or a new output outside the set, changes it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import PREPARE, ROOT, load_stage, stage_args, tiny_params
from test_faults import _disk_full_at, _snapshot, check_all_or_nothing, one_line_error

# Four labelled videos (two validate: the temporal model cross-fits over them) and one test video.
DEMO = {"n_videos": 4, "frames_per_video": 100, "n_test_videos": 1, "test_frames_per_video": 100, "image_size": 16}
TRAIN = {"epochs": 1, "batch_size": 16, "samples_per_epoch": 32, "val_batch_size": 64, "checkpoint_every": 0}
TEMPORAL = {"hidden": 8, "dilations": [1, 2], "steps": 5, "chunk_frames": 32, "batch_chunks": 2, "device": "cpu"}


def pipeline_args(d: Path) -> dict[str, list[str]]:
    """Every stage after `prompts` as dvc.yaml lays it out (fold 0 only), all under `d`."""
    args = stage_args(d)
    p = ["--params", str(d / "params.yaml")]
    common = ["--model", str(d / "models/model.pt"), "--frames", str(d / "split/frames.parquet"),
              "--test", str(d / "index/test.parquet"), "--held-out", str(d / "split/test.parquet"),
              "--cache", str(d / "cache")]
    on_ensemble = ["--predict-dir", str(d / "ensemble"), "--temporal-dir", str(d / "temporal"),
                   "--frames", str(d / "ensemble/frames.parquet")]
    args.update({
        "predict": p + ["--part", "labelled", *common, "--out-dir", str(d / "predict/fold_0"),
                        "--report", str(d / "metrics/predict_0.json")],
        "predict_test": p + ["--part", "test", *common, "--out-dir", str(d / "predict_test/fold_0"),
                             "--report", str(d / "metrics/predict_test_0.json")],
        "ensemble": p + ["--predict-dir", str(d / "predict"), "--test-dir", str(d / "predict_test"),
                         "--frames", str(d / "split/frames.parquet"), "--out-dir", str(d / "ensemble"),
                         "--metrics", str(d / "metrics/ensemble.json")],
        "temporal": p + ["--predict-dir", str(d / "ensemble"), "--frames", str(d / "ensemble/frames.parquet"),
                         "--out-dir", str(d / "temporal"), "--metrics", str(d / "metrics/temporal.json"),
                         "--route", str(d / "metrics/route.json"), "--model-out", str(d / "models/temporal.pt")],
        "thresholds": p + on_ensemble + ["--out", str(d / "models/thresholds.json"),
                                         "--metrics", str(d / "metrics/thresholds.json")],
        "events": p + on_ensemble + ["--thresholds", str(d / "models/thresholds.json"),
                                     "--test-frames", str(d / "index/test.parquet"),
                                     "--held-out", str(d / "split/test.parquet"), "--out-dir", str(d / "events")],
    })
    for name in ("score", "report"):
        args[name] = [str(d / "ensemble/frames.parquet") if previous.endswith("split/frames.parquet") else previous
                      for previous in args[name]]
    args["report"][args["report"].index("--predict-dir") + 1] = str(d / "ensemble")
    return args


AFTER_PROMPTS = ["train", "predict", "predict_test", "ensemble", "temporal", "thresholds", "events", "score", "report"]


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Tiny tensors: one thread is ~20x faster on a busy 2-core box (OpenMP spin-waits)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("full_disk")
    params = tiny_params(d)
    params["demo"].update(DEMO)
    params["train"].update(TRAIN)
    params["temporal"].update(TEMPORAL)
    params["split"]["val_fraction"] = 0.5
    # The detect test needs a label on the temporal route: with 2 short validation videos no label
    # has positives in the default 5 bootstrap blocks, so the evidence rule would keep all on frame.
    params["post"]["route_min_positive_blocks"] = 1
    (d / "params.yaml").write_text(yaml.safe_dump(params))
    args = pipeline_args(d)
    for name in PREPARE + AFTER_PROMPTS:
        assert load_stage(name.removesuffix("_test")).main(args[name]) == 0, f"stage {name} failed"
    return d


def copy_of(pipeline: Path, tmp_path: Path) -> tuple[Path, dict[str, list[str]]]:
    """A private copy of the pipeline (its params pointing into the copy) and its stage arguments."""
    work = tmp_path / "p"
    shutil.copytree(pipeline, work)
    (work / "params.yaml").write_text((work / "params.yaml").read_text().replace(str(pipeline), str(work)))
    return work, pipeline_args(work)


def params_of(work: Path) -> dict:
    return yaml.safe_load((work / "params.yaml").read_text())


def edit_params(work: Path, section: str, **values) -> None:
    params = params_of(work)
    params[section].update(values)
    (work / "params.yaml").write_text(yaml.safe_dump(params))


def out_args(args: list[str], **paths: Path) -> list[str]:
    """`args` with the value of each `--<name>` replaced (dashes as underscores in `paths`)."""
    args = list(args)
    for name, path in paths.items():
        args[args.index(f"--{name.replace('_', '-')}") + 1] = str(path)
    return args


# ----------------------------------------------------------------------------- before the model

def test_params_check_is_kept_under_a_full_disk(tmp_path, monkeypatch, capsys):
    """Two writes (the check, constant by design, and what thresholds reads of events), published
    together: a full disk at the first keeps the previous file (here an older one) and adds none."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "params_check.json").write_text('{"sections": ["base"]}\n')
    before = _snapshot(out)
    args = ["--params", str(ROOT / "params.yaml"), "--out", str(out / "params_check.json")]
    calls = _disk_full_at(monkeypatch, 1)
    assert load_stage("params").main(args) == 2
    one_line_error(capsys, f"cannot write {out / 'params_check.json'} (No space left on device)")
    assert _snapshot(out) == before and calls["n"] == 1
    calls = _disk_full_at(monkeypatch, 0)
    assert load_stage("params").main(args) == 0 and calls["n"] == 2
    assert json.loads((out / "params_check.json").read_text())["sections"][0] == "base"
    assert json.loads((out / "thresholds_reads.json").read_text()) == {"method": "engine", "events": None}
    assert _snapshot(out) != before


def test_demo_data_folder_is_all_or_nothing_under_a_full_disk(tmp_path, monkeypatch, capsys):
    params = tiny_params(tmp_path)
    params["demo"].update(DEMO)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    args = ["--params", str(tmp_path / "params.yaml"), "--out", str(tmp_path / "out/demo")]
    change = lambda: edit_params(tmp_path, "demo", seed=params["demo"]["seed"] + 1)  # noqa: E731
    # the folder: generated in a staging folder beside, swapped in whole
    assert check_all_or_nothing(monkeypatch, capsys, lambda: load_stage("demo_data").main(args), change,
                                [tmp_path / "out"], least=1) == 1


def test_split_outputs_are_all_or_nothing_under_a_full_disk(pipeline, tmp_path, monkeypatch, capsys):
    work, args = copy_of(pipeline, tmp_path)
    out = work / "out"
    split = out_args(args["split"], out=out / "split/frames.parquet", metrics=out / "split.json")
    change = lambda: edit_params(work, "split", val_fraction=0.25)  # noqa: E731
    # frames.parquet, test.parquet (held out), split.json
    assert check_all_or_nothing(monkeypatch, capsys, lambda: load_stage("split").main(split), change, [out]) == 3


def test_frame_cache_is_all_or_nothing_under_a_full_disk(pipeline, tmp_path, monkeypatch, capsys):
    work, args = copy_of(pipeline, tmp_path)
    edit_params(work, "cache", enabled=True, size=16, num_workers=0, splits=["train", "val", "test"])
    cache = out_args(args["cache_frames"], out=work / "out/cache")
    change = lambda: edit_params(work, "cache", size=24)  # noqa: E731
    # the folder (pixels.npy, rows.parquet, meta.json inside)
    assert check_all_or_nothing(monkeypatch, capsys, lambda: load_stage("cache_frames").main(cache), change,
                                [work / "out"], least=1) == 1


def test_prompt_embeddings_are_kept_under_a_full_disk(pipeline, tmp_path, monkeypatch, capsys):
    work, args = copy_of(pipeline, tmp_path)
    prompts = out_args(args["prompts"], out=work / "out/prompt_embeddings.pt")
    change = lambda: edit_params(work, "base", seed=params_of(work)["base"]["seed"] + 1)  # noqa: E731  (the tiny text tower's random init)
    assert check_all_or_nothing(monkeypatch, capsys, lambda: load_stage("prompts").main(prompts), change,
                                [work / "out"], least=1) == 1


def test_train_outputs_are_all_or_nothing_under_a_full_disk(pipeline, tmp_path, monkeypatch, capsys):
    work, args = copy_of(pipeline, tmp_path)
    out, state = work / "out", work / "state"
    train = out_args(args["train"], model_out=out / "model.pt", metrics=out / "train.json", live_dir=out / "live",
                     state_dir=state)

    def run():
        shutil.rmtree(state, ignore_errors=True)  # scratch: a resumed run would write less
        return load_stage("train").main(train)

    change = lambda: edit_params(work, "train", lr_head=2 * params_of(work)["train"]["lr_head"])  # noqa: E731
    # scratch published at once (best.pt, last.pt: a failure there changes no output), then the
    # set: the DVCLive folder, model.pt, train.json
    assert check_all_or_nothing(monkeypatch, capsys, run, change, [out]) == 5


def test_frozen_backbone_features_are_all_or_nothing_under_a_full_disk(pipeline, tmp_path, monkeypatch, capsys):
    work, args = copy_of(pipeline, tmp_path)
    edit_params(work, "train", freeze_backbone=True)
    embed = out_args(args["embed"], out=work / "out/embed")
    change = lambda: edit_params(work, "base", seed=params_of(work)["base"]["seed"] + 1)  # noqa: E731  (the tiny tower's random init)
    # scratch published at once (predict's probabilities and embeddings of each part: a failure
    # there changes no output), then the set: labelled.parquet, test.parquet, meta.json
    assert check_all_or_nothing(monkeypatch, capsys, lambda: load_stage("embed").main(embed), change, [work / "out"]) == 7


def test_probe_outputs_are_all_or_nothing_under_a_full_disk(pipeline, tmp_path, monkeypatch, capsys):
    work, args = copy_of(pipeline, tmp_path)
    edit_params(work, "train", freeze_backbone=True)
    assert load_stage("embed").main(out_args(args["embed"], out=work / "embed")) == 0
    out = work / "out"
    train = out_args(args["train"], model_out=out / "model.pt", metrics=out / "train.json", live_dir=out / "live",
                     state_dir=work / "state", features=work / "embed")
    change = lambda: edit_params(work, "train", lr_head=2 * params_of(work)["train"]["lr_head"])  # noqa: E731
    # the DVCLive folder, model.pt, train.json (no scratch: a probe keeps no resume state)
    assert check_all_or_nothing(monkeypatch, capsys, lambda: load_stage("train").main(train), change, [out]) == 3


# ----------------------------------------------------------------------------- after the model

def test_ensemble_outputs_are_all_or_nothing_under_a_full_disk(pipeline, tmp_path, monkeypatch, capsys):
    work, args = copy_of(pipeline, tmp_path)
    out = work / "out"
    ensemble = out_args(args["ensemble"], out_dir=out / "ensemble", metrics=out / "ensemble.json")
    change = lambda: edit_params(work, "ensemble", method="ap")  # noqa: E731
    # val, val embeddings, frames, test, test embeddings, ensemble.json
    assert check_all_or_nothing(monkeypatch, capsys, lambda: load_stage("ensemble").main(ensemble), change,
                                [out]) == 6


def test_temporal_outputs_are_all_or_nothing_under_a_full_disk(pipeline, tmp_path, monkeypatch, capsys):
    work, args = copy_of(pipeline, tmp_path)
    out = work / "out"
    temporal = out_args(args["temporal"], out_dir=out / "temporal", metrics=out / "temporal.json",
                        route=out / "route.json", model_out=out / "temporal.pt")
    change = lambda: edit_params(work, "temporal", lr=3 * params_of(work)["temporal"]["lr"])  # noqa: E731
    # val, test, temporal.json, route.json, temporal.pt
    assert check_all_or_nothing(monkeypatch, capsys, lambda: load_stage("temporal").main(temporal), change,
                                [out]) == 5


def test_score_outputs_are_all_or_nothing_under_a_full_disk(pipeline, tmp_path, monkeypatch, capsys):
    work, args = copy_of(pipeline, tmp_path)
    out = work / "out"
    score = out_args(args["score"], gt_out=out / "score/val_gt.json", metrics=out / "score.json",
                     val_headline=out / "headline/val.json", test_headline=out / "headline/test.json")

    def change():  # the first validation video's events dropped
        events = json.loads((work / "events/val.json").read_text())
        events["videos"][0]["events"] = []
        (work / "events/val.json").write_text(json.dumps(events))

    # val_gt.json, headline/val.json, test_gt.json, headline/test.json, score.json
    assert check_all_or_nothing(monkeypatch, capsys, lambda: load_stage("score").main(score), change, [out]) == 5


def test_report_outputs_are_all_or_nothing_under_a_full_disk(pipeline, tmp_path, monkeypatch, capsys):
    work, args = copy_of(pipeline, tmp_path)
    out = work / "out"
    report = out_args(args["report"], plots_dir=out / "plots", report=out / "report.md",
                      viewer_dir=out / "plots/viewer")
    change = lambda: edit_params(work, "report", curve_points=20, timeline_dpi=50)  # noqa: E731
    writes = check_all_or_nothing(monkeypatch, capsys, lambda: load_stage("report").main(report), change, [out])
    timelines = len(list((out / "plots/timelines").glob("*.png")))
    assert timelines == 3  # every validation and test video
    # pr, roc, per_class, temporal_ap, per_video, per_video_bars (.csv), the timelines, report.md,
    # the viewer folder (pages, thumbnails, assets inside)
    assert writes == 6 + timelines + 1 + 1


def test_detect_outputs_are_all_or_nothing_under_a_full_disk(pipeline, tmp_path, monkeypatch, capsys):
    import tempfile

    work, _ = copy_of(pipeline, tmp_path)
    out = work / "out"
    (work / "scratch").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(work / "scratch"))  # its scratch probabilities, named under work
    exam = next((work / "demo/test").iterdir())
    detect = [str(exam), "--out", str(out / "events.json"), "--clinical-out", str(out / "clinical.json"),
              "--viewer-dir", str(out / "viewer"), "--models", str(work / "models/model.pt"),
              "--ensemble", str(work / "metrics/ensemble.json"), "--temporal", str(work / "models/temporal.pt"),
              "--thresholds", str(work / "models/thresholds.json"), "--params", str(work / "params.yaml")]

    def change():  # a shorter exam
        for frame in sorted(exam.iterdir())[-20:]:
            frame.unlink()

    from vce.infer import detect as entry

    # scratch, read back at once (a failure there changes no output): each model's probabilities
    # and embeddings (labels are routed to the temporal model), the fused ones; then the set:
    # events.json, clinical.json, the viewer folder
    assert "temporal" in json.loads((work / "metrics/route.json").read_text())["routes"].values()
    assert check_all_or_nothing(monkeypatch, capsys, lambda: entry.main(detect), change, [out]) == 4 + 3
