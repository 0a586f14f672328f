"""Stage `demo_data`: generate the embedded demo dataset in the real Galar and test layouts.

    python stages/demo_data.py [--params params.yaml] [--out data/demo]

Reads the `demo` section. Replaces `--out` whole (a half-written demo never survives): the demo
is generated beside it and renamed into place. Same seed, same bytes.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from vce.core import runner


@runner.stage
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--params", default="params.yaml", help="the params file")
    parser.add_argument("--out", default="data/demo", help="demo dataset folder written")
    args = parser.parse_args(argv)
    # Heavy imports here, not at the top: `--help` stays fast and numpy-free.
    from vce.core.params import load_section
    from vce.demo.generate import DemoParams, generate

    cfg = load_section(args.params, "demo", DemoParams)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        summary = generate(staging, cfg)
        staging.chmod(0o755)  # mkdtemp makes it private; the demo is ordinary data
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"demo: {summary['videos']} videos ({summary['frames']} frames), "
          f"{summary['test_videos']} test videos ({summary['test_frames']} frames) -> {out} "
          f"in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
