"""Events of one exam folder, outside the DVC graph: the trained fold models + the tuned post-processing.

    python -m vce.infer.detect EXAM_FOLDER --out events.json
        [--models models/folds/0/model.pt ...] [--ensemble metrics/ensemble.json]
        [--temporal models/temporal.pt] [--thresholds models/thresholds.json] [--params params.yaml]

EXAM_FOLDER holds one video's frames named like the RARE-VISION test set (`frame_<n>.png`);
its folder name is the video id. Every model in `--models` (default: every
`models/folds/*/model.pt`) predicts every frame; their probabilities are fused with the
ensemble stage's weights (`--ensemble`, when it names as many folds; else the mean); the
temporal model refines them when `models/thresholds.json` was tuned on temporal or auto
probabilities (auto: per label, as `models/temporal.pt` records the routes, `vce.infer.route`);
then what the thresholds stage fitted (the score engine, or thresholds and event post-processing) turns them into events, as the events stage does. Writes the official submission JSON (one video) to `--out`.

    --clinical-out clinical.json   also the clinical list (the engine: one event per run; else the same events)
    --viewer-dir exam_viewer/      also the offline HTML viewer of the exam (`vce.viewer.build`; no ground truth,
                                   so no TP/FP marks; params.yaml `report.viewer` sizes the thumbnails)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from vce.core import runner

if TYPE_CHECKING:  # the heavy imports (numpy, pandas, torch) happen in the functions: `--help` answers
    import numpy as np  # at once, and `base.exact_cpu` re-executes the command before any of them loads
    import pandas as pd

    from vce.data.index import DataParams


def parse_args(argv):
    parser = argparse.ArgumentParser(prog=runner.module_prog(__spec__), description=__doc__.splitlines()[0])
    parser.add_argument("exam", help="folder of one video's frames (frame_<n>.png)")
    parser.add_argument("--out", required=True, help="events JSON to write (the official submission format)")
    parser.add_argument("--models", nargs="+", default=None, help="default: models/folds/*/model.pt")
    parser.add_argument("--ensemble", default="metrics/ensemble.json", help="fusion weights (ensemble stage)")
    parser.add_argument("--temporal", default="models/temporal.pt", help="temporal model (temporal stage)")
    parser.add_argument("--thresholds", default="models/thresholds.json", help="tuned thresholds and events")
    parser.add_argument("--params", default="params.yaml", help="data, predict and events sections")
    parser.add_argument("--clinical-out", default=None, help="also write the clinical list (one event per run) here")
    parser.add_argument("--viewer-dir", default=None, help="also write the exam's offline HTML viewer here")
    return parser.parse_args(argv)


def exam_frames(folder: Path, data: DataParams) -> pd.DataFrame:
    from vce.core.errors import DataError
    from vce.data.frame_files import IndexReport
    from vce.data.index import index_test_video

    if not folder.is_dir():
        raise DataError(f"exam folder not found: {folder}")
    report = IndexReport(data.report_examples)
    frames = index_test_video(folder, None, folder.parent, data, report)
    for line in report.summary_lines():  # frames left out (empty, truncated, oversized …) are said, as index says them
        print(f"{folder.name}: {line}", file=sys.stderr)
    if frames is None or frames.empty:
        raise DataError(f"{folder}: no frame files (expected frame_<n>.png)")
    return frames


def fusion_weights(path: Path, n_models: int) -> np.ndarray:
    """(F, 17): the ensemble stage's weights when they are for `n_models` folds, else the mean."""
    import numpy as np

    from vce.core.labels import LABELS

    if path.is_file():
        saved = json.loads(path.read_text()).get("weights", {})
        if saved and all(len(saved.get(label, [])) == n_models for label in LABELS):
            return np.array([saved[label] for label in LABELS], dtype=np.float64).T
    return np.full((n_models, len(LABELS)), 1.0 / n_models)


def temporal_route(source: str, temporal_path: Path, thresholds_path: Path):
    """(temporal model or None, per-label routes) for the probabilities the thresholds were tuned on:
    `frame` none; `temporal` every label; `auto` the routes the temporal stage chose (its model only
    when a label uses it)."""
    from vce.core.contracts import temporal_probs
    from vce.core.errors import DataError
    from vce.infer.route import fixed_routes
    from vce.infer.temporal import load_routes, load_temporal

    if not temporal_probs(source):
        return None, fixed_routes("frame")
    routes = fixed_routes("temporal") if source == "temporal" else load_routes(temporal_path)
    if routes is None:
        raise DataError(f"{temporal_path} records no per-label routes (post.probs: auto): rerun the temporal stage")
    if all(route == "frame" for route in routes.values()):
        return None, routes
    temporal = load_temporal(temporal_path)
    if temporal is None:
        raise DataError(f"{thresholds_path} was tuned on {source} probabilities but {temporal_path} "
                        "holds no trained temporal model")
    return temporal, routes


