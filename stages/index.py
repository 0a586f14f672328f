"""Stage `index`: list the frame folders and label CSVs into the frame index (no pixels read).

    python stages/index.py [--params params.yaml] [--frames-out data/index/frames.parquet]
        [--test-out data/index/test.parquet] [--report metrics/index_report.json]

Reads the `data` section. Writes the labelled frames (Galar layout under data.root), the
unlabelled test frames (RARE-VISION layout under data.test_root; an empty table when it is
null) and a small report of counts and of every skipped or suspicious file (first few per kind).

On a machine without the frames (neither data.root nor data.test_root is a folder there) that
`dvc pull`ed this stage's outputs, it keeps them as they are and says so in one line: DVC runs
this stage on every `dvc repro` / `dvc exp run` (`always_changed`), and the pulled index is the
one the pulled models and probabilities were made from, so nothing downstream reruns.
"""

from __future__ import annotations

import argparse
import sys
import time

from vce.core import runner
from vce.core.io import atomic_paths, json_text
from vce.core.params import load_section


@runner.stage
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog=runner.module_prog(__spec__), description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--params", default="params.yaml", help="the params file")
    parser.add_argument("--frames-out", default="data/index/frames.parquet", help="labelled frame index written")
    parser.add_argument("--test-out", default="data/index/test.parquet", help="test frame index written")
    parser.add_argument("--report", default="metrics/index_report.json", help="counts and warnings of the listing")
    args = parser.parse_args(argv)
    # Heavy imports here, not at the top: `--help` stays fast and pandas-free.
    from vce.data.index import DataParams, build_index, kept_index

    began = time.perf_counter()
    cfg = load_section(args.params, "data", DataParams)
    kept = kept_index(cfg, args.frames_out, args.test_out, args.report)
    if kept is not None:
        print(kept, file=sys.stderr)
        return 0
    frames, test, report = build_index(cfg)
    for line in report.summary_lines():
        print(line, file=sys.stderr)
    # All three or none: a failure half-way (disk full) must not leave new frames beside an old test index.
    with atomic_paths(args.frames_out, args.test_out, args.report) as (frames_tmp, test_tmp, report_tmp):
        frames.to_parquet(frames_tmp, index=False)
        test.to_parquet(test_tmp, index=False)
        report_tmp.write_text(json_text(report.as_dict()))
    galar, held_out = report.layouts["galar"], report.layouts["test"]
    print(f"indexed {galar['frames']} labelled frames of {galar['videos']} videos, "
          f"{held_out['frames']} test frames of {held_out['videos']} videos, "
          f"{sum(report.counts.values())} warnings, {time.perf_counter() - began:.1f} s -> {args.frames_out}, "
          f"{args.test_out}, {args.report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
