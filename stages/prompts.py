"""Stage `prompts`: embed every label's prompt templates once with the source's text tower.

Writes {"labels", "templates", "embeddings" (17, T, D), "source"} to `--out` (readable with
`torch.load(..., weights_only=True)`), so training and prediction never load the text tower.
"""

from __future__ import annotations

import argparse
import sys
import time

from vce.core import runner
from vce.core.params import BaseParams, from_dict, load_params


def parse_args(argv):
    parser = argparse.ArgumentParser(prog=runner.module_prog(__spec__), description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--params", default="params.yaml", help="the params file")
    parser.add_argument("--out", default="models/prompt_embeddings.pt", help="prompt embeddings file written")
    return parser.parse_args(argv)


@runner.stage
def main(argv=None) -> int:
    args = parse_args(argv)
    began = time.perf_counter()
    # Heavy imports here, not at the top: `--help` stays fast and torch-free.
    import torch

    from vce.model.frame_model import ModelParams
    from vce.model.prompts import (
        PromptParams,
        compute_prompt_embeddings,
        save_prompt_embeddings,
    )
    params = load_params(args.params)
    model_params = from_dict(ModelParams, params["model"], "model")
    prompt_params = from_dict(PromptParams, params["prompts"], "prompts")
    torch.manual_seed(from_dict(BaseParams, params["base"], "base").seed)  # the random text tower of tiny / random sources
    embeddings = compute_prompt_embeddings(model_params, prompt_params.templates)
    save_prompt_embeddings(args.out, embeddings, prompt_params.templates, model_params.source)
    print(f"prompts: embeddings {tuple(embeddings.shape)} from {model_params.source}, "
          f"{time.perf_counter() - began:.1f} s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
