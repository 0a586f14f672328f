"""A Galar-scale rehearsal: the real `dvc repro` on a Galar-shaped tree, every stage measured.

    python -m bench.galar_scale --tree /data/fake_galar --work /data/galar_run \
        [--videos 80] [--fraction 1.0] [--test-fraction 1.0] [--out bench/results/galar_scale.json]

1. **The tree** (`--tree`, on the disk you name): the 80 Galar videos with their real lengths and
   label timelines (`../shared/fixtures/galar_gt_events.json`, `galar_video_spans.csv`: index 0 to
   the last labelled index; unlabelled frames before the first), `Labels/<id>.csv`, `metadata.csv`,
   and 3 test videos in the RARE-VISION layout of 161,025 frames in all (their truth in
   `test_ground_truth.json`, from three Galar timelines). Frames are 32 px PNGs hard-linked to a
   small pool (one file per region and texture: ~0 bytes per frame beyond its directory entry;
   ext4 allows 65,000 links per file, so the pool grows past that). `--videos N` takes the first N
   videos, `--fraction F` keeps every (1/F)-th annotated frame of each (the timeline subsampled, the
   anatomy order kept), `--test-fraction` scales the test videos. Resumable: a video is written
   whole and then marked done (`.done/`); a rerun skips it.
2. **The run** (`--work`): a copy of this repository's tracked files (git init, one commit) with
   `params.yaml` pointed at the tree and the tiny model trained for `--train-samples` draws of
   one epoch (`train.samples_per_epoch`); every other stage at full size. Each stage runs as
   `dvc repro --single-item <stage>` in dvc.yaml order; the child's wall and CPU seconds, peak
   RSS (ru_maxrss over the child and its descendants: DVC and the stage), bytes it wrote to disk
   (ru_oublock), the rows of its Parquet outputs and the size of its outputs are recorded. A
   stopped run resumes: stages already measured (in `<work>/measured.json`) are skipped.
3. Then a second `dvc repro` with nothing changed, a post-only `dvc exp run --temp -S
   events.min_length=4` (what its temporary copy holds at its largest: files and bytes, polled),
   and `dvc status`. One JSON object to `--out` (and stdout); progress lines on stderr, each
   stage's own output in `<work>/logs/`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import cv2
import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from vce.core.labels import LABEL_INDEX, LABELS, REGIONS
from vce.core.recipe import apply
from vce.demo.generate import EXTRA_COLUMNS, TEST_VIDEOS, events_of, frame_list_folder, write_frame_list

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO.parent / "shared" / "fixtures"
TEST_FRAMES = 161_025  # the RARE-VISION test set's frames (3 videos)
TEST_TIMELINES = ("1", "3", "5")  # Galar videos whose timelines the test videos borrow
FRAME_STEP = 5  # file frame numbers step by 5 (Galar frames are a subsample); the index steps by 1
MAX_LINKS = 60_000  # below ext4's 65,000 hard links per file
PNG_PX = 32
TEXTURES = 8


# ----------------------------------------------------------------------------- the tree


def galar_timelines(n_videos: int) -> list[tuple[str, np.ndarray]]:
    """(video_id, (T, 17) uint8 labels over index 0..last) of the first `n_videos` Galar videos."""
    truth = json.loads((FIXTURES / "galar_gt_events.json").read_text())["videos"]
    spans = pd.read_csv(FIXTURES / "galar_video_spans.csv", dtype={"video_id": str}).set_index("video_id")
    out = []
    for video in sorted(truth, key=lambda v: int(v["video_id"]))[:n_videos]:
        labels = np.zeros((int(spans.loc[video["video_id"], "last_labelled_frame"]) + 1, len(LABELS)), np.uint8)
        for event in video["events"]:
            for name in event["label"]:
                labels[event["start"]:event["end"] + 1, LABEL_INDEX[name]] = 1
        out.append((video["video_id"], labels))
    return out


def subsample(labels: np.ndarray, fraction: float, length: int | None = None) -> np.ndarray:
    """`length` rows (default: fraction × T) picked evenly from `labels`: order and anatomy kept."""
    length = length or max(1, int(round(len(labels) * fraction)))
    return labels[np.minimum((np.arange(length) * (len(labels) / length)).astype(np.int64), len(labels) - 1)]


class PngPool:
    """32 px PNGs, one per (region, texture), each hard-linked into at most MAX_LINKS frame paths."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.sources: dict[tuple[int, int], tuple[Path, int]] = {}
        folder.mkdir(parents=True, exist_ok=True)

    def _new_source(self, region: int, texture: int) -> Path:
        rng = np.random.default_rng(region * TEXTURES + texture)
        colour = np.array([40 + 35 * region, 160 - 25 * region, 90 + 10 * texture], np.float32)
        pixels = np.clip(colour + rng.normal(0, 20, (PNG_PX, PNG_PX, 3)), 0, 255).astype(np.uint8)
        serial = len(list(self.folder.glob(f"r{region}_t{texture}_*.png")))
        path = self.folder / f"r{region}_t{texture}_{serial}.png"
        path.write_bytes(cv2.imencode(".png", pixels)[1].tobytes())
        return path

    def link(self, target: Path, region: int, texture: int) -> None:
        source, used = self.sources.get((region, texture), (None, MAX_LINKS))
        if used >= MAX_LINKS:
            source, used = self._new_source(region, texture), 0
        os.link(source, target)
        self.sources[(region, texture)] = (source, used + 1)


