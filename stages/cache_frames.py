"""Stage `cache_frames` (optional): decode every frame once into a memory-mapped store.

With `cache.enabled: false` (the default) it writes a folder that says so and the train and
predict stages decode PNGs as usual. Enabled, training and prediction read raw pixels from
`data/cache` instead of decoding (see vce/frame_cache.py for the layout). Enabled on a machine
without the frames it is an error naming the missing root (each frame would be cached as
undecodable): there, `dvc exp run --allow-missing` skips this stage, whose output DVC never pushes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vce.core import runner
from vce.core.errors import DataError
from vce.core.params import from_dict, load_params


def parse_args(argv):
    parser = argparse.ArgumentParser(prog=runner.module_prog(__spec__), description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--params", default="params.yaml", help="the params file")
    parser.add_argument("--frames", default="data/split/frames.parquet", help="labelled frame index with split column")
    parser.add_argument("--test", default="data/index/test.parquet", help="test frame index")
    parser.add_argument("--held-out", default="data/split/test.parquet",
                        help="labelled test videos held out by split.test_videos ('': none)")
    parser.add_argument("--out", default="data/cache", help="cache folder written")
    return parser.parse_args(argv)


@runner.stage
def main(argv=None) -> int:
    args = parse_args(argv)
    # Heavy imports here, not at the top: `--help` stays fast and torch-free.
    import pandas as pd

    from vce.core.contracts import read_index
    from vce.data.frame_cache import CacheParams, build_cache, write_disabled
    from vce.data.index import DataParams

    params = load_params(args.params)
    cache = from_dict(CacheParams, params["cache"], "cache")
    data = from_dict(DataParams, params["data"], "data")
    if not cache.enabled:
        write_disabled(args.out)
        print(f"frame cache disabled (cache.enabled: false): {args.out}/meta.json says so")
        return 0
    roots = [("data.root", data.root)] + ([("data.test_root", data.test_root)] if data.test_root is not None else [])
    for key, root in roots:
        if not Path(root).is_dir():
            raise DataError(f"frame root not found: {root} ({key}): the frame cache decodes the frames, "
                            "so it is built where they are (cache.enabled: true)")
    columns = ["video_id", "frame", "path"]
    frames = read_index(args.frames, columns + ["split"])
    parts = [frames[frames["split"] == s][columns].assign(root=str(data.root))
             for s in ("train", "val") if s in cache.splits]
    if "test" in cache.splits and data.test_root is not None:
        parts.append(read_index(args.test, columns).assign(root=str(data.test_root)))
    if "test" in cache.splits and args.held_out:
        parts.append(read_index(args.held_out, columns).assign(root=str(data.root)))
    meta = build_cache(pd.concat(parts, ignore_index=True), args.out, cache, data.max_frame_pixels)
    print(f"cached {meta['count']} frames at {meta['size']} px ({meta['invalid']} undecodable) in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
