"""Stages cost what their data costs: seconds on tiny or empty inputs (issue 51).

A fake Galar tree of 6 videos x ~45 frames took the temporal stage 954 s (42 validation frames
trained in crops of 256) and predict_test 7.4 CPU-s for zero frames. A full-size run multiplies
such fixed costs by nothing, but a user's first smoke run and CI pay them in full. These tests run
each stage's own code in-process (imports already paid) and bound its CPU seconds.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import ROOT, load_stage, section_params

from vce.core.labels import LABELS
from vce.data.index import TEST_COLUMNS, empty_table
from vce.infer.temporal import _crop_batch, build_sequences


def sequences(lengths, dim=8):
    frames = pd.concat([pd.DataFrame({"video_id": f"v{i}", "frame": np.arange(n)}) for i, n in enumerate(lengths)],
                       ignore_index=True)
    rng = np.random.default_rng(0)
    return build_sequences(frames, rng.normal(size=(len(frames), dim)).astype(np.float32), None,
                           (rng.random((len(frames), len(LABELS))) < 0.1).astype(np.uint8))


def test_temporal_crops_are_cut_to_the_longest_video_never_padded_past_it():
    embeddings, valid, labels = _crop_batch(sequences([40, 25]), 256, 8, np.random.default_rng(0))
    assert embeddings.shape == (8, 40, 8) and labels.shape == (8, 40, len(LABELS))
    assert valid.all(axis=1).sum() + (~valid).any(axis=1).sum() == 8  # the 25-frame video's crops: masked tail
    long, _, _ = _crop_batch(sequences([600, 25]), 256, 8, np.random.default_rng(0))
    assert long.shape == (8, 256, 8)  # a video as long as the chunk: the chunk, as before


@pytest.fixture
def tiny_temporal_workspace(tmp_path):
    """predict's outputs for 2 validation videos of 40 frames and 1 test video, the repository's
    temporal params (300 steps, 256-frame chunks) on the CPU."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["temporal"]["device"] = "cpu"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    predict = tmp_path / "predict"
    predict.mkdir()
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    index = []
    for split, videos in (("val", ["1", "2"]), ("test", ["t"])):
        frames = pd.DataFrame({"video_id": np.repeat(videos, 40), "frame": np.tile(np.arange(40) * 5, len(videos))})
        emb = rng.normal(size=(len(frames), 16)).astype(np.float16)
        pq.write_table(pa.table({"video_id": frames["video_id"], "frame": frames["frame"],
                                 "embedding": pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), 16)}),
                       predict / f"{split}_embeddings.parquet")
        probs = frames.copy()
        probs[list(LABELS)] = rng.random((len(frames), len(LABELS))).astype(np.float32)
        probs["valid"] = True
        probs.to_parquet(predict / f"{split}.parquet", index=False)
        if split == "val":
            table = frames.assign(index=frames.groupby("video_id").cumcount(), event_unit="index", split="val")
            table[list(LABELS)] = (rng.random((len(frames), len(LABELS))) < 0.2).astype(np.uint8)
            index.append(table)
    pd.concat(index, ignore_index=True).to_parquet(tmp_path / "frames.parquet", index=False)
    return tmp_path


def cpu_seconds(call) -> float:
    began = time.process_time()
    assert call() == 0
    return time.process_time() - began


@pytest.fixture
def two_threads():
    """torch's thread count on the 2-core machine without base.exact_cpu (what a real-data run has)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


def test_temporal_stage_on_80_validation_frames_costs_seconds(tiny_temporal_workspace, two_threads):
    ws = tiny_temporal_workspace
    seconds = cpu_seconds(lambda: load_stage("temporal").main([
        "--params", str(ws / "params.yaml"), "--predict-dir", str(ws / "predict"), "--frames", str(ws / "frames.parquet"),
        "--out-dir", str(ws / "temporal"), "--metrics", str(ws / "temporal.json"), "--route", str(ws / "route.json"),
        "--model-out", str(ws / "temporal.pt")]))
    assert json.loads((ws / "temporal.json").read_text())["train_frames"] == 80
    # 3 fits of 300 steps: ~15 CPU-s on one thread; two OpenMP threads on these small tensors ~8x that
    assert seconds < 30, f"temporal stage: {seconds:.1f} CPU-s for 80 validation frames (3 fits of 300 steps)"


def test_predict_on_zero_test_frames_costs_seconds(tmp_path, one_thread):
    from vce.model.checkpoint import save_model
    from vce.model.frame_model import ModelParams, create_model

    save_model(tmp_path / "model.pt", create_model(section_params(ModelParams, "model")), train_videos=["1"])
    empty_table(TEST_COLUMNS).to_parquet(tmp_path / "test.parquet", index=False)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["data"]["test_root"] = str(tmp_path)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    seconds = cpu_seconds(lambda: load_stage("predict").main([
        "--params", str(tmp_path / "params.yaml"), "--part", "test", "--model", str(tmp_path / "model.pt"),
        "--test", str(tmp_path / "test.parquet"), "--held-out", str(tmp_path / "test.parquet"),
        "--cache", str(tmp_path / "no_cache"), "--out-dir", str(tmp_path / "out"), "--report", str(tmp_path / "r.json")]))
    assert json.loads((tmp_path / "r.json").read_text())["test"]["frames"] == 0
    assert (tmp_path / "out" / "test.parquet").is_file()
    assert seconds < 3, f"predict --part test: {seconds:.1f} CPU-s for zero frames"