def region_of(labels: np.ndarray) -> np.ndarray:
    """(T,) 0..4 the frame's region, 5 where none is labelled (before the first labelled index)."""
    regions = labels[:, [LABEL_INDEX[r] for r in REGIONS]]
    return np.where(regions.any(axis=1), regions.argmax(axis=1), len(REGIONS))


def write_frames(folder: Path, names: list[str], labels: np.ndarray, pool: PngPool) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i, (name, region) in enumerate(zip(names, region_of(labels))):
        target = folder / name
        if target.exists():  # an interrupted video: its frames so far are kept
            continue
        pool.link(target, int(region), i % TEXTURES)


def build_tree(tree: Path, n_videos: int, fraction: float, test_fraction: float) -> dict:
    """Write (or finish) the tree; returns its counts."""
    galar, done = tree / "galar", tree / ".done"
    done.mkdir(parents=True, exist_ok=True)
    pool = PngPool(tree / "pool")
    timelines = galar_timelines(80)
    frames = 0
    for video_id, full in timelines[:n_videos]:
        labels = subsample(full, fraction)
        frames += len(labels)
        if (done / video_id).exists():
            continue
        numbers = FRAME_STEP * np.arange(len(labels))
        low = (int(video_id) - 1) // 10 * 10 + 1
        write_frames(galar / f"Galar_Frames_{low}_to_{low + 9}" / video_id,
                     [f"frame_{f:06d}.PNG" for f in numbers], labels, pool)
        table = pd.DataFrame(labels, columns=list(LABELS))
        table[list(EXTRA_COLUMNS)] = 0
        table.insert(0, "index", np.arange(len(labels)))
        table["frame"] = numbers
        (galar / "Labels").mkdir(parents=True, exist_ok=True)
        table.to_csv(galar / "Labels" / f"{video_id}.csv", index=False)
        (done / video_id).touch()
        print(f"tree: video {video_id}, {len(labels):,} frames", file=sys.stderr, flush=True)
    pd.DataFrame({"video_id": [v for v, _ in timelines[:n_videos]], "capsule": "PillCam SB3"}).to_csv(
        galar / "metadata.csv", index=False)
    by_id = dict(timelines)
    per_test = int(round(TEST_FRAMES * test_fraction / len(TEST_VIDEOS)))
    if per_test == 0:  # no test set: data.test_root null
        return {"videos": n_videos, "frames": frames, "test_videos": 0, "test_frames": 0, "fraction": fraction,
                "test_fraction": test_fraction}
    list_folder = frame_list_folder(tree / "test", [v for v, _ in TEST_VIDEOS])
    truth = []
    for (video_id, first), source in zip(TEST_VIDEOS, TEST_TIMELINES):
        labels = subsample(by_id[source], 1.0, per_test)
        numbers = first + np.arange(per_test)
        names = [f"frame_{f:07d}.png" for f in numbers]
        if not (done / video_id).exists():
            write_frames(tree / "test" / video_id, names, labels, pool)
            write_frame_list(list_folder, video_id, names)
            (done / video_id).touch()
        truth.append({"video_id": video_id, "events": events_of(labels, numbers)})
    (tree / "test_ground_truth.json").write_text(json.dumps({"videos": truth}) + "\n")
    return {"videos": n_videos, "frames": frames, "test_videos": len(TEST_VIDEOS),
            "test_frames": per_test * len(TEST_VIDEOS), "fraction": fraction, "test_fraction": test_fraction}


