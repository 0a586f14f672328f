"""The chunked prediction path (vce/data/eval_batches.py + the writer thread) against the per-frame
path it replaced: the same probabilities and embeddings bit for bit, from PNGs and from the
cache, with undecodable frames anywhere in a batch and a partial last batch; errors in the
writer or the reader raise, never hang.

Real WCEBleedGen frames stored at 96 px; the tiny model (64 px) predicts them.
"""

import threading

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from conftest import ROOT
from PIL import Image

from vce.core.labels import LABELS, NUM_LABELS
from vce.core.params import from_dict
from vce.data.dataset import FrameDataset, eval_transform, normalize_batch
from vce.data.eval_batches import chunk_bounds, threaded
from vce.data.frame_cache import CachedFrameDataset, CacheParams, FrameCache, build_cache
from vce.infer import predict, sink
from vce.infer.predict import PredictParams, predict_frames
from vce.model.frame_model import ModelParams, create_model

FRAMES = 12  # batches of 5: 5, 5 and a partial 2
BROKEN = (0, 4, 7, 11)  # first frame, last of a batch, inside a batch, the very last frame


def section(name: str, **changes) -> dict:
    return {**yaml.safe_load((ROOT / "params.yaml").read_text())[name], **changes}


@pytest.fixture(scope="module")
def frames(tmp_path_factory, fixtures_dir):
    root = tmp_path_factory.mktemp("fast_path")
    sources = sorted((fixtures_dir / "wcebleedgen" / "frames").glob("*.png"))[:FRAMES]
    (root / "v1").mkdir()
    rows = []
    for k, source in enumerate(sources):
        path = root / f"v1/frame_{k:06d}.png"
        Image.open(source).convert("RGB").resize((96, 96), Image.Resampling.LANCZOS).save(path)
        if k in BROKEN:
            path.write_bytes(path.read_bytes()[:500])  # truncated PNG: an invalid frame
        rows.append({"video_id": "v1", "frame": k, "path": f"v1/frame_{k:06d}.png", "root": str(root)})
    return root, pd.DataFrame(rows)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return create_model(from_dict(ModelParams, section("model"), "model"), torch.randn(NUM_LABELS, 64)).eval()


def params(**changes) -> PredictParams:
    settings = {"num_workers": 0, "batch_size": 5, "bf16": False, "decoder": "opencv", **changes}
    return from_dict(PredictParams, section("predict", **settings), "predict")


def cache_at(table, folder, size):
    build_cache(table, folder, from_dict(CacheParams, section("cache", enabled=True, size=size, num_workers=0,
                                                              decoder="opencv"), "cache"))
    return FrameCache.open(folder)


@torch.no_grad()
def per_frame_reference(model, table, root, params, cache=None):
    """The loop predict_frames ran before the chunked path: per-frame items, default collate."""
    pre = model.preprocess
    if cache is not None:
        dataset = CachedFrameDataset(cache, cache.rows_for(table), None, pre["image_size"], eval_transform(), True)
    else:
        dataset = FrameDataset(root, table["path"].to_numpy(), None, pre["image_size"], pre["image_size"],
                               "bicubic", eval_transform(), params.decoder)
    probs, embeddings, valid = [], [], []
    for images, _, ok, _ in torch.utils.data.DataLoader(dataset, batch_size=params.batch_size):
        outputs = model(normalize_batch(images, pre["mean"], pre["std"], torch.device("cpu")))
        batch = model.frame_probs(outputs).numpy()
        batch[~ok.numpy()] = np.nan
        probs.append(batch)
        embeddings.append(outputs["embedding"].numpy().astype(np.float16))
        valid.append(ok.numpy())
    return np.concatenate(probs), np.concatenate(embeddings), np.concatenate(valid)


def predicted(model, table, root, params, folder, cache=None):
    probs_out, emb_out = folder / "probs.parquet", folder / "emb.parquet"
    stats = predict_frames(model, table, root, probs_out, params, torch.device("cpu"), emb_out, cache=cache)
    probs = pd.read_parquet(probs_out)
    embeddings = np.stack(pq.read_table(emb_out).column("embedding").to_numpy(zero_copy_only=False))
    assert list(probs["frame"]) == sorted(table["frame"])
    return probs[list(LABELS)].to_numpy(), embeddings, probs["valid"].to_numpy(), stats


def assert_same(fast, reference):
    probs, embeddings, valid, _ = fast
    np.testing.assert_array_equal(valid, reference[2])
    np.testing.assert_array_equal(probs, reference[0])  # bit for bit, NaN rows where invalid
    np.testing.assert_array_equal(embeddings, reference[1])


def test_chunks_cover_every_frame_once_and_never_cross_a_batch():
    assert chunk_bounds(12, 5, 3) == [(0, 3), (3, 5), (5, 8), (8, 10), (10, 12)]
    assert chunk_bounds(12, 5, 8) == [(0, 5), (5, 10), (10, 12)]
    assert chunk_bounds(0, 5, 3) == []


@pytest.mark.parametrize("chunk, workers", [(1, 0), (3, 0), (5, 2), (7, 2)])
def test_png_path_equals_the_per_frame_path_bit_for_bit(frames, model, tmp_path, chunk, workers):
    root, table = frames
    settings = params(decode_chunk=chunk, num_workers=workers)
    reference = per_frame_reference(model, table, root, settings)
    assert list(np.flatnonzero(~reference[2])) == list(BROKEN)
    fast = predicted(model, table, root, settings, tmp_path)
    assert_same(fast, reference)
    assert fast[3]["invalid_frames"] == len(BROKEN)
    assert fast[3]["invalid_examples"] == [table["path"][k] for k in BROKEN]


