"""Stage `report`: curves and tables for `dvc plots`, event timelines and `metrics/report.md`.

Reads the validation probabilities (the ones `post.probs` selects), labels, thresholds, predicted
events and ground truth; when the score stage knew a test ground truth (`test_gt.json` beside
`--gt`: `score.test_gt` and the labels of the videos `split.test_videos` holds out) also the
test probabilities and events, so the report puts the held-out score and its timelines beside
validation. Writes plot
data under `plots/` (declared in dvc.yaml's top-level `plots:`) and the markdown report.

Also writes the offline exam viewer (`--viewer-dir`, `vce.viewer.build`): the validation videos
and every test video (TP/FP marks where the test truth is known), the submission and the
clinical list, with thumbnails of the frame files under `data.root` / `data.test_root`. On a
machine without those files (one that pulled the outputs to sweep the post-processing) the viewer is
written all the same, each missing thumbnail marked unavailable, and one line says how many.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from vce.core import runner
from vce.core.errors import DataError
from vce.core.io import check_folder_output, read_json
from vce.core.labels import LABELS
from vce.core.params import PostParams, from_dict, load_params

if TYPE_CHECKING:  # the heavy imports (numpy, pandas) happen in the functions: `--help` stays fast
    import pandas as pd

    from vce.data.index import DataParams
    from vce.eval.report import ScoredSet
    from vce.viewer.build import ViewerSet


def parse_args(argv):
    parser = argparse.ArgumentParser(prog=runner.module_prog(__spec__), description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--params", default="params.yaml", help="the params file")
    parser.add_argument("--probs", default=None,
                        help="validation probabilities (None: the ones post.probs selects)")
    parser.add_argument("--predict-dir", default="data/ensemble", help="the frame model's probabilities")
    parser.add_argument("--temporal-dir", default="data/temporal", help="the temporal model's probabilities")
    parser.add_argument("--frames", default="data/ensemble/frames.parquet", help="frame index with labels")
    parser.add_argument("--thresholds", default="models/thresholds.json", help="thresholds and tuned post-processing")
    parser.add_argument("--route", default="metrics/route.json",
                        help="each label's route (temporal stage); shown in the per-class table when the file exists")
    parser.add_argument("--events", default="data/events/val.json", help="predicted validation events")
    parser.add_argument("--gt", default="data/score/val_gt.json", help="validation ground-truth events")
    parser.add_argument("--test-gt", default=None,
                        help="test ground truth the score stage scored against (None: test_gt.json beside --gt)")
    parser.add_argument("--plots-dir", default="plots", help="plot data written here")
    parser.add_argument("--report", default="metrics/report.md", help="markdown report written")
    parser.add_argument("--test-probs", default=None,
                        help="test probabilities (None: the ones post.probs selects; used when the test truth is known)")
    parser.add_argument("--test-index", default="data/index/test.parquet", help="test frame index")
    parser.add_argument("--held-out", default="data/split/test.parquet",
                        help="labelled test videos held out by split.test_videos ('': none)")
    parser.add_argument("--test-events", default="data/events/submission.json", help="predicted test events")
    parser.add_argument("--clinical-events", default="data/events/clinical_val.json",
                        help="the validation clinical list (events stage)")
    parser.add_argument("--test-clinical-events", default="data/events/clinical_submission.json",
                        help="the test clinical list (events stage)")
    parser.add_argument("--viewer-dir", default=None, help="the offline HTML viewer written here (None: <--plots-dir>/viewer)")
    args = parser.parse_args(argv)
    if args.viewer_dir is None:  # beside the plots it belongs to, wherever --plots-dir puts them
        args.viewer_dir = str(Path(args.plots_dir) / "viewer")
    return args


@runner.stage
def main(argv=None) -> int:
    args = parse_args(argv)
    # Heavy imports here, not at the top: `--help` stays fast and numpy-free.
    from vce.core.contracts import all_test_frames, probs_file, read_index, read_probs
    from vce.data.index import DataParams
    from vce.eval.explain import explain_labels
    from vce.eval.report import ReportParams, write_report
    from vce.post.events import EventParams
    from vce.post.thresholds import ThresholdParams
    from vce.post.timeline import join_probs
    from vce.viewer.build import write_viewer
    check_folder_output(args.viewer_dir)  # a folder the tool did not write is refused before the work, not after
    all_params = load_params(args.params)
    params = from_dict(ReportParams, all_params["report"], "report")
    source = from_dict(PostParams, all_params["post"], "post").probs
    configured_events = from_dict(EventParams, all_params["events"], "events").model_dump()
    data = from_dict(DataParams, all_params["data"], "data")
    min_gain = from_dict(ThresholdParams, all_params["thresholds"], "thresholds").engine.min_gain_sqrt_videos
    probs_path = args.probs or probs_file(source, "val", args.predict_dir, args.temporal_dir)
    probs, labels = join_probs(read_probs(probs_path), read_index(args.frames))
    if labels is None:
        raise DataError(f"{args.frames} has no label columns: the report needs labelled validation frames")
    valid = probs["valid"].to_numpy()
    sets = [_scored_set("validation", probs, read_index(args.frames), read_json(args.gt, "ground truth"),
                        read_json(args.events, "validation events"))]
    test_gt = read_json(args.test_gt or Path(args.gt).with_name("test_gt.json"), "test ground truth")
    if test_gt["videos"]:  # the score stage knew the test ground truth: a held-out score
        index = all_test_frames(read_index(args.test_index), read_index(args.held_out) if args.held_out else None)
        test_probs_path = args.test_probs or probs_file(source, "test", args.predict_dir, args.temporal_dir)
        test_probs, _ = join_probs(read_probs(test_probs_path), index)
        known = {video["video_id"] for video in test_gt["videos"]}  # test-root videos without truth: not drawn
        test_probs = test_probs[test_probs["video_id"].astype(str).isin(known)].reset_index(drop=True)
        test_events = read_json(args.test_events, "test events")
        test_events = {"videos": [video for video in test_events["videos"] if video["video_id"] in known]}
        sets.append(_scored_set("test", test_probs, index, test_gt, test_events))
    saved = read_json(args.thresholds, "thresholds")
    route = read_json(args.route, "routes") if Path(args.route).is_file() else None
    # 1. One explanation per label (route, decision, events, why silent), made once: the report and the viewer show it.
    events_used = saved.get("events") or configured_events
    n_tuning = probs["video_id"].nunique()
    explained = explain_labels(saved, sets[0].probs, sets[0].prediction, (route or {}).get("routes"), n_tuning,
                               min_gain, events_used)
    results = write_report(
        y_true=labels[valid],
        y_prob=probs[list(LABELS)].to_numpy()[valid],
        sets=sets,
        saved_thresholds=saved,
        probs_source=source,
        configured_events=configured_events,
        params=params,
        plots_dir=args.plots_dir,
        report_path=args.report,
        route=route,
        explained=explained,
    )
    viewer = write_viewer(args.viewer_dir, _viewer_sets(args, data, source, sets[0], test_gt), saved, params.viewer,
                          n_tuning_videos=n_tuning, min_gain_sqrt_videos=min_gain, events=events_used,
                          routes=(route or {}).get("routes"), explained={"validation": explained})
    for r in results:
        print(f"report: {r.scored.name:<10}  mAP@0.5 = {r.score['map@0.5']:.4f}   mAP@0.95 = {r.score['map@0.95']:.4f}"
              f"   empty submission = {r.empty['map@0.5']:.4f}")
    print(f"report: wrote {args.report} and {args.plots_dir}/")
    print(f"report: viewer {args.viewer_dir}/index.html: {viewer['videos']} videos, {viewer['thumbnails']} thumbnails, "
          f"{viewer['bytes'] / 1e6:.1f} MB")
    if viewer["unavailable"]:  # a machine without the frames (or unreadable files): the viewer says so where they would be
        print(f"report: viewer: {viewer['unavailable']} of {viewer['unavailable'] + viewer['thumbnails']} thumbnails "
              f"unavailable: frame files not found or unreadable under {data.root} / {data.test_root}", file=sys.stderr)
    return 0


def _frame_files(frames, root) -> pd.DataFrame:
    """video_id, event time t and the frame file (under `root`) of every index row."""
    import pandas as pd

    from vce.post.timeline import event_time
    return pd.DataFrame({"video_id": frames["video_id"].astype(str).to_numpy(), "t": event_time(frames),
                         "path": [str(Path(root or ".") / p) for p in frames["path"]]})


def _viewer_sets(args, data: DataParams, source: str, validation: ScoredSet, test_gt: dict) -> list[ViewerSet]:
    """The validation set and, when there are test frames, every test video (truth where known)."""
    import pandas as pd

    from vce.core.contracts import all_test_frames, probs_file, read_index, read_probs
    from vce.post.timeline import join_probs
    from vce.viewer.build import ViewerSet
    frames = read_index(args.frames)
    frames = frames[frames["video_id"].astype(str).isin(set(validation.probs["video_id"].astype(str)))]
    sets = [ViewerSet("validation", validation.prediction, read_json(args.clinical_events, "validation clinical list"),
                      validation.probs, _frame_files(frames, data.root), validation.units, validation.gt)]
    test = read_index(args.test_index)
    held = read_index(args.held_out) if args.held_out else None
    index = all_test_frames(test, held)
    if len(index):
        files = pd.concat([_frame_files(test, data.test_root)]
                          + ([_frame_files(held, data.root)] if held is not None and len(held) else []), ignore_index=True)
        test_probs_path = args.test_probs or probs_file(source, "test", args.predict_dir, args.temporal_dir)
        test_probs, _ = join_probs(read_probs(test_probs_path), index)
        scored = _scored_set("test", test_probs, index, test_gt, read_json(args.test_events, "test events"))
        sets.append(ViewerSet("test", scored.prediction, read_json(args.test_clinical_events, "test clinical list"),
                              scored.probs, files, scored.units, test_gt if test_gt["videos"] else None))
    return sets


def _scored_set(name: str, probs, frames, gt: dict, prediction: dict) -> ScoredSet:
    """A set's probabilities (NaN where invalid) with the event unit of each video."""
    import numpy as np

    from vce.eval.report import ScoredSet
    trace = probs[["video_id", "t", *LABELS]].copy()
    trace.loc[~probs["valid"].to_numpy(), list(LABELS)] = np.nan
    units = frames.groupby("video_id", sort=False)["event_unit"].first()
    return ScoredSet(name, gt, prediction, trace, {str(v): str(u) for v, u in units.items()})


if __name__ == "__main__":
    sys.exit(main())