# ----------------------------------------------------------------------------- the run


def make_copy(work: Path, tree: Path, overrides: dict) -> Path:
    """The repository's tracked files under work/repo, params pointed at the tree, one commit."""
    repo = work / "repo"
    if (repo / ".git").is_dir():
        return repo
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, check=True,
                            capture_output=True, text=True).stdout.split("\n")
    for name in filter(None, listed):
        if (REPO / name).is_file():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, repo / name)
    params = repo / "params.yaml"
    has_test = (tree / "test").is_dir()
    params.write_text(apply(params.read_text(), {
        "data.root": str(tree / "galar"), "data.test_root": str(tree / "test") if has_test else None,
        "score.test_gt": str(tree / "test_ground_truth.json") if has_test else None, **overrides}))
    for command in (["git", "init", "-q"], ["git", "add", "-A"],
                    ["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost", "commit", "-qm", "copy"]):
        subprocess.run(command, cwd=repo, check=True)
    return repo


def measured_run(command: list[str], cwd: Path, log: Path) -> dict:
    """Run `command`; wall, CPU seconds, peak RSS (child and descendants), bytes written."""
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "CI": "true", "DVC_NO_ANALYTICS": "1", "PYTHONPATH": str(cwd)}
    began = time.perf_counter()
    with open(log, "w") as out:
        child = subprocess.Popen(command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - began
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"{' '.join(command)} failed ({code}): see {log}")
    return {"wall_s": round(wall, 2), "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
            "peak_rss_mb": round(usage.ru_maxrss / 1024, 1), "disk_written_mb": round(usage.ru_oublock * 512 / 2**20, 1)}


def stage_names(repo: Path) -> list[str]:
    listed = subprocess.run(["dvc", "stage", "list", "--name-only"], cwd=repo, check=True, capture_output=True,
                            text=True).stdout.split()
    return listed


def stage_outputs(repo: Path, stage: str) -> dict:
    """Rows of the stage's Parquet outputs and bytes of all its outputs (from dvc.lock)."""
    import yaml

    lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"].get(stage, {})
    rows, size = {}, 0
    for out in lock.get("outs", []):
        path = repo / out["path"]
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        size += sum(p.stat().st_size for p in files)
        for p in files:
            if p.suffix == ".parquet":
                rows[str(p.relative_to(repo))] = pq.read_metadata(p).num_rows
    return {"rows": rows, "outs_mb": round(size / 2**20, 2)}


def folder_size(folder: Path) -> tuple[int, int]:
    files = size = 0
    for parent, _, names in os.walk(folder):
        for name in names:
            try:
                size += os.lstat(os.path.join(parent, name)).st_size
                files += 1
            except OSError:  # removed while walked
                pass
    return files, size


