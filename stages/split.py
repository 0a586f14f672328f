"""Stage `split`: assign every labelled video to train or validation (never both).

    python stages/split.py [--params params.yaml] [--index data/index/frames.parquet]
        [--out data/split/frames.parquet] [--test-out data/split/test.parquet] [--metrics metrics/split.json]

Reads the `split` section. Writes the frame index with a `split` column ("train"/"val") and a
small summary: videos per split, per-label positive frames and positive videos per split.
The labelled videos `split.test_videos` holds out go to `--test-out` instead (split "test",
fold -1; empty without them): train, predict@k, the ensemble and the thresholds never see
them; predict_test, events, score and report treat them as test videos with known labels.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vce.core import runner
from vce.core.errors import DataError
from vce.core.io import write_json
from vce.core.params import load_section


@runner.stage
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog=runner.module_prog(__spec__), description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--params", default="params.yaml", help="the params file")
    parser.add_argument("--index", default="data/index/frames.parquet", help="labelled frame index (index stage)")
    parser.add_argument("--out", default="data/split/frames.parquet", help="frame index with split column written")
    parser.add_argument("--test-out", default=None,
                        help="held-out labelled test videos (split.test_videos) written here (None: test.parquet beside --out)")
    parser.add_argument("--metrics", default="metrics/split.json", help="videos and label coverage per split")
    args = parser.parse_args(argv)
    # Heavy imports here, not at the top: `--help` stays fast and pandas-free.
    import pandas as pd

    from vce.core.io import write_parquet
    from vce.data.split import SplitParams, split_frames

    test_out = args.test_out or Path(args.out).with_name("test.parquet")
    cfg = load_section(args.params, "split", SplitParams)
    if not Path(args.index).is_file():
        raise DataError(f"frame index not found: {args.index} (run the index stage first)")
    frames, summary = split_frames(pd.read_parquet(args.index), cfg)
    is_test = (frames["split"] == "test").to_numpy()
    write_parquet(args.out, frames[~is_test])
    write_parquet(test_out, frames[is_test])
    write_json(args.metrics, summary)
    held = f", {len(summary['test']['videos'])} held out as test (split.test_videos)" if "test" in summary else ""
    print(f"split {sum(summary['n_videos'].values())} videos: {summary['n_videos']['train']} "
          f"train, {summary['n_videos']['val']} val{held}; labels without validation positives: "
          f"{summary['labels_without_val_positives'] or 'none'} -> {args.out}, {test_out}, {args.metrics}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
