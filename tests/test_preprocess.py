"""The one resize (vce.data.frames.resize_frame) against open_clip's own preprocess, on real frames.

open_clip's eval transform (Resize(size, bicubic) + CenterCrop on a PIL image) is what BiomedCLIP was
trained with. Real WCEBleedGen frames (224 px) are first brought up to each capsule's frame size
(224 Olympus-like, 336, 480 Olympus/PillCam, 512), PNG-encoded, decoded by every decoder and resized
to the model's 224 px; the uint8 pixels must equal open_clip's within 1 level.
"""

import cv2
import numpy as np
import pytest
from PIL import Image

from vce.core.errors import ParamsError
from vce.data.frames import available_decoders, decode_frame, resize_frame

open_clip = pytest.importorskip("open_clip")

FRAMES = 4  # real frames per size (a few seconds)
MEAN, STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)


def open_clip_pixels(image: np.ndarray, size: int, interpolation: str = "bicubic") -> np.ndarray:
    """open_clip's eval preprocess up to (not including) Normalize, back to uint8 (H, W, 3)."""
    transform = open_clip.image_transform(size, is_train=False, mean=MEAN, std=STD, interpolation=interpolation)
    steps = [t for t in transform.transforms if type(t).__name__ != "Normalize"]
    assert len(steps) == len(transform.transforms) - 1
    tensor = Image.fromarray(image)
    for step in steps:
        tensor = step(tensor)
    return (tensor.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)


def real_frames(fixtures_dir, count=FRAMES):
    paths = sorted((fixtures_dir / "wcebleedgen" / "frames").glob("*.png"))[:: 300 // count][:count]
    assert len(paths) == count
    return [cv2.cvtColor(cv2.imread(str(p)), cv2.COLOR_BGR2RGB) for p in paths]


@pytest.mark.parametrize("frame_size", [224, 336, 480, 512])
def test_resize_equals_open_clip_preprocess_for_every_decoder(fixtures_dir, tmp_path, frame_size):
    worst = {}
    for k, frame in enumerate(real_frames(fixtures_dir)):
        large = np.asarray(Image.fromarray(frame).resize((frame_size, frame_size), Image.Resampling.LANCZOS))
        path = tmp_path / f"frame_{k}.png"
        Image.fromarray(large).save(path)
        reference = open_clip_pixels(large, 224)
        for decoder in available_decoders():
            ours = decode_frame(path, 224, "bicubic", decoder)
            assert ours.shape == (224, 224, 3) and ours.dtype == np.uint8
            diff = np.abs(ours.astype(int) - reference.astype(int))
            worst[decoder] = max(worst.get(decoder, 0), int(diff.max()))
    assert set(worst) == set(available_decoders())
    assert max(worst.values()) <= 1, worst


def test_non_square_frames_follow_open_clips_shortest_side_and_centre_crop(fixtures_dir):
    frame = real_frames(fixtures_dir, 1)[0]
    wide = np.asarray(Image.fromarray(frame).resize((400, 300)))
    for interpolation in ("bicubic", "bilinear"):
        ours = resize_frame(wide, 224, interpolation)
        reference = open_clip_pixels(wide, 224, interpolation)
        assert np.abs(ours.astype(int) - reference.astype(int)).max() <= 1


def test_the_old_resize_was_further_from_open_clip(fixtures_dir):
    """Why this exists: cv2 bicubic without antialiasing, 480 → 224 px, departs by several levels."""
    frame = real_frames(fixtures_dir, 1)[0]
    large = np.asarray(Image.fromarray(frame).resize((480, 480), Image.Resampling.LANCZOS))
    reference = open_clip_pixels(large, 224).astype(int)
    old = cv2.resize(large, (224, 224), interpolation=cv2.INTER_CUBIC).astype(int)
    assert np.abs(old - reference).max() > 5
    assert np.abs(resize_frame(large, 224).astype(int) - reference).max() <= 1


def test_unknown_interpolation_is_a_params_error():
    with pytest.raises(ParamsError, match="interpolation 'area'"):
        resize_frame(np.zeros((32, 32, 3), np.uint8), 16, "area")