def exp_run_temp(repo: Path, work: Path, override: str) -> dict:
    """`dvc exp run --temp -S override`, its temporary copy's largest size polled every 0.5 s."""
    largest = {"files": 0, "bytes": 0}
    stop = threading.Event()

    def poll():
        while not stop.wait(0.5):
            files, size = folder_size(repo / ".dvc" / "tmp" / "exps")
            if size > largest["bytes"] or files > largest["files"]:
                largest.update(files=max(files, largest["files"]), bytes=max(size, largest["bytes"]))

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    try:
        result = measured_run(["dvc", "exp", "run", "--temp", "-S", override], repo, work / "logs" / "exp_run_temp.log")
    finally:
        stop.set()
        watcher.join()
    log = (work / "logs" / "exp_run_temp.log").read_text()
    ran = sorted({line.split("'")[1] for line in log.splitlines() if line.startswith("Running stage")})
    return {"override": override, **result, "stages_run": ran,
            "temp_copy_max_files": largest["files"], "temp_copy_max_mb": round(largest["bytes"] / 2**20, 2)}


def run_pipeline(repo: Path, work: Path) -> dict:
    state_file = work / "measured.json"
    measured = json.loads(state_file.read_text()) if state_file.is_file() else {}
    for stage in stage_names(repo):
        if stage in measured:
            continue
        print(f"run: {stage} …", file=sys.stderr, flush=True)
        result = measured_run(["dvc", "repro", "--single-item", stage], repo, work / "logs" / f"{stage}.log")
        measured[stage] = {**result, **stage_outputs(repo, stage)}
        state_file.write_text(json.dumps(measured, indent=1))
        print(f"run: {stage} {result}", file=sys.stderr, flush=True)
    return measured


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", required=True, help="where the Galar-shaped tree is written (or finished)")
    parser.add_argument("--work", required=True, help="the repository copy and logs")
    parser.add_argument("--videos", type=int, default=80, help="the first N Galar videos")
    parser.add_argument("--fraction", type=float, default=1.0, help="share of each video's annotated frames kept")
    parser.add_argument("--test-fraction", type=float, default=1.0, help="share of the 161,025 test frames")
    parser.add_argument("--train-samples", type=int, default=4096, help="train.samples_per_epoch (one epoch)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="more params.yaml values for the copy (YAML values)")
    parser.add_argument("--exp-override", default="events.min_length=4", help="the post-only `dvc exp run --temp -S`")
    parser.add_argument("--build-only", action="store_true", help="write the tree and stop")
    parser.add_argument("--out", default=None, help="the JSON (default: <work>/galar_scale.json)")
    args = parser.parse_args(argv)
    import yaml

    tree, work = Path(args.tree).resolve(), Path(args.work).resolve()
    began = time.perf_counter()
    counts = build_tree(tree, args.videos, args.fraction, args.test_fraction)
    result = {"tree": counts, "tree_build_s": round(time.perf_counter() - began, 1)}
    if args.build_only:
        print(json.dumps(result))
        return 0
    overrides = {"train.epochs": 1, "train.samples_per_epoch": args.train_samples, "base.exact_cpu": False,
                 "demo.n_videos": 1, "demo.frames_per_video": 100, "demo.n_test_videos": 0,
                 "demo.test_frames_per_video": 100}
    overrides |= {key: yaml.safe_load(value) for key, value in (item.split("=", 1) for item in args.set)}
    repo = make_copy(work, tree, overrides)
    result["params"] = {key: overrides[key] for key in sorted(overrides)}
    result["stages"] = run_pipeline(repo, work)
    result["total_first_repro_wall_s"] = round(sum(s["wall_s"] for s in result["stages"].values()), 1)
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost", "commit", "-qm", "run"],
                   cwd=repo, check=True)
    result["second_repro"] = measured_run(["dvc", "repro"], repo, work / "logs" / "second_repro.log")
    result["exp_run_temp"] = exp_run_temp(repo, work, args.exp_override)
    result["dvc_status"] = measured_run(["dvc", "status"], repo, work / "logs" / "dvc_status.log")
    result["cpus"] = os.cpu_count()
    text = json.dumps(result, indent=1)
    out = Path(args.out) if args.out else work / "galar_scale.json"
    out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
