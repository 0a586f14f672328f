"""Listing frame folders cheaply, and the index report that records what was skipped and why.

Shared by the Galar and the RARE-VISION test layouts (`vce.index`). Listing uses `os.scandir`
plus, per frame file, open + fstat (its size) and, when the PNG end check is on, a 12-byte read
of its end: about 6-12 µs per file with a warm page cache, 40 µs from a cold disk.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

from vce.core.errors import DataError

# A complete PNG ends with the IEND chunk: length 0, type "IEND", its CRC (PNG spec, 11.2.5).
PNG_END = b"\x00\x00\x00\x00IEND\xaeB`\x82"

IO_THREADS = 16  # concurrent file checks per folder (speed only; results do not depend on it)

# What each warning kind means (the index report's keys); every other problem is an error.
WARNING_KINDS = {
    "frame_missing_on_disk": "listed in a label CSV, no file on disk: row dropped",
    "frame_without_label": "file on disk, no row in the video's label CSV: frame dropped",
    "empty_frame_file": "zero-byte frame file: frame dropped",
    "truncated_frame_file": "PNG without its IEND end chunk (truncated copy): frame dropped",
    "video_without_labels": "video folder with no label CSV: video skipped",
    "labels_without_video": "label CSV with no video folder: skipped",
    "empty_video_folder": "video folder with no frame files: video skipped",
    "empty_label_cells": "empty cells in scored label columns, read as 0",
    "index_not_increasing": "the CSV's index does not increase with frame",
    "ignored_file": "file in a video folder that is not a frame",
    "metadata": "metadata.csv missing or without a capsule column: capsule left empty",
    "test_video_without_list": "test video with no frame-list CSV",
    "test_frame_not_listed": "test frame on disk, not in the frame list: kept",
    "test_frame_missing_on_disk": "test frame in the frame list, no file on disk",
    "test_frames_not_contiguous": "gaps in a test video's frame numbers",
}


class IndexReport:
    """Counts of warnings by kind, with at most `max_examples` messages each."""

    def __init__(self, max_examples: int):
        self.max_examples = max_examples
        self.counts: Counter = Counter()
        self.examples: dict[str, list[str]] = {}
        self.layouts: dict[str, dict] = {}

    def warn(self, kind: str, messages: list[str], count: int | None = None) -> None:
        assert kind in WARNING_KINDS, kind
        if not messages:
            return
        self.counts[kind] += len(messages) if count is None else count
        kept = self.examples.setdefault(kind, [])
        kept.extend(messages[: self.max_examples - len(kept)])

    def as_dict(self) -> dict:
        warnings = {kind: {"count": self.counts[kind], "meaning": WARNING_KINDS[kind],
                           "examples": self.examples[kind]} for kind in sorted(self.counts)}
        return {**self.layouts, "n_warnings": sum(self.counts.values()), "warnings": warnings}

    def summary_lines(self) -> list[str]:
        return [f"warning: {self.counts[k]} × {WARNING_KINDS[k]} (e.g. {self.examples[k][0]})"
                for k in sorted(self.counts)]


def find_folders(root: Path, name: re.Pattern, max_depth: int, skip: set[Path]) -> list[Path]:
    """Folders under `root` (depth ≤ max_depth) whose name matches; matches are not entered.

    Archive folders (e.g. `Galar_Frames_1_to_10/`) are walked through; hidden folders and
    `skip` are not.
    """
    found, todo = [], [(root, 0)]
    while todo:
        folder, depth = todo.pop()
        with os.scandir(folder) as entries:
            for entry in entries:
                if not entry.is_dir() or entry.name.startswith("."):
                    continue
                path = Path(entry.path)
                if name.match(entry.name):
                    found.append(path)
                elif depth + 1 < max_depth and path.resolve() not in skip:
                    todo.append((path, depth + 1))
    return sorted(found)


def _size_and_end(path: str, check_end: bool) -> tuple[int, bool]:
    if not check_end:
        return os.stat(path).st_size, True
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        ends_well = os.pread(fd, 12, max(0, size - 12)) == PNG_END
    finally:
        os.close(fd)
    return size, ends_well


def _check_files(paths: list[str], check_end: bool) -> list[tuple[int, bool]]:
    """(size, ends_well) of each file, read by IO_THREADS threads: on a cold disk the reads
    wait on storage, and overlapping them halves the time (measured 77 → 41 µs per file)."""
    if len(paths) < 4 * IO_THREADS:
        return [_size_and_end(p, check_end) for p in paths]
    chunks = [paths[i::IO_THREADS] for i in range(IO_THREADS)]
    with ThreadPoolExecutor(IO_THREADS) as pool:
        results = list(pool.map(lambda part: [_size_and_end(p, check_end) for p in part], chunks))
    checked = [None] * len(paths)
    for i, part in enumerate(results):
        checked[i::IO_THREADS] = part
    return checked


def list_frames(folder: Path, name: re.Pattern, check_end: bool) -> tuple[pd.DataFrame, list[str]]:
    """Frame files of one folder: (table of name, frame, size, ends_well sorted by frame, others).

    `name` has one group, the frame number. Raises ValueError on two files with one number
    (e.g. `frame_000005.PNG` and `frame_000005.png`): which one is the frame is unknowable.
    """
    names, numbers, others = [], [], []
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.is_file():
                match = name.match(entry.name)
                if match:
                    names.append(entry.name)
                    numbers.append(int(match.group(1)))
                else:
                    others.append(entry.name)
    prefix = os.path.join(folder, "")
    checked = _check_files([prefix + n for n in names], check_end)
    files = pd.DataFrame({
        "name": pd.Series(names, dtype="str"),
        "frame": np.array(numbers, dtype=np.int64),
        "size": np.array([c[0] for c in checked], dtype=np.int64),
        "ends_well": np.array([c[1] for c in checked], dtype=bool),
    })
    files = files.sort_values(["frame", "name"], ignore_index=True)
    twice = files["frame"].duplicated(keep=False)
    if twice.any():
        number = int(files.loc[twice, "frame"].iloc[0])
        same = files.loc[files["frame"] == number, "name"].tolist()
        raise DataError(f"{folder}: duplicate frame number {number}: {', '.join(same)}")
    return files, sorted(others)


def drop_bad_files(files: pd.DataFrame, folder: Path, report: IndexReport) -> pd.DataFrame:
    """Drop zero-byte and truncated frame files, recording each in the report."""
    empty = files["size"] == 0
    truncated = ~empty & ~files["ends_well"]
    report.warn("empty_frame_file",
                [f"{folder / n}: empty file (0 bytes)" for n in files.loc[empty, "name"]])
    report.warn("truncated_frame_file",
                [f"{folder / n}: truncated PNG (no IEND chunk at the end)"
                 for n in files.loc[truncated, "name"]])
    return files[~empty & ~truncated].reset_index(drop=True)
