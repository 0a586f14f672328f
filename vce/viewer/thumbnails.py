"""Thumbnails for the exam viewer: which frames an event shows, the caps, the small image files.

A Galar-scale report holds ~80 videos of up to 100,000 frames and, from the score engine, up
to `top_k` candidate events per (video, label): a thumbnail of every event frame would be
gigabytes. So each list the viewer shows asks for the frames of its first events only (per
(video, label) and kind: `events_per_label`; per label on the error pages:
`errors_per_label`), and `plan_thumbnails` grants whole requests in priority order until
`max_thumbnails` distinct frames are taken: the error pages' entries, then every list's first
event, then their second, ... (an event's frames come all or none, and frames shared by
overlapping events are stored once). `bench/viewer.py` measures what that costs at 3.5 M frames.

Thumbnails are made from the frame files (pyspng for PNGs, PIL otherwise; the frame cache holds
model-sized pixels, and the viewer wants the frames as a reader sees them): downscaled to `thumbnail_px` on the long
side, never upscaled, written as JPEG or WebP. A frame that cannot be read gets no file; the
viewer says so where the thumbnail would be.
"""

from __future__ import annotations

import io
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vce.core.io import safe_file_name

SUFFIX = {"jpeg": ".jpg", "webp": ".webp"}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def event_frames(times: np.ndarray, start: int, end: int, n: int) -> list[int]:
    """Up to `n` event times of a video's frames inside [start, end]: the first, the last and
    evenly spaced between (the middle one when `n` is odd; just the middle when `n` is 1).

    `times`: the video's frame times, sorted. Frames missing inside the span are skipped, so
    every time returned has a frame.
    """
    lo, hi = int(np.searchsorted(times, start, "left")), int(np.searchsorted(times, end, "right"))
    if hi <= lo:
        return []
    if n == 1:
        return [int(times[(lo + hi - 1) // 2])]
    positions = np.unique(np.round(np.linspace(lo, hi - 1, n)).astype(np.int64))
    return [int(t) for t in times[positions]]


@dataclass(frozen=True)
class Request:
    """The frames one viewer entry wants; lower `priority` tuples are granted first."""

    priority: tuple
    video_id: str
    key: tuple  # what the entry is, e.g. ("pred", event index, label)
    times: tuple[int, ...]


def plan_thumbnails(requests: list[Request], max_thumbnails: int) -> tuple[set, set]:
    """(granted request keys as (video_id, key), the (video_id, t) frames to write).

    Requests are granted whole, in (priority, video, key) order, while the distinct frames
    stay within `max_thumbnails`; a request whose frames are all taken already costs nothing.
    """
    granted, frames = set(), set()
    for request in sorted(requests, key=lambda r: (r.priority, r.video_id, r.key)):
        new = {(request.video_id, t) for t in request.times} - frames
        if len(frames) + len(new) <= max_thumbnails:
            frames |= new
            granted.add((request.video_id, request.key))
    return granted, frames


def thumbnail_name(video_id: str, t: int, image_format: str) -> str:
    """The thumbnail's path relative to the viewer folder."""
    return f"thumbs/{safe_file_name(str(video_id))}/{int(t)}{SUFFIX[image_format]}"


def _read_rgb(source: Path, size: int):
    """The frame as an RGB PIL image: PNGs through pyspng (a quarter faster than PIL here,
    bench/viewer.py), other formats through PIL (JPEGs decoded at a reduced scale); None if unreadable."""
    import pyspng
    from PIL import Image

    try:
        data = source.read_bytes()
        if data[:8] == PNG_SIGNATURE:
            pixels = pyspng.load(data)  # (H, W[, C]) uint8 or uint16
            if pixels.dtype == np.uint16:
                pixels = (pixels >> 8).astype(np.uint8)
            if pixels.ndim == 3 and pixels.shape[2] in (2, 4):
                pixels = pixels[:, :, :-1]  # drop alpha
            return Image.fromarray(np.ascontiguousarray(pixels.squeeze() if pixels.ndim == 3 and pixels.shape[2] == 1
                                                        else pixels)).convert("RGB")
        with Image.open(io.BytesIO(data)) as image:
            image.draft("RGB", (size, size))
            return image.convert("RGB")
    except (OSError, ValueError, RuntimeError, Image.DecompressionBombError):
        return None


def _write_one(source: Path, target: Path, size: int, image_format: str, quality: int) -> int:
    """Write one thumbnail; its bytes, or 0 when the frame cannot be read."""
    from PIL import Image

    rgb = _read_rgb(source, size)
    if rgb is None:
        return 0
    rgb.thumbnail((size, size), Image.Resampling.LANCZOS, reducing_gap=3.0)  # never upscales
    if image_format == "jpeg":  # plainly: the viewer folder is the atomic unit (`vce.core.io.atomic_dir`)
        rgb.save(target, format="JPEG", quality=quality, optimize=True)
    else:
        rgb.save(target, format="WEBP", quality=quality, method=4)
    return target.stat().st_size


def write_thumbnails(frame_paths: dict, out_dir, size: int, image_format: str, quality: int) -> dict:
    """Write a thumbnail of every (video_id, t) -> frame file of `frame_paths` under `out_dir`.

    Returns (video_id, t) -> (name relative to `out_dir`, bytes), without the frames that could
    not be read. Decoding runs on a few threads (PIL releases the GIL); the files do not depend
    on how many.
    """
    out_dir = Path(out_dir)
    keys = sorted(frame_paths)
    names = [thumbnail_name(video_id, t, image_format) for video_id, t in keys]
    for folder in sorted({(out_dir / name).parent for name in names}):
        folder.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        sizes = list(pool.map(lambda item: _write_one(Path(frame_paths[item[0]]), out_dir / item[1], size,
                                                      image_format, quality), zip(keys, names)))
    return {key: (name, n_bytes) for key, name, n_bytes in zip(keys, names, sizes) if n_bytes}
