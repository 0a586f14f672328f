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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd  # noqa: E402

from vce.io import write_json, write_parquet  # noqa: E402
from vce.params import load_section  # noqa: E402
from vce.split import SplitParams, split_frames  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--index", default="data/index/frames.parquet")
    parser.add_argument("--out", default="data/split/frames.parquet")
    parser.add_argument("--metrics", default="metrics/split.json")
    args = parser.parse_args(argv)
    try:
        cfg = load_section(args.params, "split", SplitParams)
        if not Path(args.index).is_file():
            raise ValueError(f"frame index not found: {args.index} (run the index stage first)")
        frames, summary = split_frames(pd.read_parquet(args.index), cfg)
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    write_parquet(args.out, frames)
    write_json(args.metrics, summary)
    print(f"split {sum(summary['n_videos'].values())} videos: {summary['n_videos']['train']} "
          f"train, {summary['n_videos']['val']} val; labels without validation positives: "
          f"{summary['labels_without_val_positives'] or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
