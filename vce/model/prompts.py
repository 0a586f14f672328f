"""Label prompt embeddings: the text tower runs once here, training and prediction read a tensor.

For each label and template ("a video capsule endoscopy image showing {label}") the text
tower of the source's CLIP gives one embedding: a (17, T, D) tensor, saved with the labels and
templates in a file that `torch.load(..., weights_only=True)` reads (plain data and tensors).

Text tower per source:
- ``tiny``: open_clip's CLIP built from configs/tiny.json (tiny text transformer, random
  init under the caller's seed) with open_clip's shipped BPE tokenizer.
- ``hf-hub:…``: `open_clip.create_model` / `open_clip.get_tokenizer` on the hub id (PubMedBERT
  config and tokenizer come from the hub).
- ``local-dir:PATH``: the same on the folder; for an HF text tower (BiomedCLIP) the folder also
  holds the text model's `config.json` (PubMedBERT's) and tokenizer files (`vocab.txt`,
  `tokenizer_config.json`, …), which replace the hub names in the config so nothing is fetched.
- ``random``: BiomedCLIP's text tower cannot be built offline (its PubMedBERT config lives on the
  hub), and a random-init tower gives arbitrary vectors anyway: seeded Gaussian vectors.
Pretrained sources must load their weights (`require_pretrained`); there is no random fallback.
"""

from __future__ import annotations

from pathlib import Path

import torch
from pydantic import Field, model_validator

from vce.core.errors import DataError
from vce.core.io import atomic_path
from vce.core.labels import LABELS
from vce.core.params import Section
from vce.model.clip_source import LOCAL_DIR_PREFIX, TIMM_PREFIX, SourceError, resolve_source
from vce.model.frame_model import ModelParams

DEFAULT_TEMPLATES = ["a video capsule endoscopy image showing {label}"]
# Files the text tower of an HF-text local-dir copy needs besides open_clip_config.json + weights.
HF_TEXT_FILES = ("config.json", "vocab.txt", "tokenizer_config.json")


class PromptParams(Section):
    """`prompts`: label prompt templates for the text tower."""

    templates: list[str] = Field(min_length=1)

    @model_validator(mode="after")
    def _placeholders(self):
        for i, template in enumerate(self.templates):
            self.require("{label}" in template, f"templates.{i}", "has no {label} placeholder")
        return self


def prompt_texts(templates: list[str]) -> list[str]:
    """17·T texts, label-major: texts[l·T + t] = templates[t] with label l."""
    return [template.format(label=label) for label in LABELS for template in templates]


def _text_model(params: ModelParams):
    """(open_clip CLIP with its text tower, tokenizer) for a tiny or pretrained source."""
    import open_clip

    config, weights = resolve_source(params.source, params.cache_dir)  # errors if weights missing
    model_cfg = config["model_cfg"]
    if weights is None:  # tiny: open_clip's CLIP from our config dict, random init
        tokenizer = open_clip.SimpleTokenizer(context_length=model_cfg["text_cfg"]["context_length"])
        return open_clip.CLIP(**model_cfg), tokenizer
    overrides = {}
    text_cfg = dict(model_cfg.get("text_cfg", {}))
    if params.source.startswith(LOCAL_DIR_PREFIX) and "hf_model_name" in text_cfg:
        folder = weights.parent
        missing = [n for n in HF_TEXT_FILES if not (folder / n).is_file()]
        if missing:
            raise SourceError(
                f"model.source={params.source}: the text tower ({text_cfg['hf_model_name']}) needs "
                f"{missing} in {folder} (its config.json and tokenizer files)"
            )
        # open_clip's own hf_model_pretrained=False is lost when text_cfg is overridden: the
        # text weights come from the CLIP checkpoint (require_pretrained), never from the hub.
        text_cfg.update(hf_model_name=str(folder), hf_tokenizer_name=str(folder),
                        hf_model_pretrained=False)
        overrides["text_cfg"] = text_cfg
    try:
        model = open_clip.create_model(params.source, require_pretrained=True,
                                       cache_dir=params.cache_dir, **overrides)
        tokenizer = open_clip.get_tokenizer(params.source, cache_dir=params.cache_dir)
    except Exception as err:  # open_clip / transformers / hub raise many types
        raise SourceError(f"model.source={params.source}: cannot build the text tower: {err}") from None
    return model, tokenizer


@torch.no_grad()
def compute_prompt_embeddings(params: ModelParams, templates: list[str]) -> torch.Tensor:
    """(17, T, D) text embeddings (not normalised) of every label × template."""
    if params.source == "random" or params.source.startswith(TIMM_PREFIX):  # timm: no text tower, unused
        config, _ = resolve_source("random")
        dim = config["model_cfg"]["embed_dim"]
        return torch.randn(len(LABELS), len(templates), dim, dtype=torch.float64).float()
    # Built and run in float64, rounded to float32 at the end: the same bytes on every CPU. In
    # float32, the random init (torch's vectorised normal_) and the matmuls differ in the last
    # bits with the CPU's instruction set (AVX-512 / AVX2 / none): 1,057 of 1,088 values here.
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        model, tokenizer = _text_model(params)
    finally:
        torch.set_default_dtype(default_dtype)
    model.double().eval()
    tokens = tokenizer(prompt_texts(templates))
    features = model.encode_text(tokens).float()  # (17·T, D)
    return features.reshape(len(LABELS), len(templates), -1)


def save_prompt_embeddings(path, embeddings: torch.Tensor, templates: list[str], source: str) -> None:
    payload = {"labels": list(LABELS), "templates": list(templates),
               "embeddings": embeddings.detach().cpu().float().contiguous(), "source": source}
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        torch.save(payload, f)  # a file object: the archive's inner name does not follow tmp's


def load_prompt_embeddings(path) -> torch.Tensor | None:
    """The (17, T, D) tensor of a prompts file (None when `path` is None), labels checked."""
    if path is None:
        return None
    path = Path(path)
    if not path.is_file():
        raise DataError(f"prompt embeddings file {path} not found (run the prompts stage)")
    from vce.model.checkpoint import load  # weights_only=True; a pickle holding code is one line

    payload = load(path)
    if not {"labels", "embeddings"} <= set(payload):
        raise DataError(f"{path}: expected a dict with 'labels' and 'embeddings'")
    if list(payload["labels"]) != list(LABELS):
        raise DataError(
            f"{path}: labels {payload['labels']} differ from the 17 challenge labels {list(LABELS)}"
        )
    embeddings = payload["embeddings"]
    if not isinstance(embeddings, torch.Tensor) or embeddings.dim() not in (2, 3) \
            or embeddings.shape[0] != len(LABELS):
        shape = tuple(getattr(embeddings, "shape", ()))
        raise DataError(f"{path}: embeddings of shape {shape}, expected (17, T, D) or (17, D)")
    return embeddings.float()
