"""Frame decoding, the imbalance-aware sampler and the datasets."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch
from conftest import repo_params

from vce.data.dataset import (
    AugmentParams,
    EpochSampler,
    FrameDataset,
    epoch_order,
    eval_transform,
    rarest_label_weights,
    train_transform,
)
from vce.data.frames import FrameError, available_decoders, decode_frame

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)


@pytest.fixture()
def stills(fixtures_dir):
    return sorted((fixtures_dir / "wcebleedgen" / "frames").glob("*.png"))[:4]


def test_decoders_give_identical_pixels_on_real_frames(stills):
    for path in stills:
        reference = decode_frame(path, decoder="pil")
        assert reference.shape == (224, 224, 3) and reference.dtype == np.uint8
        for name in available_decoders():
            assert np.array_equal(decode_frame(path, decoder=name), reference), name


def test_decode_resizes_and_returns_rgb(tmp_path):
    image = np.zeros((40, 40, 3), np.uint8)
    image[..., 2] = 255  # pure red in BGR
    cv2.imwrite(str(tmp_path / "red.png"), image)
    decoded = decode_frame(tmp_path / "red.png", size=16)
    assert decoded.shape == (16, 16, 3)
    assert (decoded[..., 0] == 255).all() and (decoded[..., 2] == 0).all()


@pytest.mark.parametrize("mode", ["grey", "rgba", "16bit"])
def test_other_modes_become_8bit_rgb(tmp_path, mode):
    base = np.full((8, 8), 200, np.uint8)
    image = {"grey": base, "rgba": np.dstack([base] * 4), "16bit": (base.astype(np.uint16) * 257)}[mode]
    cv2.imwrite(str(tmp_path / "f.png"), image)
    for name in available_decoders():
        decoded = decode_frame(tmp_path / "f.png", decoder=name)
        assert decoded.shape == (8, 8, 3) and decoded.dtype == np.uint8
        assert int(decoded[0, 0, 0]) == 200, name


def test_bad_files_raise_frame_error_naming_the_file(tmp_path, stills):
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    truncated = tmp_path / "truncated.png"
    truncated.write_bytes(stills[0].read_bytes()[:5000])
    garbage = tmp_path / "garbage.png"
    garbage.write_bytes(b"not an image at all" * 10)
    cases = {empty: "empty file", truncated: "truncated PNG", garbage: "not a decodable image",
             tmp_path / "missing.png": "cannot read"}
    for path, message in cases.items():
        with pytest.raises(FrameError, match=message) as err:
            decode_frame(path)
        assert str(path) in str(err.value)


def _png(width, height, raw: bytes, interlace=0) -> bytes:
    import struct
    import zlib

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, interlace)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


@pytest.mark.parametrize("interlace", [0, 1])
def test_png_data_complete_counts_the_rows_ihdr_promises(interlace):
    from vce.data.frames import png_data_complete

    width, height = 37, 29
    passes = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]
    sizes = [(-(-(width - x) // dx), -(-(height - y) // dy)) for x, y, dx, dy in (passes if interlace else [(0, 0, 1, 1)])]
    need = sum(rows * (1 + 3 * cols) for cols, rows in sizes)
    assert png_data_complete(_png(width, height, bytes(need), interlace))
    assert cv2.imdecode(np.frombuffer(_png(width, height, bytes(need), interlace), np.uint8), 1).shape == (29, 37, 3)
    assert not png_data_complete(_png(width, height, bytes(need - 1), interlace))


def test_short_image_data_is_a_frame_error_for_every_decoder_not_a_crash(tmp_path):
    """libpng under torchvision segfaults on "Not enough image data": run each decoder in a child."""
    import subprocess
    import sys

    path = tmp_path / "short.png"
    path.write_bytes(_png(16, 16, bytes(16 * (1 + 48) // 3)))  # IEND present, a third of the rows
    for decoder in available_decoders():
        code = ("import sys; from vce.data.frames import FrameError, decode_frame\n"
                f"try:\n    decode_frame({str(path)!r}, decoder={decoder!r})\nexcept FrameError as err:\n"
                "    print(err); sys.exit(3)\n")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert done.returncode == 3 and str(path) in done.stdout, (decoder, done.returncode, done.stderr[-300:])


def test_rarest_label_weights():
    labels = np.zeros((100, 17), np.uint8)
    labels[:, 4] = 1          # every frame: colon (frequency 1.0)
    labels[:4, 16] = 1        # 4 frames: ulcer (frequency 0.04)
    weights = rarest_label_weights(labels)
    assert weights[0] == pytest.approx(1 / np.sqrt(0.04))
    assert weights[50] == pytest.approx(1.0)


def test_epoch_order_is_a_function_of_seed_and_epoch():
    weights = np.array([1.0, 1.0, 8.0])
    a, b = epoch_order(weights, 5000, 42, 3), epoch_order(weights, 5000, 42, 3)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, epoch_order(weights, 5000, 42, 4))
    assert np.bincount(a, minlength=3)[2] / 5000 == pytest.approx(0.8, abs=0.03)


def test_epoch_sampler_shards_each_batch_across_ranks_and_resumes():
    weights = np.ones(50)
    single = list(EpochSampler(weights, 40, 8, seed=1))
    ranks = [list(EpochSampler(weights, 40, 8, seed=1, rank=r, world=2)) for r in range(2)]
    rebuilt = []
    for step in range(5):  # batch `step` of one process = rank 0's slice + rank 1's slice
        rebuilt += ranks[0][step * 4:(step + 1) * 4] + ranks[1][step * 4:(step + 1) * 4]
    assert rebuilt == single
    resumed = EpochSampler(weights, 40, 8, seed=1)
    resumed.set_epoch(0, start_step=3)
    assert list(resumed) == single[24:]


def test_dataset_marks_undecodable_frames_invalid(tmp_path, stills):
    (tmp_path / "bad.png").write_bytes(b"")
    paths = [stills[0].name, "bad.png"]
    (tmp_path / stills[0].name).write_bytes(stills[0].read_bytes())
    targets = np.eye(17, dtype=np.uint8)[:2]
    dataset = FrameDataset(tmp_path, paths, targets, 32, 32, "bicubic", eval_transform())
    image, target, valid, row = dataset[0]
    assert image.shape == (3, 32, 32) and valid and row == 0 and target[0] == 1
    image, target, valid, row = dataset[1]
    assert not valid and image.abs().sum() == 0 and row == 1


def test_augmentation_is_reproducible_from_the_sample_seed(stills):
    dataset = FrameDataset(stills[0].parent, [stills[0].name], None, 40, 32, "bicubic",
                           train_transform(32, AugmentParams(**repo_params()["train"]["augment"]), CLIP_MEAN))
    first, second, other = dataset[(0, 7)][0], dataset[(0, 7)][0], dataset[(0, 8)][0]
    assert first.shape == (3, 32, 32)
    assert torch.equal(first, second) and not torch.equal(first, other)


@pytest.mark.parametrize("fill,expected", [("black", [0, 0, 0]), ("mean", [123, 117, 104])])
def test_random_erasing_fills_with_the_chosen_value(fill, expected):
    """train.augment.erasing_fill: the erased patch is black or the model's mean colour (pixels)."""
    values = {**repo_params()["train"]["augment"], "erasing": 1.0, "erasing_fill": fill, "crop_scale_min": 1.0,
              "hflip": 0.0, "vflip": 0.0, "rotation": 0.0, "brightness": 0.0, "contrast": 0.0, "saturation": 0.0,
              "hue": 0.0}
    transform = train_transform(32, AugmentParams(**values), CLIP_MEAN)
    image = torch.full((3, 32, 32), 255, dtype=torch.uint8)
    torch.manual_seed(0)
    out = transform(image)
    erased = (out != 255).any(dim=0)
    assert erased.any()
    assert out[:, erased].unique(dim=1).T.tolist() == [expected]