@pytest.mark.parametrize("size, shuffled, workers", [(64, False, 0), (64, True, 0), (80, False, 0), (80, True, 2)])
def test_cache_path_equals_the_per_frame_path_bit_for_bit(frames, model, tmp_path, size, shuffled, workers):
    """At the model's size (the reader thread) and larger (resized in the loader); cache rows
    in index order (one memmap slice per chunk) or not (gathered)."""
    root, table = frames
    order = table.sample(frac=1, random_state=1) if shuffled else table
    cache = cache_at(order, tmp_path / "cache", size)
    assert list(np.flatnonzero(~cache.valid[cache.rows_for(table)])) == list(BROKEN)
    stored = np.load(tmp_path / "cache" / "pixels.npy", mmap_mode="r+")
    stored[~cache.valid] = 77  # an invalid row's stored pixels are never used: it is a zero image
    stored.flush()
    settings = params(decode_chunk=3, num_workers=workers)
    assert_same(predicted(model, table, root, settings, tmp_path, cache), per_frame_reference(model, table, root,
                                                                                           settings, cache))


def test_no_frames_still_writes_both_files(frames, model, tmp_path):
    root, table = frames
    probs_out, emb_out = tmp_path / "p.parquet", tmp_path / "e.parquet"
    predict_frames(model, table.iloc[:0], root, probs_out, params(), torch.device("cpu"), emb_out)
    assert len(pd.read_parquet(probs_out)) == 0
    assert pq.read_schema(emb_out).field("embedding").type.list_size == model.arch_config["embed_dim"]


def run_with_deadline(function, seconds=120):
    """function()'s exception (or None); fails the test instead of hanging when it never returns."""
    outcome = {}

    def target():
        try:
            function()
        except BaseException as err:
            outcome["error"] = err

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "predict_frames hung"
    return outcome.get("error")


def test_an_error_in_the_writer_thread_is_raised_and_leaves_no_output(frames, model, tmp_path, monkeypatch):
    root, table = frames

    def failing_table(*args):
        raise OSError("disk full")

    monkeypatch.setattr(sink, "probs_table", failing_table)
    # batches of one frame: the main thread keeps filling the queue after the writer died
    settings = params(batch_size=1, row_group_frames=1)
    error = run_with_deadline(lambda: predict_frames(model, table, root, tmp_path / "p.parquet", settings,
                                                     torch.device("cpu"), tmp_path / "e.parquet"))
    assert isinstance(error, OSError) and str(error) == "disk full"
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no output, no temporary file
    assert not [t for t in threading.enumerate() if t.name == "predict-writer"]


@pytest.mark.parametrize("from_cache", [False, True])
def test_an_error_in_the_main_thread_stops_the_writer_and_the_reader(frames, model, tmp_path, monkeypatch, from_cache):
    root, table = frames
    cache = cache_at(table, tmp_path / "cache", 64) if from_cache else None  # 64: the reader thread
    calls = []

    def failing_forward(*args):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("out of memory")
        return real_forward(*args)

    real_forward = predict._forward
    monkeypatch.setattr(predict, "_forward", failing_forward)
    out = tmp_path / "out"
    error = run_with_deadline(lambda: predict_frames(model, table, root, out / "p.parquet", params(decode_chunk=1, prefetch_chunks=1),
                                                     torch.device("cpu"), cache=cache))
    assert isinstance(error, RuntimeError) and str(error) == "out of memory"
    assert sorted(p.name for p in out.iterdir()) == []
    assert not [t for t in threading.enumerate() if t.name in ("predict-writer", "cache-reader")]


class _Items(torch.utils.data.Dataset):
    def __init__(self, count, failing=None):
        self.count, self.failing = count, failing

    def __len__(self):
        return self.count

    def __getitem__(self, i):
        if i == self.failing:
            raise ValueError(f"item {i} unreadable")
        return i


def test_the_cache_reader_thread_keeps_order_raises_errors_and_stops_when_left():
    assert list(threaded(_Items(50), depth=2)) == list(range(50))
    with pytest.raises(ValueError, match="^item 7 unreadable$"):
        list(threaded(_Items(50, failing=7), depth=2))
    items = threaded(_Items(1000), depth=2)
    assert next(items) == 0
    items.close()  # the consumer stops early (an error downstream): the reader thread ends
    assert not [t for t in threading.enumerate() if t.name == "cache-reader"]


def test_profile_reports_the_stages(frames, model, tmp_path):
    root, table = frames
    profile = {}
    predict_frames(model, table, root, tmp_path / "p.parquet", params(decode_chunk=3), torch.device("cpu"),
                   tmp_path / "e.parquet", profile=profile)
    assert profile["frames"] == FRAMES and profile["reader"] == "main process" and profile["chunk"] == 3
    stages = profile["stages"]
    for stage in ("loader_decode", "loader_resize", "main_wait_loader", "normalize", "forward", "d2h",
                  "main_wait_writer", "writer_wait_device", "writer_parquet"):
        assert stages[stage] >= 0, stage
    assert stages["loader_decode"] > 0 and stages["forward"] > 0 and stages["writer_parquet"] > 0
    assert profile["seconds"] > stages["forward"]
    assert 0 < profile["first_batch_seconds"] < profile["seconds"]
