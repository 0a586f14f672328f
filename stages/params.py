"""Stage `params`: the whole of `params.yaml` checked at once, first in the graph.

Every section is read by its model, then the rules that tie sections together are checked. Every
other stage depends on this stage's output, so DVC runs it before them: a bad value anywhere
(`dvc exp run -S events.median_window=4` beside a training change) exits 2 naming the key within
seconds, before any stage does heavy work. The output, `metrics/params_check.json`, lists the
sections checked and does not change with their values, so a valid change reruns only the stages
that read it. Each stage still validates its own sections when it runs (by hand too).

The section models live beside the code that uses them (`vce.train.trainer.TrainParams` …) and
are imported by name when the check runs: `--help` stays light.

It also writes `metrics/thresholds_reads.json` (beside `--out`), the one dependency DVC cannot state in
dvc.yaml: the thresholds stage reads the `events` section only with `thresholds.method: map`
(the search's starting point). The file holds that section under `map` and only the method
otherwise, and the thresholds stage depends on it instead of on `events`: an `events` change
reruns thresholds under `map`, and under `f1` / `engine` only the stages after it (a
post-processing sweep on a machine without the frames, README "Train on one machine").
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from vce.core import runner
from vce.core.params import SECTIONS, ParamsError, from_dict, load_params

# section -> "module:Model" that reads it.
SECTION_MODELS = {
    "base": "vce.core.params:BaseParams",
    "demo": "vce.demo.generate:DemoParams",
    "data": "vce.data.index:DataParams",
    "split": "vce.data.split:SplitParams",
    "cache": "vce.data.frame_cache:CacheParams",
    "model": "vce.model.frame_model:ModelParams",
    "loss": "vce.train.losses:LossParams",
    "prompts": "vce.model.prompts:PromptParams",
    "train": "vce.train.trainer:TrainParams",
    "predict": "vce.infer.predict:PredictParams",
    "ensemble": "vce.infer.ensemble:EnsembleParams",
    "temporal": "vce.infer.temporal:TemporalParams",
    "post": "vce.core.params:PostParams",
    "thresholds": "vce.post.thresholds:ThresholdParams",
    "events": "vce.post.events:EventParams",
    "report": "vce.eval.report:ReportParams",
    "score": "vce.core.params:ScoreParams",
}


def _model(section: str):
    module, name = SECTION_MODELS[section].split(":")
    return getattr(importlib.import_module(module), name)


# ----------------------------------------------------------------------------- cross-section rules


def _pretrained_learning_rate(p: dict) -> None:
    """A pretrained backbone is not trained at a from-scratch rate unless asked for."""
    from vce.train.trainer import check_learning_rates

    check_learning_rates(p["train"], p["model"].source)


def _diff_attention_fits_the_backbone(p: dict) -> None:
    """Differential attention replaces ViT attention: a timm CNN has none (model.diff_attention: false)."""
    from vce.model.frame_model import check_diff_attention

    check_diff_attention(p["model"])


def _temporal_needs_embeddings(p: dict) -> None:
    """The temporal route learns from the validation videos' frame embeddings, cross-fitted over
    them (`vce.infer.temporal_fit`): it needs the embeddings, and more than one explicit
    validation video. (`auto` falls back to the frame model instead, recorded in metrics/route.json.)"""
    if p["post"].probs != "temporal":
        return
    if not p["predict"].embeddings:
        raise ParamsError("post.probs = 'temporal' needs predict.embeddings: true (the temporal model reads "
                          "the frame embeddings)")
    if p["split"].n_folds == 1 and len(p["split"].val_videos) == 1:
        raise ParamsError(f"post.probs = 'temporal' with one validation video (split.val_videos = "
                          f"{list(p['split'].val_videos)}): its temporal probabilities cannot be cross-fitted; "
                          "use post.probs: auto or frame")


def _draws_fill_a_batch(p: dict) -> None:
    """An epoch of `samples_per_epoch` weighted draws holds at least one batch."""
    draws, batch = p["train"].samples_per_epoch, p["train"].batch_size
    if 0 < draws < batch:
        raise ParamsError(f"train.samples_per_epoch = {draws}: fewer than one batch (train.batch_size = {batch})")


CROSS_RULES = (_pretrained_learning_rate, _diff_attention_fits_the_backbone, _temporal_needs_embeddings,
               _draws_fill_a_batch)


def validate_params(path: str | Path = "params.yaml") -> dict:
    """Every section of `path` as its validated model, after the cross-section rules; else ParamsError."""
    params = load_params(path)
    checked = {section: from_dict(_model(section), params[section], section) for section in SECTIONS}
    for rule in CROSS_RULES:
        rule(checked)
    return checked


def thresholds_reads(checked: dict) -> dict:
    """What the thresholds stage reads of `events`: the whole section under method map, else nothing."""
    from vce.post.decoder import FIT_READS_EVENTS

    method = checked["thresholds"].method
    if method not in FIT_READS_EVENTS:
        return {"method": method, "events": None}
    return {"method": method, "events": checked["events"].model_dump(mode="json")}


@runner.stage
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog=runner.module_prog(__spec__), description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--params", default="params.yaml", help="the params file")
    parser.add_argument("--out", default="metrics/params_check.json", help="what was checked (constant content)")
    parser.add_argument("--thresholds-reads", default=None,
                        help="the events params the thresholds stage reads (method map), else only the method "
                             "(None: thresholds_reads.json beside --out)")
    args = parser.parse_args(argv)
    from vce.core.io import write_json

    checked = validate_params(args.params)
    reads = args.thresholds_reads or Path(args.out).with_name("thresholds_reads.json")
    write_json(args.out, {"sections": list(checked), "cross_rules": [rule.__name__.strip("_") for rule in CROSS_RULES]})
    write_json(reads, thresholds_reads(checked))
    print(f"params: {len(checked)} sections and {len(CROSS_RULES)} cross-section rules of {args.params} hold -> {args.out}, {reads}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
