"""The frame cache holds the PNG path's pixels, predictions from it equal the PNGs'; TTA flips.

Real WCEBleedGen frames (224 px) stored at 96 px in a Galar-like folder; the tiny model (64 px)
predicts them from PNGs and from caches at 64 px (eval pixels identical) and at 80 px (a second
resize, not identical, bounded).
"""

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from conftest import ROOT
from PIL import Image

from vce.core.labels import LABELS, NUM_LABELS
from vce.core.params import from_dict
from vce.data.dataset import eval_transform
from vce.data.frame_cache import CachedFrameDataset, CacheParams, FrameCache, build_cache
from vce.data.frames import decode_frame, resize_frame
from vce.infer.predict import PredictParams, _forward, predict_frames
from vce.model.frame_model import ModelParams, create_model

FRAMES = 12


def section(name: str, **changes) -> dict:
    return {**yaml.safe_load((ROOT / "params.yaml").read_text())[name], **changes}


@pytest.fixture(scope="module")
def frames(tmp_path_factory, fixtures_dir):
    root = tmp_path_factory.mktemp("cache_frames")
    sources = sorted((fixtures_dir / "wcebleedgen" / "frames").glob("*.png"))[:FRAMES]
    rows = []
    for k, source in enumerate(sources):
        path = f"v1/frame_{k:06d}.png"
        (root / "v1").mkdir(exist_ok=True)
        Image.open(source).convert("RGB").resize((96, 96), Image.Resampling.LANCZOS).save(root / path)
        rows.append({"video_id": "v1", "frame": k, "path": path, "root": str(root)})
    return root, pd.DataFrame(rows)


def cache_at(frames, tmp_path, size):
    root, table = frames
    params = from_dict(CacheParams, section("cache", enabled=True, size=size, num_workers=0, decoder="opencv"),
                       "cache")
    build_cache(table, tmp_path / f"cache{size}", params)
    return FrameCache.open(tmp_path / f"cache{size}")


def test_cached_pixels_are_the_png_pixels_after_the_one_resize(frames, tmp_path):
    root, table = frames
    cache = cache_at(frames, tmp_path, 64)
    assert cache.valid.all()
    rows = cache.rows_for(table)
    for k, path in enumerate(table["path"]):
        for decoder in ("opencv", "pil"):
            assert np.array_equal(cache.pixels[rows[k]], decode_frame(root / path, 64, "bicubic", decoder)), path
    # a larger cache: eval items are its pixels through the same one resize
    larger = cache_at(frames, tmp_path, 80)
    items = CachedFrameDataset(larger, larger.rows_for(table), None, 64, eval_transform(), resize=True)
    for k, path in enumerate(table["path"]):
        expected = resize_frame(decode_frame(root / path, 80, "bicubic", "opencv"), 64)
        assert np.array_equal(items[k][0].permute(1, 2, 0).numpy(), expected), path


def model_and_params(**predict):
    torch.manual_seed(0)
    model = create_model(from_dict(ModelParams, section("model"), "model"), torch.randn(NUM_LABELS, 64)).eval()
    params = from_dict(PredictParams, section("predict", num_workers=0, batch_size=5, bf16=False, **predict),
                       "predict")
    return model, params


def predicted(model, table, root, params, tmp_path, name, cache=None) -> np.ndarray:
    out = tmp_path / f"{name}.parquet"
    predict_frames(model, table, root, out, params, torch.device("cpu"), cache=cache)
    probs = pd.read_parquet(out)
    assert probs["valid"].all() and len(probs) == len(table)
    return probs[list(LABELS)].to_numpy()


def test_cached_and_png_predictions_agree(frames, tmp_path):
    root, table = frames
    model, params = model_and_params()
    from_png = predicted(model, table, root, params, tmp_path, "png")
    exact = predicted(model, table, root, params, tmp_path, "c64", cache_at(frames, tmp_path, 64))
    np.testing.assert_allclose(exact, from_png, rtol=0, atol=1e-6)
    # a larger cache resizes twice (80 → 64 after 96 → 80): close, but not the same pixels
    twice = predicted(model, table, root, params, tmp_path, "c80", cache_at(frames, tmp_path, 80))
    assert 0 < np.abs(twice - from_png).max() < 0.05


def test_tta_flip_averages_with_the_horizontally_flipped_frame():
    model, plain = model_and_params(tta_flip=False)
    _, tta = model_and_params(tta_flip=True)
    images = torch.randn(4, 3, 64, 64)
    probs, embedding = _forward(model, images, tta, torch.device("cpu"))
    with torch.no_grad():
        straight, flipped = model(images), model(images.flip(dims=[3]))
    expected = (model.frame_probs(straight) + model.frame_probs(flipped)) / 2
    np.testing.assert_allclose(probs, expected.numpy(), atol=1e-6)
    np.testing.assert_allclose(embedding, ((straight["embedding"] + flipped["embedding"]) / 2).numpy(), atol=1e-6)
    # and it is not the plain prediction (the tiny model is not flip-symmetric)
    assert np.abs(probs - _forward(model, images, plain, torch.device("cpu"))[0]).max() > 1e-4


def test_an_enabled_cache_without_the_frames_is_an_error_naming_the_root(tmp_path, capsys):
    """Each missing file would be cached as an undecodable frame, a new cache that reruns training (issue 50)."""
    from conftest import load_stage, stage_args, tiny_params

    params = tiny_params(tmp_path)
    params["cache"]["enabled"] = True
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    assert load_stage("cache_frames").main(stage_args(tmp_path)["cache_frames"]) == 2
    assert capsys.readouterr().err.startswith(f"error: frame root not found: {tmp_path}/demo/galar (data.root): ")
    assert not (tmp_path / "cache").exists()
    params["cache"]["enabled"] = False  # disabled: no frame is read, the folder that says so is written
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    assert load_stage("cache_frames").main(stage_args(tmp_path)["cache_frames"]) == 0
    assert (tmp_path / "cache" / "meta.json").read_text() == '{"enabled": false}\n'
