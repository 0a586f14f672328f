"""Stage `embed`: a frozen backbone's frame features, computed once per frame (`train.freeze_backbone`).

With `train.freeze_backbone: false` (the default: fine-tuning) it writes a folder that says so and
nothing else (its params are checked all the same). With `true` it builds the image tower exactly as the train stage does (same
`model` params and `base.seed`) and streams every labelled frame (`labelled.parquet`, all folds)
and the test set (`test.parquet`: data.test_root and the videos split.test_videos holds out)
through it, with predict's data path and settings. Train then fits the heads on these features
and predict applies them to the same ones, so sweeping a head or training key reruns neither
this stage nor the backbone (dvc.yaml lists only the params the tower depends on). Layout and
checks: vce/data/features.py.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from vce.core import runner
from vce.core.params import BaseParams, from_dict, load_params


def parse_args(argv):
    parser = argparse.ArgumentParser(prog=runner.module_prog(__spec__), description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--params", default="params.yaml", help="the params file")
    parser.add_argument("--frames", default="data/split/frames.parquet", help="labelled frame index (every fold)")
    parser.add_argument("--test", default="data/index/test.parquet", help="unlabelled test frame index")
    parser.add_argument("--held-out", default="data/split/test.parquet",
                        help="labelled test videos held out by split.test_videos")
    parser.add_argument("--cache", default="data/cache", help="decoded-frame cache (used when enabled)")
    parser.add_argument("--out", default="data/embed", help="features folder written")
    return parser.parse_args(argv)


def test_rows(args, data):
    """The test set as predict_test sees it: the test index (under data.test_root) and the held-out
    labelled videos (under data.root), paths joined to their roots."""
    from vce.core.contracts import all_test_frames, read_index
    from vce.core.errors import DataError

    test = read_index(args.test)
    if len(test) and data.test_root is None:
        raise DataError(f"{args.test} has frames but data.test_root is null")
    held = read_index(args.held_out) if args.held_out else None
    if held is None or not len(held):
        return test, data.test_root or "."
    return all_test_frames(test.assign(path=[str(Path(data.test_root or ".") / p) for p in test["path"]]),
                           held.assign(path=[str(Path(data.root) / p) for p in held["path"]])), "."


@runner.stage
def main(argv=None) -> int:
    args = parse_args(argv)
    began = time.perf_counter()
    from vce.data.features import write_disabled
    from vce.data.index import DataParams
    from vce.infer.predict import PredictParams
    from vce.model.frame_model import ModelParams
    from vce.train.trainer import TrainParams

    # Every section it reads is checked first, whether or not the backbone is frozen.
    params = load_params(args.params)
    train_params = from_dict(TrainParams, params["train"], "train")
    seed = from_dict(BaseParams, params["base"], "base").seed
    data = from_dict(DataParams, params["data"], "data")
    model_params = from_dict(ModelParams, params["model"], "model")
    predict_params = from_dict(PredictParams, params["predict"], "predict")
    if not train_params.freeze_backbone:
        write_disabled(args.out)
        print(f"embed: train.freeze_backbone is false (fine-tuning): {args.out}/meta.json says so")
        return 0
    # Heavy imports here, not at the top: `--help` stays fast.
    import torch

    from vce.core.contracts import read_index
    from vce.core.io import write_json
    from vce.data.features import backbone_fingerprint
    from vce.data.frame_cache import FrameCache
    from vce.infer.embed import embed_frames
    from vce.model.device import resolve_device, setup_distributed
    from vce.model.frame_model import create_model

    device = resolve_device(predict_params.device)
    ddp = setup_distributed(device)
    torch.manual_seed(seed)  # the train stage's initial model: the same tower (its fingerprint is checked there)
    model = create_model(model_params).to(device).eval()
    cache = FrameCache.open(args.cache)
    out = Path(args.out)
    jobs = [("labelled", read_index(args.frames), data.root), ("test", *test_rows(args, data))]
    report = {}
    for part, rows, root in jobs:
        report[part] = embed_frames(model, rows, root or ".", out / f"{part}.parquet", predict_params, device,
                                    cache=cache, max_pixels=data.max_frame_pixels, desc=f"embed {part}",
                                    is_main=ddp.is_main)
    if ddp.is_main:
        write_json(out / "meta.json", {
            "enabled": True, "source": model_params.source, "backbone": backbone_fingerprint(model.visual),
            "embed_dim": int(model.arch_config["embed_dim"]),
            **{part: {"frames": r["frames"], "invalid_frames": r["invalid_frames"]} for part, r in report.items()}})
        counts = ", ".join(f"{part} {r['frames']}" for part, r in report.items())
        print(f"embed: {counts} frames through {model_params.source}, {time.perf_counter() - began:.0f} s -> {out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
