"""Stage `predict`: stream frames through the trained model into probabilities Parquet.

Writes `val.parquet` (validation videos), `test.parquet` (the unlabelled test set, possibly
empty) and, with `predict.embeddings`, `<split>_embeddings.parquet` for each predicted split,
plus a small JSON report of counts and undecodable frames.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vce.core import runner
from vce.core.contracts import read_index
from vce.core.errors import DataError
from vce.core.io import write_json
from vce.core.params import from_dict, load_params
from vce.data.frame_cache import FrameCache
from vce.data.index import DataParams
from vce.infer.predict import PredictParams, predict_sharded
from vce.model import checkpoint
from vce.model.device import resolve_device, setup_distributed


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--model", default="models/model.pt")
    parser.add_argument("--frames", default="data/split/frames.parquet", help="labelled frame index with split")
    parser.add_argument("--test", default="data/index/test.parquet", help="unlabelled test frame index")
    parser.add_argument("--cache", default="data/cache", help="decoded-frame cache (used when enabled)")
    parser.add_argument("--out-dir", default="data/predict")
    parser.add_argument("--report", default="metrics/predict.json")
    return parser.parse_args(argv)


@runner.stage
def main(argv=None) -> int:
    args = parse_args(argv)
    params = load_params(args.params)
    data = from_dict(DataParams, params["data"], "data")
    predict_params = from_dict(PredictParams, params["predict"], "predict")
    frames = read_index(args.frames)
    test = read_index(args.test)
    device = resolve_device(predict_params.device)
    ddp = setup_distributed(device)
    model, _ = checkpoint.load_model(args.model, device)
    cache = FrameCache.open(args.cache)
    out = Path(args.out_dir)
    jobs = [(split, frames[frames["split"] == split], data.root) for split in sorted(set(predict_params.splits) | {"val"})]
    jobs.append(("test", test, data.test_root))
    report = {}
    for split, rows, root in jobs:
        if len(rows) and root is None:
            raise DataError(f"{args.test} has frames but data.test_root is null")
        embeddings = out / f"{split}_embeddings.parquet" if predict_params.embeddings else None
        report[split] = predict_sharded(model, rows, root or ".", out / f"{split}.parquet", predict_params,
                                        device, embeddings, desc=f"predict {split}", cache=cache)
        if report[split]["invalid_frames"]:
            print(f"warning: {report[split]['invalid_frames']} undecodable frame(s) in {split}, "
                  f"e.g. {report[split]['invalid_examples'][0]} (rows kept with valid=false)", file=sys.stderr)
    if ddp.is_main:
        write_json(args.report, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
