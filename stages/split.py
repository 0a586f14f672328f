"""Stage `split`: assign every labelled video to train or validation (never both).

    python stages/split.py [--params params.yaml] [--index data/index/frames.parquet]
        [--out data/split/frames.parquet] [--metrics metrics/split.json]

Reads the `split` section. Writes the frame index with a `split` column ("train"/"val") and a
small summary: videos per split, per-label positive frames and positive videos per split.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from vce.core import runner
from vce.core.errors import DataError
from vce.core.io import write_json, write_parquet
from vce.core.params import load_section
from vce.data.split import SplitParams, split_frames


@runner.stage
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--params", default="params.yaml", help="the params file")
    parser.add_argument("--index", default="data/index/frames.parquet", help="labelled frame index (index stage)")
    parser.add_argument("--out", default="data/split/frames.parquet", help="frame index with split column written")
    parser.add_argument("--metrics", default="metrics/split.json", help="videos and label coverage per split")
    args = parser.parse_args(argv)
    cfg = load_section(args.params, "split", SplitParams)
    if not Path(args.index).is_file():
        raise DataError(f"frame index not found: {args.index} (run the index stage first)")
    frames, summary = split_frames(pd.read_parquet(args.index), cfg)
    write_parquet(args.out, frames)
    write_json(args.metrics, summary)
    print(f"split {sum(summary['n_videos'].values())} videos: {summary['n_videos']['train']} "
          f"train, {summary['n_videos']['val']} val; labels without validation positives: "
          f"{summary['labels_without_val_positives'] or 'none'} -> {args.out}, {args.metrics}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
