"""Decoding capsule frames: one fast, exact path (OpenCV) used by training and prediction.

A frame that cannot be decoded raises `FrameError` naming the file; the data loaders turn it
into an invalid sample that is counted and recorded, never silently dropped.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from vce.core.errors import DataError, ParamsError
from vce.data.frame_files import image_pixels

# OpenCV's own thread pool fights the DataLoader workers for the same cores.
cv2.setNumThreads(1)

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_IEND = b"IEND\xaeB`\x82"

# The one resize of every path (train, predict, cache, benchmarks): PIL's antialiased filters,
# which is what open_clip's `preprocess` runs (torchvision Resize on a PIL image), so frames reach
# the model as in BiomedCLIP's own preprocessing (tests/test_preprocess.py: equal to open_clip's
# uint8 pixels for 224-512 px frames). open_clip's configs name one of these two.
INTERPOLATION = ("bicubic", "bilinear")


# OpenCV's own ceiling (CV_IO_MAX_IMAGE_PIXELS, 2**30): every decoder gets the same one, so a
# 60000² header is an invalid frame whichever decoder is chosen, not a cv2.error from one of them.
DECODER_MAX_PIXELS = 1 << 30


class FrameError(DataError):
    """A frame file is missing, empty, truncated or not an image."""


def _decode_cv2(data: np.ndarray):
    image = cv2.imdecode(data, cv2.IMREAD_COLOR)  # (H, W, 3) BGR, 8-bit
    return None if image is None else cv2.cvtColor(image, cv2.COLOR_BGR2RGB)


def _decode_pil(data: np.ndarray):
    import io

    from PIL import Image

    try:
        with Image.open(io.BytesIO(data.tobytes())) as image:
            if image.mode in ("I;16", "I;16B", "I"):
                return None  # 16-bit: left to OpenCV, which scales it to 8 bits
            return np.asarray(image.convert("RGB"))
    except Image.DecompressionBombError as err:
        raise MemoryError(str(err)) from None  # over PIL's size limit: no fallback decoder either
    except OSError:
        return None


_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))
_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # PNG colour type → samples per pixel


def png_data_complete(data: bytes) -> bool:
    """Whether a PNG's IDAT stream inflates to at least the bytes its IHDR says (not for non-PNGs).

    torchvision's libpng wrapper crashes the process (SIGSEGV) on "Not enough image data"
    instead of raising, so the torchvision decoder checks this first; it costs one inflate.
    """
    import struct
    import zlib

    if data[:8] != _PNG_SIGNATURE or len(data) < 33 or data[12:16] != b"IHDR":
        return True  # not a PNG or no IHDR: the decoders refuse it themselves
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", data[16:29])
    bits = depth * _CHANNELS.get(colour, 4)
    passes = _ADAM7 if interlace else ((0, 0, 1, 1),)
    expected = 0
    for x0, y0, dx, dy in passes:
        cols, rows = -(-(width - x0) // dx), -(-(height - y0) // dy)
        if cols > 0 and rows > 0:
            expected += rows * (1 + -(-cols * bits // 8))
    stream, pos = zlib.decompressobj(), 8
    inflated = 0
    while pos + 8 <= len(data) and inflated < expected:
        length = int.from_bytes(data[pos:pos + 4], "big")
        if data[pos + 4:pos + 8] == b"IDAT":
            try:
                inflated += len(stream.decompress(data[pos + 8:pos + 8 + length], expected - inflated))
            except zlib.error:
                return False
        pos += 12 + length
    return inflated >= expected


def _decode_torchvision(data: np.ndarray):
    import torch
    from torchvision.io import ImageReadMode, decode_image

    if not png_data_complete(data.tobytes()):
        return None
    try:
        image = decode_image(torch.from_numpy(data), mode=ImageReadMode.RGB)  # (3, H, W)
    except RuntimeError:
        return None
    return image.permute(1, 2, 0).numpy() if image.dtype == torch.uint8 else None


def _decode_pyspng(data: np.ndarray):
    try:
        import pyspng
    except ImportError:
        raise ParamsError("decoder 'pyspng' is not installed: pip install pyspng, "
                         "or set the decoder key of train/predict/cache to opencv") from None

    try:
        image = pyspng.load(data.tobytes())
    except Exception:  # pyspng raises plain exceptions on corrupt data
        return None
    if image.dtype != np.uint8:
        return None
    if image.ndim == 2:
        image = np.repeat(image[:, :, None], 3, axis=2)
    return image[:, :, :3]


DECODERS = {"opencv": _decode_cv2, "pil": _decode_pil, "torchvision": _decode_torchvision, "pyspng": _decode_pyspng}


def available_decoders() -> list[str]:
    """Decoders whose library imports here (pyspng is optional)."""
    names = ["opencv", "pil", "torchvision"]
    try:
        import pyspng  # noqa: F401

        names.append("pyspng")
    except ImportError:
        pass
    return names


def decode_frame(path: str | Path, size: int | None = None, interpolation: str = "bicubic",
                 decoder: str = "opencv", max_pixels: int | None = None) -> np.ndarray:
    """Read an image file into an RGB uint8 array (H, W, 3), optionally resized to size × size
    (`resize_frame`, open_clip's resize).

    Greyscale, RGBA and 16-bit frames are converted to 8-bit RGB (OpenCV's IMREAD_COLOR).
    `decoder` picks the PNG decoder; all give identical pixels on 8-bit RGB PNGs (tested),
    so it is a speed choice only (bench/predict.py measures them).
    A PNG must end with its IEND chunk: libpng would otherwise return a partly grey image
    from a truncated file without an error. A PNG or JPEG whose header declares more than
    `max_pixels` pixels (data.max_frame_pixels; the index already drops those) or than
    DECODER_MAX_PIXELS is refused before any decoder allocates it; a decoder's own limit
    (PIL's DecompressionBombError) is a FrameError too, never a traceback.
    """
    path = Path(path)
    try:
        data = np.fromfile(path, dtype=np.uint8)
    except OSError as err:
        raise FrameError(f"{path}: cannot read ({err.strerror})") from None
    if data.size == 0:
        raise FrameError(f"{path}: empty file (0 bytes)")
    head = data[:8].tobytes()
    if head == _PNG_SIGNATURE and data[-8:].tobytes() != _PNG_IEND:
        raise FrameError(f"{path}: truncated PNG (no IEND chunk at the end)")
    limit = DECODER_MAX_PIXELS if max_pixels is None else min(max_pixels, DECODER_MAX_PIXELS)
    pixels = image_pixels(data[:65536].tobytes())
    if pixels is not None and pixels > limit:
        raise FrameError(f"{path}: header declares {pixels:,} pixels, over "
                         + (f"data.max_frame_pixels = {limit:,}" if limit == max_pixels else
                            f"the {limit:,} any decoder here accepts"))
    try:
        image = DECODERS[decoder](data)
        if image is None and decoder != "opencv":
            image = _decode_cv2(data)  # modes a fast decoder declines (16-bit, palette) go to OpenCV
    except (cv2.error, MemoryError) as err:
        reason = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
        raise FrameError(f"{path}: not decodable ({reason})") from None
    if image is None:
        raise FrameError(f"{path}: not a decodable image")
    if size is not None:
        image = resize_frame(image, size, interpolation)
    return image


def resize_frame(image: np.ndarray, size: int, interpolation: str = "bicubic") -> np.ndarray:
    """RGB uint8 (H, W, 3) → (size, size, 3) exactly as open_clip's eval preprocess does it.

    Shortest side to `size` with PIL's antialiased filter, then the centre square (capsule frames
    are square: a single resize). A frame already at `size` is returned unchanged.
    """
    if interpolation not in INTERPOLATION:
        raise ParamsError(f"interpolation {interpolation!r}: must be one of {list(INTERPOLATION)}")
    height, width = image.shape[:2]
    if (height, width) == (size, size):
        return image
    from PIL import Image

    long = int(size * max(height, width) / min(height, width))  # torchvision's Resize(int) rule
    new_w, new_h = (size, long) if width <= height else (long, size)
    resample = Image.Resampling.BICUBIC if interpolation == "bicubic" else Image.Resampling.BILINEAR
    resized = np.array(Image.fromarray(np.ascontiguousarray(image)).resize((new_w, new_h), resample))  # writable
    top, left = int(round((new_h - size) / 2)), int(round((new_w - size) / 2))  # CenterCrop's rule
    return np.ascontiguousarray(resized[top:top + size, left:left + size])
