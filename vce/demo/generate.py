"""The embedded demo dataset: small videos in the real Galar and RARE-VISION test layouts.

Everything is generated from `DemoParams.seed` alone (no file outside the repository is read),
so a fresh clone reproduces the same bytes. Label timelines follow the real Galar statistics
(constants below, derived from the official event ground truth of the 80 Galar videos); pixels
are procedural (`vce.demo_render`): regions differ in colour and texture, findings leave marks,
and per-frame noise makes single frames ambiguous while consecutive frames agree.

Layout written under `out`:
    galar/Galar_Frames_1_to_10/<id>/frame_XXXXXX.PNG     labelled videos (6 digits, upper case)
    galar/Labels/<id>.csv                                 index, 29 label columns, frame
    galar/metadata.csv                                    video_id, capsule
    test/ukdd_navi_000NN/frame_XXXXXXX.png                unlabelled videos (7 digits, lower case)
    test/ukdd_navi_000NN_000MM/ukdd_navi_000NN.csv        ';'-separated frame lists, empty labels
    test_ground_truth.json                                hidden test truth, official format
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import cv2
import numpy as np
import pandas as pd
from pydantic import Field, model_validator

from vce.core.labels import (
    LABEL_INDEX,
    LABELS,
    LANDMARKS,
    NUM_LABELS,
    PATHOLOGY,
    REGIONS,
)
from vce.core.params import Section, Seed

# Real Galar statistics (fixtures/galar_label_stats.csv: run-length median and 90th percentile
# in annotated frames; share of the 80 videos in which the label occurs at all).
RUN_LENGTH = {  # label: (median, p90)
    "z-line": (2, 6), "pylorus": (7, 36), "ileocecal valve": (6, 31),
    "active bleeding": (4.5, 38), "angiectasia": (4, 21), "blood": (8, 76),
    "erosion": (5, 25), "erythema": (5, 31), "hematin": (6, 81),
    "lymphangioectasis": (4, 21), "polyp": (5, 25), "ulcer": (4, 34),
}
VIDEO_PRESENCE = {
    "z-line": 26 / 80, "pylorus": 58 / 80, "ileocecal valve": 53 / 80,
    "active bleeding": 13 / 80, "angiectasia": 41 / 80, "blood": 51 / 80, "erosion": 45 / 80,
    "erythema": 30 / 80, "hematin": 22 / 80, "lymphangioectasis": 39 / 80, "polyp": 33 / 80,
    "ulcer": 16 / 80,
}
# Unscored Galar columns (the label CSVs carry ~29 columns; only the 17 are scored).
EXTRA_COLUMNS = (
    "ampulla of vater", "bubbles", "dirt", "reduced view", "no view", "foreign body",
    "stenosis", "lymphoid hyperplasia", "villous oedema", "xanthoma", "diverticulum", "unknown",
)
CAPSULES = ("PillCam SB3", "Olympus", "PillCam COLON2", "PillCam SB2")
CAPSULE_SHARE = (51 / 80, 22 / 80, 5 / 80, 2 / 80)
# The RARE-VISION test videos' ids and first frame numbers (REFERENCE.md); more are invented.
TEST_VIDEOS = (("ukdd_navi_00051", 49), ("ukdd_navi_00068", 81), ("ukdd_navi_00076", 371))
Z90 = 1.2815515655446004  # standard normal 90th percentile: sigma = ln(p90 / median) / Z90


class DemoParams(Section):
    """`demo`: the generated dataset (see params.yaml for each knob)."""

    seed: Seed
    n_videos: int = Field(ge=1, le=80)
    frames_per_video: int = Field(ge=100)
    n_test_videos: int = Field(ge=0, le=9)
    test_frames_per_video: int = Field(ge=100)
    image_size: int = Field(ge=16, le=512)
    frame_step: int = Field(ge=1)
    region_fractions: list[Annotated[float, Field(gt=0)]]
    region_jitter: float = Field(ge=0)
    presence_floor: float = Field(ge=0, le=1)
    events_per_label: float = Field(ge=1)
    min_event_frames: int = Field(ge=1)
    max_event_frames: int = Field(ge=1)
    noise: float = Field(ge=0)
    mark_strength: float = Field(gt=0, le=1)

    @model_validator(mode="after")
    def _regions_and_lengths(self):
        self.require(len(self.region_fractions) == len(REGIONS), "region_fractions",
                     f"must be {len(REGIONS)} positive numbers (shares of {', '.join(REGIONS)})")
        self.require(self.min_event_frames <= self.max_event_frames, "min_event_frames",
                     f"must be <= max_event_frames ({self.max_event_frames})")
        return self


# ---------------------------------------------------------------- label timelines

def region_bounds(n_frames: int, cfg: DemoParams, rng: np.random.Generator) -> np.ndarray:
    """Start index of each region plus the end: (6,) ints, mouth first, colon last."""
    shares = np.asarray(cfg.region_fractions) * np.exp(rng.normal(0, cfg.region_jitter, 5))
    lengths = np.maximum(np.round(shares / shares.sum() * n_frames).astype(int), 5)
    lengths[3] += n_frames - lengths.sum()  # the small intestine absorbs rounding
    return np.concatenate([[0], np.cumsum(lengths)])


def run_length(label: str, cfg: DemoParams, rng: np.random.Generator) -> int:
    """A run length drawn log-normally with the real median and 90th percentile."""
    median, p90 = RUN_LENGTH[label]
    length = median * np.exp(rng.normal(0, np.log(p90 / median) / Z90))
    return int(np.clip(round(length), cfg.min_event_frames, cfg.max_event_frames))


def timeline(n_frames: int, cfg: DemoParams, rng: np.random.Generator) -> np.ndarray:
    """Per-frame 0/1 labels (n_frames, 17) uint8 of one video, following the real statistics.

    1. Regions in anatomical order, proportions from `region_fractions` with jitter.
    2. Landmarks centred on the boundary they mark, present as often as in Galar.
    3. Each pathology present in a video with its Galar probability (at least
       `presence_floor`), 1 + Poisson(events_per_label - 1) short runs each, after the esophagus.
    """
    labels = np.zeros((n_frames, NUM_LABELS), np.uint8)
    bounds = region_bounds(n_frames, cfg, rng)
    for i, region in enumerate(REGIONS):
        labels[bounds[i]:bounds[i + 1], LABEL_INDEX[region]] = 1
    for landmark, (_, after) in LANDMARKS.items():
        if rng.random() < max(VIDEO_PRESENCE[landmark], cfg.presence_floor):
            boundary = bounds[REGIONS.index(after)]
            length = run_length(landmark, cfg, rng)
            start = max(0, boundary - length // 2)
            labels[start:start + length, LABEL_INDEX[landmark]] = 1
    first = bounds[REGIONS.index("stomach")]
    for finding in PATHOLOGY:
        if rng.random() >= max(VIDEO_PRESENCE[finding], cfg.presence_floor):
            continue
        for _ in range(1 + rng.poisson(cfg.events_per_label - 1)):
            length = run_length(finding, cfg, rng)
            start = int(rng.integers(first, max(first + 1, n_frames - length)))
            labels[start:start + length, LABEL_INDEX[finding]] = 1
    return labels


def extra_columns(n_frames: int, rng: np.random.Generator) -> np.ndarray:
    """Unscored Galar-like columns (n_frames, len(EXTRA_COLUMNS)): a few random runs each."""
    extras = np.zeros((n_frames, len(EXTRA_COLUMNS)), np.uint8)
    for j in range(len(EXTRA_COLUMNS)):
        for _ in range(rng.poisson(1.0)):
            start = int(rng.integers(0, n_frames - 20))
            extras[start:start + int(rng.integers(1, 20)), j] = 1
    return extras


def events_of(labels: np.ndarray, positions: np.ndarray) -> list[dict]:
    """Official ground-truth events: a new event whenever the set of active labels changes.

    `labels` (N, 17) 0/1, `positions` (N,) the unit events are written in (end inclusive).
    """
    events = []
    change = np.any(labels[1:] != labels[:-1], axis=1).nonzero()[0] + 1
    for start, end in zip(np.r_[0, change], np.r_[change, len(labels)]):
        active = [LABELS[j] for j in labels[start].nonzero()[0]]
        if active:
            events.append({"start": int(positions[start]), "end": int(positions[end - 1]),
                           "label": active})
    return events


# ---------------------------------------------------------------- writing

def _write_png(path: Path, rgb: np.ndarray) -> None:
    ok, data = cv2.imencode(".png", rgb[:, :, ::-1], [cv2.IMWRITE_PNG_COMPRESSION, 3])
    if not ok:
        raise RuntimeError(f"could not encode {path}")
    path.write_bytes(data.tobytes())


def _render_video(folder: Path, names: list[str], labels: np.ndarray, cfg: DemoParams,
                  rng: np.random.Generator) -> None:
    from vce.demo.render import VideoRenderer

    folder.mkdir(parents=True, exist_ok=True)
    renderer = VideoRenderer(labels, cfg.image_size, cfg.noise, cfg.mark_strength, rng)
    for i, name in enumerate(names):
        _write_png(folder / name, renderer.frame(i))


def write_galar_video(root: Path, video_id: int, cfg: DemoParams,
                      rng: np.random.Generator) -> None:
    """One labelled video: frames in its archive folder, Labels/<id>.csv."""
    labels = timeline(cfg.frames_per_video, cfg, rng)
    first = int(rng.integers(0, cfg.frame_step))
    frames = first + cfg.frame_step * np.arange(cfg.frames_per_video)
    low = (video_id - 1) // 10 * 10 + 1
    folder = root / f"Galar_Frames_{low}_to_{low + 9}" / str(video_id)
    _render_video(folder, [f"frame_{f:06d}.PNG" for f in frames], labels, cfg, rng)
    write_label_csv(root, video_id, labels, frames, rng)


def write_label_csv(root: Path, video_id: int | str, labels: np.ndarray, frames: np.ndarray,
                    rng: np.random.Generator) -> None:
    """Labels/<id>.csv of one Galar video: index, the 17 labels, unscored extras, frame."""
    table = pd.DataFrame(labels, columns=list(LABELS))
    table = pd.concat([table, pd.DataFrame(extra_columns(len(frames), rng),
                                           columns=list(EXTRA_COLUMNS))], axis=1)
    table.insert(0, "index", np.arange(len(frames)))
    table["frame"] = frames
    (root / "Labels").mkdir(parents=True, exist_ok=True)
    table.to_csv(root / "Labels" / f"{video_id}.csv", index=False)


def test_video_ids(n: int) -> list[tuple[str, int]]:
    """(video_id, first frame number) of the demo test videos: the real ids first."""
    invented = [(f"ukdd_navi_{90 + i:05d}", 17 + 31 * i) for i in range(n)]
    return (list(TEST_VIDEOS) + invented)[:n]


def frame_list_folder(root: Path, video_ids: list[str]) -> Path:
    """Where the test layout keeps its frame lists: a folder named after all its videos.

    With one video that name is the video's own folder, where the list then sits beside the frames.
    """
    return root / "_".join([video_ids[0]] + [v[len("ukdd_navi_"):] for v in video_ids[1:]])


def write_frame_list(list_folder: Path, video_id: str, names: list[str]) -> None:
    """The ';'-separated frame list of one test video, label columns empty (as released)."""
    frame_list = pd.DataFrame({"frame_file": names})
    for label in LABELS:
        frame_list[label] = ""
    list_folder.mkdir(parents=True, exist_ok=True)
    frame_list.to_csv(list_folder / f"{video_id}.csv", sep=";", index=False)


def write_test_videos(root: Path, cfg: DemoParams, rng: np.random.Generator) -> dict:
    """Unlabelled videos in the RARE-VISION layout; returns their ground truth (frame units)."""
    videos = test_video_ids(cfg.n_test_videos)
    list_folder = frame_list_folder(root, [video_id for video_id, _ in videos])
    truth = []
    for video_id, first in videos:
        labels = timeline(cfg.test_frames_per_video, cfg, rng)
        frames = first + np.arange(cfg.test_frames_per_video)
        names = [f"frame_{f:07d}.png" for f in frames]
        _render_video(root / video_id, names, labels, cfg, rng)
        write_frame_list(list_folder, video_id, names)
        truth.append({"video_id": video_id, "events": events_of(labels, frames)})
    return {"videos": truth}


def generate(out: str | Path, cfg: DemoParams) -> dict:
    """Write the whole demo under `out` (expected empty or absent); returns a summary."""
    out = Path(out)
    seeds = np.random.SeedSequence(cfg.seed).spawn(cfg.n_videos + 2)
    galar = out / "galar"
    for video_id in range(1, cfg.n_videos + 1):
        write_galar_video(galar, video_id, cfg, np.random.default_rng(seeds[video_id - 1]))
    capsule_rng = np.random.default_rng(seeds[cfg.n_videos])
    capsules = capsule_rng.choice(len(CAPSULES), size=cfg.n_videos, p=CAPSULE_SHARE)
    pd.DataFrame({"video_id": np.arange(1, cfg.n_videos + 1),
                  "capsule": [CAPSULES[c] for c in capsules]}).to_csv(
        galar / "metadata.csv", index=False)
    truth = {"videos": []}
    if cfg.n_test_videos:
        truth = write_test_videos(out / "test", cfg, np.random.default_rng(seeds[-1]))
    else:
        (out / "test").mkdir(parents=True, exist_ok=True)
    (out / "test_ground_truth.json").write_text(json.dumps(truth, indent=1) + "\n")
    return {"videos": cfg.n_videos, "frames": cfg.n_videos * cfg.frames_per_video,
            "test_videos": cfg.n_test_videos,
            "test_frames": cfg.n_test_videos * cfg.test_frames_per_video}