@runner.stage
def main(argv=None) -> int:
    args = parse_args(argv)
    # Heavy imports here, after the arguments: `--help` stays fast and torch-free.
    from vce.core.contracts import read_index
    from vce.core.errors import DataError
    from vce.core.io import check_folder_output, outside_output_set, write_json
    from vce.core.labels import LABELS
    from vce.core.params import from_dict, load_params
    from vce.data.index import DataParams
    from vce.eval.report import ReportParams
    from vce.infer.ensemble import fuse, fuse_embeddings
    from vce.infer.predict import PredictParams, predict_frames
    from vce.infer.route import mix
    from vce.infer.temporal import align, build_sequences, probs_frame, read_embeddings, refine
    from vce.model import checkpoint
    from vce.model.device import resolve_device
    from vce.post.decoder import decode, read_decoder
    from vce.post.thresholds import ThresholdParams
    from vce.post.timeline import join_probs
    from vce.viewer.build import check_page_names

    params = load_params(args.params)
    data = from_dict(DataParams, params["data"], "data")
    predict_params = from_dict(PredictParams, params["predict"], "predict")
    decoder = read_decoder(args.thresholds, params["events"])  # what the thresholds stage fitted, as the events stage reads it
    saved, source = decoder.saved, decoder.saved.probs
    viewer = None  # checked before any model runs
    if args.viewer_dir:
        check_folder_output(args.viewer_dir)  # a folder the tool did not write is refused before the run, not after
        viewer = (from_dict(ReportParams, params["report"], "report").viewer,
                  from_dict(ThresholdParams, params["thresholds"], "thresholds").engine.min_gain_sqrt_videos)
    models = args.models or sorted(str(p) for p in Path("models/folds").glob("*/model.pt"))
    if not models:
        raise DataError("no models: pass --models or train the pipeline (models/folds/<k>/model.pt)")
    temporal, routes = temporal_route(source, Path(args.temporal), Path(args.thresholds))
    folder = Path(args.exam)
    if args.viewer_dir:
        check_page_names("exam", [folder.name])
    frames = exam_frames(folder, data)
    device = resolve_device(predict_params.device)
    with tempfile.TemporaryDirectory(prefix="vce_detect_") as tmp, outside_output_set():  # read back below
        tmp = Path(tmp)
        probs_paths, emb_paths = [], []
        for i, path in enumerate(models):
            model, _ = checkpoint.load_model(path, device)
            probs_paths.append(tmp / f"{i}.parquet")
            emb_paths.append(tmp / f"{i}_embeddings.parquet")
            predict_frames(model, frames, folder.parent, probs_paths[-1], predict_params, device,
                           emb_paths[-1] if temporal is not None else None, desc=f"detect ({Path(path).parent.name})")
        fuse(probs_paths, fusion_weights(Path(args.ensemble), len(models)), tmp / "fused.parquet")
        probs = read_index(tmp / "fused.parquet")
        if temporal is not None:
            fuse_embeddings(emb_paths, tmp / "fused_embeddings.parquet")
            rows, embeddings = read_embeddings(tmp / "fused_embeddings.parquet")
            valid = align(rows, probs, ["valid"], "the fused probabilities")["valid"].to_numpy(bool)
            seq = build_sequences(rows, embeddings, valid)
            frame = align(rows, probs, list(LABELS), "the fused probabilities").to_numpy("float32")
            probs = probs_frame(seq, mix(frame, refine(temporal.to(device), seq, device), routes))
    joined, _ = join_probs(probs, frames)
    submission, clinical = decode(decoder, joined)  # as the events stage writes them
    write_json(args.out, submission, indent=None)
    if args.clinical_out:
        write_json(args.clinical_out, clinical, indent=None)
    if args.viewer_dir:
        write_exam_viewer(args.viewer_dir, folder, frames, joined, submission, clinical, *viewer, saved.saved,
                          params["events"])
        print(f"{folder.name}: viewer {Path(args.viewer_dir) / 'index.html'}")
    events = sum(len(v["events"]) for v in submission["videos"])
    print(f"{folder.name}: {len(frames)} frames, {len(models)} model(s), {source} probabilities → "
          f"{events} event(s) in {args.out}")
    return 0


def write_exam_viewer(out_dir, folder: Path, frames: pd.DataFrame, joined: pd.DataFrame, submission: dict,
                      clinical: dict, viewer_params, min_gain_sqrt_videos: float, saved_thresholds: dict,
                      configured_events: dict) -> dict:
    """The viewer of one exam: its events and clinical list on the timeline, thumbnails of its frames."""
    import numpy as np
    import pandas as pd

    from vce.core.labels import LABELS
    from vce.post.timeline import event_time
    from vce.viewer.build import ViewerSet, write_viewer

    trace = joined[["video_id", "t", *LABELS]].copy()
    trace.loc[~joined["valid"].to_numpy(bool), list(LABELS)] = np.nan
    files = pd.DataFrame({"video_id": frames["video_id"].astype(str).to_numpy(), "t": event_time(frames),
                          "path": [str(folder.parent / p) for p in frames["path"]]})
    units = {str(v): str(u) for v, u in frames.groupby("video_id", sort=False)["event_unit"].first().items()}
    return write_viewer(out_dir, [ViewerSet("exam", submission, clinical, trace, files, units)], saved_thresholds,
                        viewer_params, n_tuning_videos=None, min_gain_sqrt_videos=min_gain_sqrt_videos,
                        events=saved_thresholds.get("events") or configured_events)


if __name__ == "__main__":
    sys.exit(main())
