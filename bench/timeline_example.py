"""Regenerate `docs/timeline_example.png`: one video's event timeline, drawn by the report stage.

Runs the report stage on the pipeline's current outputs (the paths dvc.yaml gives it), into a
scratch folder with `report.videos` set to the one video, and copies its timeline: the same
bytes as `plots/timelines/<set>_<video>.png` of a `dvc repro` with the same params.

    python -m bench.timeline_example [--set test] [--video ukdd_navi_00051] [--out docs/timeline_example.png]

The default is the demo's test video 00051, whose mouth row shows a TP under the FP candidates
stacked on the same span (drawn on top since the fix).
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from vce.core.io import safe_file_name

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", default="test", help="validation | test")
    parser.add_argument("--video", default="ukdd_navi_00051", help="the video id")
    parser.add_argument("--out", default="docs/timeline_example.png", help="where the PNG goes")
    parser.add_argument("--params", default="params.yaml", help="the pipeline's params")
    args = parser.parse_args(argv)
    command = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]["report"]["cmd"]
    with tempfile.TemporaryDirectory(prefix="vce_timeline_") as tmp:
        tmp = Path(tmp)
        params = yaml.safe_load(Path(args.params).read_text())
        params["report"]["videos"] = [args.video]
        (tmp / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        argv_report = shlex.split(command)[1:] + ["--params", str(tmp / "params.yaml"), "--plots-dir", str(tmp / "plots"),
                                                   "--report", str(tmp / "report.md"), "--viewer-dir", str(tmp / "viewer")]
        subprocess.run([sys.executable, *argv_report], check=True, cwd=ROOT)
        png = tmp / "plots" / "timelines" / f"{args.set}_{safe_file_name(args.video)}.png"
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(png, args.out)
    print(f"wrote {args.out} ({args.set} video {args.video})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
