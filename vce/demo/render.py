"""Procedural pixels for the demo videos: learnable, temporally coherent, never trivially so.

Each video gets its own texture per region (colour and pattern differ by region, as mucosa does:
striped esophagus, folded stomach, velvety small intestine, ringed colon). The camera drifts
slowly over the texture, so consecutive frames overlap. Every run of a finding keeps one mark
(position, size, shape) for its whole length, drawn with a per-frame strength and under
per-frame noise: a single frame can be ambiguous, its neighbours agree.
"""

from __future__ import annotations

import numpy as np

from vce.core.labels import LABEL_INDEX, REGIONS

REGION_COLOUR = {  # RGB base colour of the mucosa
    "mouth": (190, 150, 150), "esophagus": (215, 150, 140), "stomach": (225, 115, 85),
    "small intestine": (215, 165, 75), "colon": (190, 175, 135),
}
MARK_COLOUR = {  # RGB colour of each finding's mark
    "blood": (140, 15, 15), "active bleeding": (235, 25, 20), "hematin": (60, 30, 20),
    "angiectasia": (250, 40, 80), "erosion": (245, 240, 225), "erythema": (215, 60, 55),
    "lymphangioectasis": (250, 250, 235), "ulcer": (240, 230, 175), "polyp": (0, 0, 0),
    "z-line": (235, 205, 195), "pylorus": (25, 10, 10), "ileocecal valve": (235, 200, 110),
}
RIM_COLOUR = (190, 45, 40)  # red halo of erosions and ulcers


def _smooth_noise(rng, size: int, period: float) -> np.ndarray:
    """Noise field (size, size) in about [-1, 1] with features about `period` pixels wide."""
    coarse = rng.normal(size=(max(2, int(size / period)) + 2,) * 2)
    coords = np.linspace(0, coarse.shape[0] - 2, size)
    i = np.floor(coords).astype(int)
    t = coords - i
    rows = coarse[i] * (1 - t)[:, None] + coarse[i + 1] * t[:, None]
    field = rows[:, i] * (1 - t) + rows[:, i + 1] * t
    return field / (np.abs(field).max() + 1e-6)


def region_texture(region: str, size: int, rng) -> np.ndarray:
    """A (2·size, 2·size, 3) float32 texture tile of one region."""
    n = 2 * size
    y, x = np.mgrid[0:n, 0:n].astype(np.float32)
    low = _smooth_noise(rng, n, size / 4)
    if region == "mouth":
        pattern = 1 + 0.3 * low
    elif region == "esophagus":
        pattern = 1 + 0.18 * np.sin(2 * np.pi * x / (size / 4) + 2 * low)
    elif region == "stomach":
        pattern = 1 + 0.22 * np.sin(2 * np.pi * (x + y) / (size / 3) + 3 * low)
    elif region == "small intestine":
        pattern = 1 + 0.1 * low + 0.2 * _smooth_noise(rng, n, 2.5)
    else:  # colon: haustral rings
        radius = np.hypot(x - size, y - size)
        pattern = 1 + 0.22 * np.sin(2 * np.pi * radius / (size / 3.5) + low)
    colour = np.asarray(REGION_COLOUR[region], np.float32)
    return (pattern[:, :, None] * colour).astype(np.float32)


def _runs(column: np.ndarray) -> list[tuple[int, int]]:
    """(start, end exclusive) of each run of ones in a 0/1 vector."""
    edges = np.diff(np.r_[0, column.astype(np.int8), 0])
    return list(zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)))


