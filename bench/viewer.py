"""Size and build time of the exam viewer (`vce.viewer.build`) at Galar scale, 3.5 M frames.

1. Timeline: the official ground truth of all 80 Galar videos (`../shared/fixtures/galar_gt_events.json`,
   25,093 events, 40,219 (event, label) pairs), each video's frames 0 .. its last labelled index.
2. Submission, shaped like the score engine's metric-optimal list: every ground-truth (event,
   label) jittered by up to 3 frames, then `--candidates` false candidates per (video, label)
   with ground truth and 2 per (video, label) without (lengths of the label's median run);
   clinical list: each label's merged ground-truth runs, jittered.
3. Probabilities: uniform random (their values do not change the size: the trace is bins x 17
   bytes); one video in 50 frames invalid.
4. Frames: the 300 real capsule frames of `../shared/fixtures/wcebleedgen` (224 px), upscaled
   to `--frame-px` PNGs and reused cyclically for every frame time.

The full viewer is built once, with params.yaml's `report.viewer`, from frames of the first
`--frame-px`; for every size, `--sample` thumbnails are made again to time and weigh one. Prints
one JSON object. Run: python -m bench.viewer   (a few minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

from vce.core.labels import LABELS
from vce.core.params import load_section
from vce.eval.report import ReportParams
from vce.viewer.build import ViewerSet, write_viewer
from vce.viewer.thumbnails import write_thumbnails

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT.parent / "shared" / "fixtures"


def synthetic_set(gt: dict, candidates: int, frame_pool: list[str], rng) -> ViewerSet:
    """The Galar-scale validation set: ground truth, engine-like submission and clinical list, probabilities."""
    stats = pd.read_csv(FIXTURES / "galar_label_stats.csv").set_index("label")["median_len"].to_dict()
    pred_videos, clin_videos, probs, files = [], [], [], []
    for video in gt["videos"]:
        video_id = str(video["video_id"])
        n = max(e["end"] for e in video["events"]) + 1
        events, by_label = [], {label: [] for label in LABELS}
        for event in video["events"]:
            for label in event["label"]:
                by_label[label].append((event["start"], event["end"]))
                s = max(0, event["start"] + int(rng.integers(-3, 4)))
                events.append({"start": s, "end": max(s, event["end"] + int(rng.integers(-3, 4))), "label": [label]})
        clinical = []
        for label, spans in by_label.items():
            length = int(stats.get(label, 5))
            for _ in range(candidates if spans else 2):
                s = int(rng.integers(0, max(1, n - length)))
                events.append({"start": s, "end": min(n - 1, s + length - 1), "label": [label]})
            merged = []
            for s, e in sorted(spans):
                if merged and s <= merged[-1][1] + 1:
                    merged[-1][1] = max(merged[-1][1], e)
                else:
                    merged.append([s, e])
            clinical += [{"start": s, "end": e, "label": [label]} for s, e in merged]
        pred_videos.append({"video_id": video["video_id"], "events": events})
        clin_videos.append({"video_id": video["video_id"], "events": sorted(clinical, key=lambda e: e["start"])})
        values = rng.random((n, len(LABELS)), dtype=np.float32)
        values[::50] = np.nan
        frame = pd.DataFrame(values, columns=list(LABELS))
        frame.insert(0, "t", np.arange(n))
        frame.insert(0, "video_id", video_id)
        probs.append(frame)
        files.append(pd.DataFrame({"video_id": video_id, "t": np.arange(n),
                                   "path": np.take(frame_pool, np.arange(n) % len(frame_pool))}))
    probs = pd.concat(probs, ignore_index=True)
    return ViewerSet("validation", {"videos": pred_videos}, {"videos": clin_videos}, probs,
                     pd.concat(files, ignore_index=True), {str(v["video_id"]): "index" for v in gt["videos"]}, gt)


def frame_pool(folder: Path, px: int) -> list[str]:
    """The real capsule frames upscaled to px x px PNGs under `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for source in sorted((FIXTURES / "wcebleedgen" / "frames").glob("*.png")):
        target = folder / source.name
        with Image.open(source) as image:
            image.convert("RGB").resize((px, px), Image.Resampling.BICUBIC).save(target)
        out.append(str(target))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frame-px", type=int, nargs="+", default=[336, 512], help="frame sizes (the first builds)")
    parser.add_argument("--candidates", type=int, default=10, help="false candidates per (video, label) with truth")
    parser.add_argument("--sample", type=int, default=300, help="thumbnails timed per frame size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", default=None, help="also copy the built viewer here")
    args = parser.parse_args(argv)
    params = load_section(ROOT / "params.yaml", "report", ReportParams).viewer
    gt = json.loads((FIXTURES / "galar_gt_events.json").read_text())
    result = {"command": " ".join(["python -m bench.viewer", *(argv if argv is not None else sys.argv[1:])]),
              "params": params.model_dump()}
    with tempfile.TemporaryDirectory(prefix="vce_viewer_bench_") as tmp:
        tmp = Path(tmp)
        pools = {px: frame_pool(tmp / f"frames_{px}", px) for px in args.frame_px}
        viewer_set = synthetic_set(gt, args.candidates, pools[args.frame_px[0]], np.random.default_rng(args.seed))
        result["frames"] = len(viewer_set.probs)
        result["submission_pairs"] = sum(len(e["label"]) for v in viewer_set.prediction["videos"] for e in v["events"])
        result["clinical_events"] = sum(len(v["events"]) for v in viewer_set.clinical["videos"])
        start = time.perf_counter()
        summary = write_viewer(tmp / "viewer", [viewer_set], {"method": "f1", "thresholds": dict.fromkeys(LABELS, 0.5)},
                               params, 40, 0.158, None)
        result["build_seconds"] = round(time.perf_counter() - start, 1)
        pages = sum(p.stat().st_size for p in (tmp / "viewer").glob("*.html"))
        result["viewer"] = {**summary, "page_bytes": pages, "largest_page_bytes":
                            max(p.stat().st_size for p in (tmp / "viewer").glob("*.html")), "MB": round(summary["bytes"] / 1e6, 1)}
        result["peak_rss_MB"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        result["per_thumbnail"] = {}
        for px, pool in pools.items():
            sample = {("s", i): pool[i % len(pool)] for i in range(args.sample)}
            start = time.perf_counter()
            made = write_thumbnails(sample, tmp / f"sample_{px}", params.thumbnail_px, params.image_format, params.quality)
            seconds = time.perf_counter() - start
            mean_bytes = sum(n for _, n in made.values()) / len(made)
            result["per_thumbnail"][f"{px}px"] = {"ms": round(1000 * seconds / len(made), 2), "bytes": round(mean_bytes),
                                                  "all_thumbnails_MB": round(mean_bytes * summary["thumbnails"] / 1e6, 1)}
        if args.keep:
            shutil.copytree(tmp / "viewer", args.keep, dirs_exist_ok=True)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
