"""Scale benchmark of the `index` stage: a Galar-layout tree of 500,000 tiny frames, 80 CSVs.

    python -m bench.index [--frames 500000] [--videos 80] [--tree /tmp/vce_bench_galar]

Builds the tree once (reused while its size matches), then runs the real stage entry point in a
child process three times: PNG end check on with the frames' data evicted from the page cache
(cold reads, as on a first run over a fresh copy; inodes stay cached), end check on with a warm
cache, end check off. Prints one JSON object: wall seconds and peak resident memory (ru_maxrss
of the child) per run. The tree lies outside the repository.
Targets (issue 3): <= 60 s and <= 1 GB on a 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np
import pandas as pd

from vce.core.labels import LABELS
from vce.demo.generate import EXTRA_COLUMNS

REPO = Path(__file__).resolve().parents[1]

# A valid 1x1 PNG (about 70 bytes): the index never decodes it, but it ends with IEND.
TINY_PNG = cv2.imencode(".png", np.zeros((1, 1, 3), np.uint8))[1].tobytes()


def build_tree(tree: Path, n_frames: int, n_videos: int) -> None:
    """Galar layout: Galar_Frames_<a>_to_<b>/<id or recording_id>/frame_XXXXXX.PNG + Labels/."""
    rng = np.random.default_rng(0)
    per_video = n_frames // n_videos
    (tree / "Labels").mkdir(parents=True, exist_ok=True)
    for video in range(1, n_videos + 1):
        low = (video - 1) // 10 * 10 + 1
        name = f"recording_{video}" if video % 7 == 0 else str(video)
        folder = tree / f"Galar_Frames_{low}_to_{low + 9}" / name
        folder.mkdir(parents=True, exist_ok=True)
        frames = 5 * np.arange(per_video)
        for f in frames:
            fd = os.open(folder / f"frame_{f:06d}.PNG", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.write(fd, TINY_PNG)
            os.close(fd)
        columns = list(LABELS) + list(EXTRA_COLUMNS)
        table = pd.DataFrame((rng.random((per_video, len(columns))) < 0.02).astype(np.uint8),
                             columns=columns)
        table.insert(0, "index", np.arange(per_video))
        table["frame"] = frames
        table.to_csv(tree / "Labels" / f"{video}.csv", index=False)
    pd.DataFrame({"video_id": range(1, n_videos + 1), "capsule": "PillCam SB3"}).to_csv(
        tree / "metadata.csv", index=False)
    (tree / "BUILT").write_text(f"{n_frames} {n_videos}\n")


def evict_from_page_cache(tree: Path) -> None:
    """Drop the frames' cached pages (posix_fadvise, no root needed): the next read is cold."""
    for folder, _, names in os.walk(tree):
        for name in names:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)


def run_stage(tree: Path, check_end: bool, work: Path) -> dict:
    params = work / "params.yaml"
    params.write_text(
        f"data:\n  root: {tree}\n  labels_dir: Labels\n  metadata: metadata.csv\n"
        f"  test_root: null\n  check_png_end: {str(check_end).lower()}\n"
        f"  max_missing_fraction: 0.01\n  report_examples: 20\n")
    script = (
        "import resource, sys, time\n"
        "start = time.perf_counter()\n"
        "from stages.index import main\n"
        f"rc = main(['--params', {str(params)!r}, '--frames-out', {str(work / 'f.parquet')!r},"
        f" '--test-out', {str(work / 't.parquet')!r}, '--report', {str(work / 'r.json')!r}])\n"
        "print('SECONDS', time.perf_counter() - start)\n"
        "print('PEAK_KIB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
        "sys.exit(rc)\n")
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"stage failed: {done.stderr}")
    inner = float(done.stdout.split("SECONDS")[1].split()[0])
    peak_kib = int(done.stdout.split("PEAK_KIB")[1].split()[0])
    return {"check_png_end": check_end, "wall_s": round(wall, 2), "stage_s": round(inner, 2),
            "peak_rss_mb": round(peak_kib / 1024, 1),
            "rows": len(pd.read_parquet(work / "f.parquet", columns=["frame"]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=500_000)
    parser.add_argument("--videos", type=int, default=80)
    parser.add_argument("--tree", default=os.path.join(tempfile.gettempdir(), "vce_bench_galar"))
    args = parser.parse_args()
    tree = Path(args.tree)
    marker = tree / "BUILT"
    build_s = 0.0
    if not marker.is_file() or marker.read_text().split() != [str(args.frames), str(args.videos)]:
        start = time.perf_counter()
        build_tree(tree, args.frames, args.videos)
        build_s = time.perf_counter() - start
    runs = []
    with tempfile.TemporaryDirectory() as work:
        for check_end, cold in ((True, True), (True, False), (False, False)):
            if cold:
                evict_from_page_cache(tree)
            runs.append({"cold_file_data": cold, **run_stage(tree, check_end, Path(work))})
    print(json.dumps({"frames": args.frames, "videos": args.videos, "tree": str(tree),
                      "build_s": round(build_s, 1), "cpus": os.cpu_count(), "runs": runs}))


if __name__ == "__main__":
    main()