class VideoRenderer:
    """Renders frame i of a video whose per-frame labels are `labels` (N, 17)."""

    def __init__(self, labels: np.ndarray, size: int, noise: float, strength: float, rng):
        self.labels, self.size, self.noise, self.strength, self.rng = (
            labels, size, noise, strength, rng)
        self.textures = [region_texture(r, size, rng) for r in REGIONS]
        self.y, self.x = np.mgrid[0:size, 0:size].astype(np.float32)
        centre = np.hypot(self.x - size / 2, self.y - size / 2) / (size / 2)
        self.vignette = np.clip(1.15 - 0.75 * centre**2, 0.12, 1)[:, :, None]
        # Camera path: a slow random walk reflected into [0, size] (consecutive frames overlap).
        walk = np.cumsum(rng.normal(0, 0.06 * size, size=(len(labels), 2)), axis=0)
        self.offset = (size - np.abs(np.mod(walk, 2 * size) - size)).astype(int)
        # One mark per run of each finding or landmark: (label, start, end, params).
        self.marks = []
        for label in MARK_COLOUR:
            for start, end in _runs(labels[:, LABEL_INDEX[label]]):
                self.marks.append((label, start, end, self._mark_params(label)))

    def _mark_params(self, label: str) -> dict:
        s, rng = self.size, self.rng
        n_spots = {"blood": 3, "hematin": 5, "lymphangioectasis": 9, "angiectasia": 2}.get(label, 1)
        return {
            "centre": rng.uniform(0.3 * s, 0.7 * s, 2),
            "spots": rng.normal(0, 0.12 * s, (n_spots, 2)),
            "scale": rng.uniform(0.8, 1.25),
            "angle": rng.uniform(0, np.pi),
        }

    def _disc(self, cx, cy, radius, soft=1.0) -> np.ndarray:
        distance = np.hypot(self.x - cx, self.y - cy)
        return np.clip((radius - distance) / soft + 0.5, 0, 1)

    def _paint(self, image, mask, colour, alpha) -> None:
        weight = (alpha * mask)[:, :, None]
        image *= 1 - weight
        image += weight * np.asarray(colour, np.float32)

    def _draw(self, image, label, p, drift, alpha) -> None:
        s = self.size
        cx, cy = p["centre"] - drift
        cx, cy = np.clip(cx, 0.15 * s, 0.85 * s), np.clip(cy, 0.15 * s, 0.85 * s)
        r = p["scale"] * s
        colour = MARK_COLOUR[label]
        if label in ("blood", "hematin", "lymphangioectasis", "angiectasia"):
            radius = {"blood": 0.1, "hematin": 0.05, "lymphangioectasis": 0.025,
                      "angiectasia": 0.05}[label] * r
            mask = np.zeros((s, s), np.float32)
            for dx, dy in p["spots"]:
                mask = np.maximum(mask, self._disc(cx + dx, cy + dy, radius))
            self._paint(image, mask, colour, alpha)
        elif label == "active bleeding":
            streak = np.exp(-((self.x - cx) / (0.08 * r)) ** 2) * (self.y > cy)
            self._paint(image, np.maximum(self._disc(cx, cy, 0.18 * r, 2), streak), colour, alpha)
        elif label in ("erosion", "ulcer"):
            radius = (0.045 if label == "erosion" else 0.11) * r
            self._paint(image, self._disc(cx, cy, 2 * radius, 2), RIM_COLOUR, 0.7 * alpha)
            self._paint(image, self._disc(cx, cy, radius), colour, alpha)
        elif label == "erythema":
            self._paint(image, self._disc(cx, cy, 0.3 * r, 0.15 * s), colour, 0.7 * alpha)
        elif label == "polyp":
            radius = 0.13 * r
            distance = np.hypot(self.x - cx, self.y - cy) / radius
            body = self._disc(cx, cy, radius)
            shade = 1 + 0.5 * np.clip(1 - distance, 0, 1) - 0.45 * ((distance > 0.8) & (distance < 1.1))
            image *= (1 + alpha * body * (shade - 1))[:, :, None]
        elif label == "z-line":
            edge = cy + 0.08 * s * np.sin(2 * np.pi * self.x / (0.3 * s) + p["angle"])
            self._paint(image, np.clip((edge - self.y) / 1.5, 0, 1), colour, alpha)
        elif label == "pylorus":
            self._paint(image, self._disc(cx, cy, 0.14 * r, 2.5), colour, alpha)
        elif label == "ileocecal valve":
            lip = np.clip(1 - (((self.x - cx) / (0.25 * r)) ** 2 + ((self.y - cy) / (0.1 * r)) ** 2), 0, 1)
            self._paint(image, np.sqrt(lip), colour, alpha)
            self._paint(image, np.exp(-((self.y - cy) / 1.2) ** 2) * (lip > 0), (60, 20, 15), alpha)

    def frame(self, i: int) -> np.ndarray:
        """Frame i as (size, size, 3) uint8 RGB."""
        s, rng = self.size, self.rng
        region = int(np.argmax(self.labels[i, : len(REGIONS)]))
        ox, oy = self.offset[i]
        image = self.textures[region][oy:oy + s, ox:ox + s].copy()
        for label, start, end, params in self.marks:
            if start <= i < end:
                drift = (self.offset[i] - self.offset[start]) * 0.5
                self._draw(image, label, params, drift, self.strength * rng.uniform(0.3, 1.0))
        image *= self.vignette * rng.normal(1, 0.06)
        image += rng.normal(0, self.noise, image.shape).astype(np.float32)
        image += rng.normal(0, 4, 3).astype(np.float32)  # per-frame colour cast
        return np.clip(image, 0, 255).astype(np.uint8)
