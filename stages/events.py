"""Stage `events`: thresholds + temporal post-processing → events in the official JSON.

Writes the validation events (scored by `score`) and the test-set submission, each as the
official JSON and an .xlsx (video_id, start, end, label). The test set is the test index and,
with `--held-out`, the labelled videos `split.test_videos` holds out. Post-processing knobs come from
params.yaml `events`, or from `models/thresholds.json` when `thresholds.method: map` tuned them.
With `thresholds.method: engine` the fitted score engine (`vce.post.engine`) writes both lists:
`val.json` / `submission.json` the metric-optimal submission (candidates appended per label),
`clinical_val.json` / `clinical_submission.json` one event per run, for people and the report.
Without it the two lists are the same events (`vce.post.decoder.decode` applies either).
`post.probs` picks the probabilities: the frame model's (`data/predict`) or the temporal
model's (`data/temporal`); `events.anatomy: viterbi` decodes regions as one monotone path.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vce.core import runner
from vce.core.io import write_json
from vce.core.params import PostParams, from_dict, load_params


def parse_args(argv):
    parser = argparse.ArgumentParser(prog=runner.module_prog(__spec__), description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--params", default="params.yaml", help="the params file")
    parser.add_argument("--thresholds", default="models/thresholds.json", help="thresholds and tuned post-processing (thresholds stage)")
    parser.add_argument("--val-probs", default=None, help="default: val.parquet of the directory post.probs picks")
    parser.add_argument("--test-probs", default=None, help="default: test.parquet of the directory post.probs picks")
    parser.add_argument("--predict-dir", default="data/ensemble", help="the frame model's probabilities")
    parser.add_argument("--temporal-dir", default="data/temporal", help="the temporal model's probabilities")
    parser.add_argument("--frames", default="data/ensemble/frames.parquet", help="labelled frame index with split column")
    parser.add_argument("--test-frames", default="data/index/test.parquet", help="test frame index")
    parser.add_argument("--held-out", default="data/split/test.parquet",
                        help="labelled test videos held out by split.test_videos ('': none)")
    parser.add_argument("--out-dir", default="data/events", help="events written here (val/submission .json and .xlsx)")
    return parser.parse_args(argv)


@runner.stage
def main(argv=None) -> int:
    args = parse_args(argv)
    # Heavy imports here, not at the top: `--help` stays fast and numpy-free.
    from vce.core.contracts import all_test_frames, probs_file, read_index, read_probs
    from vce.eval.score import check_submission
    from vce.post.decoder import decode, read_decoder
    from vce.post.events import write_xlsx
    from vce.post.timeline import join_probs, require_every_frame
    params = load_params(args.params)
    source = from_dict(PostParams, params["post"], "post").probs
    decoder = read_decoder(args.thresholds, params["events"])  # read and checked once, before any output
    val_probs = args.val_probs or str(probs_file(source, "val", args.predict_dir, args.temporal_dir))
    test_probs = args.test_probs or str(probs_file(source, "test", args.predict_dir, args.temporal_dir))
    out = Path(args.out_dir)
    test_frames = all_test_frames(read_index(args.test_frames), read_index(args.held_out) if args.held_out else None)
    tables = []  # every input read and checked before any output is written
    for name, probs_path, frames in (("val", val_probs, read_index(args.frames)),
                                     ("submission", test_probs, test_frames)):
        probs = read_probs(probs_path)
        if name == "submission":  # every video and frame of the test index, or no submission
            require_every_frame(probs, frames, probs_path, args.test_frames)
        tables.append((name, join_probs(probs, frames)[0]))
    for name, probs in tables:
        submission, clinical = decode(decoder, probs)
        check_submission(submission, where=f"{name} events")
        write_json(out / f"{name}.json", submission, indent=None)
        write_json(out / f"clinical_{name}.json", clinical, indent=None)
        write_xlsx(submission, out / f"{name}.xlsx")
        events = sum(len(video["events"]) for video in submission["videos"])
        print(f"{name}: {len(submission['videos'])} video(s), {events} event(s) → {out / (name + '.json')}")
        if events == 0 and submission["videos"]:
            # An experiment that emits nothing scores exactly the empty submission: say so, loudly.
            print(f"warning: {name}: no event at all in {len(submission['videos'])} video(s): every label is "
                  f"off (thresholds {args.thresholds}) or suppressed (events.presence_threshold / min_length); "
                  "the score will be the empty submission's", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
