"""Stage `demo_data`: generate the embedded demo dataset in the real Galar and test layouts.

    python stages/demo_data.py [--params params.yaml] [--out data/demo]

Reads the `demo` section. Replaces `--out` whole (a half-written demo never survives): the demo
is generated in a staging folder beside it and swapped in with the stage's other outputs
(`vce.core.io.atomic_dir`). Same seed, same bytes.

With `data.root` on a Galar copy the demo is unused but still generated, once: DVC needs the
stage's output to exist, and skipping it on `data.root` would make the stage depend on the data
section, rerunning it on every change of the data paths. Its output is cached after the first
run (`demo` unchanged), so on real data it costs one generation of the default demo.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from vce.core import runner


@runner.stage
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog=runner.module_prog(__spec__), description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--params", default="params.yaml", help="the params file")
    parser.add_argument("--out", default="data/demo", help="demo dataset folder written")
    args = parser.parse_args(argv)
    # Heavy imports here, not at the top: `--help` stays fast and numpy-free.
    from vce.core.io import atomic_dir
    from vce.core.params import load_section
    from vce.demo.generate import DemoParams, generate

    cfg = load_section(args.params, "demo", DemoParams)
    out = Path(args.out)
    start = time.perf_counter()
    with atomic_dir(out) as staging:
        summary = generate(staging, cfg)
    print(f"demo: {summary['videos']} videos ({summary['frames']} frames), "
          f"{summary['test_videos']} test videos ({summary['test_frames']} frames) -> {out} "
          f"in {time.perf_counter() - start:.1f} s (read only where data.root / data.test_root point at it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
