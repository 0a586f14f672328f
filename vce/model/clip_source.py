"""Where a model's architecture config and weights come from: one resolver for every source.

- ``tiny``: configs/tiny.json (registered timm ViT `vce_vit_tiny_patch8_64`, tiny text
  transformer), random init.
- ``random``: configs/biomedclip.json (a copy of BiomedCLIP's open_clip config), random init.
- ``hf-hub:ORG/NAME``: `open_clip_config.json` + `open_clip_pytorch_model.bin` (or .safetensors)
  through open_clip's hub download (huggingface_hub cache, offline mode honoured).
- ``local-dir:PATH``: the same two files in a folder (an offline copy of the hub repository).

Pretrained sources return their weights file or raise `SourceError` naming the source, the path
and the missing file: nothing here ever falls back to random weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch.nn as nn
from timm.models import build_model_with_cfg, register_model
from timm.models.vision_transformer import VisionTransformer

from vce.core.errors import DataError

# Explicit: timm's register_model (below) appends the tiny ViT's name to a module's __all__.
__all__ = [
    "SourceError", "resolve_source", "load_image_weights", "preprocess_config",
    "PACKAGED_SOURCES", "HF_HUB_PREFIX", "LOCAL_DIR_PREFIX", "LOCAL_WEIGHT_FILES",
]

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
PACKAGED_SOURCES = {"tiny": CONFIG_DIR / "tiny.json", "random": CONFIG_DIR / "biomedclip.json"}
HF_HUB_PREFIX = "hf-hub:"
LOCAL_DIR_PREFIX = "local-dir:"
# open_clip's own weight file names, in its order of preference (open_clip.factory); other
# *.bin files in such a folder (e.g. PubMedBERT's pytorch_model.bin) are not CLIP weights.
LOCAL_WEIGHT_FILES = (
    "open_clip_model.safetensors",
    "open_clip_pytorch_model.safetensors",
    "open_clip_pytorch_model.bin",
    "open_clip_pytorch_model.pth",
)


class SourceError(DataError):
    """`model.source` names weights or a config that cannot be loaded."""


@register_model
def vce_vit_tiny_patch8_64(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """Demo-size ViT for the `tiny` source (CPU tests and the demo pipeline)."""
    args = dict(img_size=64, patch_size=8, embed_dim=64, depth=4, num_heads=4)
    if kwargs.get("pretrained_cfg") is None:  # timm passes None: no hub weights exist for it
        kwargs["pretrained_cfg"] = dict(input_size=(3, 64, 64), num_classes=0)
    return build_model_with_cfg(
        VisionTransformer, "vce_vit_tiny_patch8_64", pretrained=pretrained, **dict(args, **kwargs)
    )


def _read_json(path: Path, source: str) -> dict:
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise SourceError(f"model.source={source}: cannot read {path}: {err}") from None
    if "model_cfg" not in config or "timm_model_name" not in config["model_cfg"].get("vision_cfg", {}):
        raise SourceError(
            f"model.source={source}: {path} is not an open_clip config with a timm image tower "
            "(needs model_cfg.vision_cfg.timm_model_name)"
        )
    return config


def resolve_source(source: str, cache_dir: str | None = None) -> tuple[dict, Path | None]:
    """(open_clip config {model_cfg, preprocess_cfg}, weights file or None for random init)."""
    if source in PACKAGED_SOURCES:
        return _read_json(PACKAGED_SOURCES[source], source), None
    if source.startswith(LOCAL_DIR_PREFIX):
        folder = Path(source[len(LOCAL_DIR_PREFIX):]).expanduser()
        if not folder.is_dir():
            raise SourceError(f"model.source={source}: folder {folder} not found")
        config = _read_json(folder / "open_clip_config.json", source)
        weights = [folder / n for n in LOCAL_WEIGHT_FILES if (folder / n).is_file()]
        if not weights:
            raise SourceError(
                f"model.source={source}: no pretrained weights in {folder}: expected one of "
                f"{list(LOCAL_WEIGHT_FILES)} (refusing to fall back to random weights)"
            )
        return config, weights[0]
    if source.startswith(HF_HUB_PREFIX):
        return _resolve_hub(source, cache_dir)
    raise SourceError(f"model.source={source!r}: unknown source")


def _resolve_hub(source: str, cache_dir: str | None) -> tuple[dict, Path]:
    from open_clip.pretrained import download_pretrained_from_hf

    model_id = source[len(HF_HUB_PREFIX):]
    files = {}
    for what, filename in (("config", "open_clip_config.json"), ("weights", None)):
        try:
            files[what] = Path(download_pretrained_from_hf(model_id, filename=filename, cache_dir=cache_dir))
        except Exception as err:  # hub errors come in many types; the message is what matters
            wanted = filename or "open_clip_pytorch_model.bin (or .safetensors)"
            raise SourceError(
                f"model.source={source}: cannot fetch {wanted} from the hub ({err}); without "
                "network use local-dir:PATH with an offline copy (refusing random weights)"
            ) from None
    return _read_json(files["config"], source), files["weights"]


def load_image_weights(tower: nn.Module, weights: Path, source: str) -> None:
    """Load the checkpoint's `visual.*` tensors into `tower`, strictly."""
    from open_clip.factory import load_state_dict

    try:
        state_dict = load_state_dict(str(weights))
    except Exception as err:
        raise SourceError(f"model.source={source}: cannot read weights {weights}: {err}") from None
    visual = {k[len("visual."):]: v for k, v in state_dict.items() if k.startswith("visual.")}
    if not visual:
        raise SourceError(f"model.source={source}: {weights} holds no visual.* (image tower) weights")
    try:
        tower.load_state_dict(visual, strict=True)
    except RuntimeError as err:  # missing / unexpected keys or shape mismatches, all listed
        raise SourceError(
            f"model.source={source}: {weights} does not fit the image tower of its config: {err}"
        ) from None


def preprocess_config(config: dict) -> dict:
    """image_size, mean, std, interpolation: the checkpoint's preprocess_cfg over open_clip's defaults."""
    # open_clip's PreprocessCfg defaults (OpenAI CLIP mean/std, bicubic), for configs that omit them.
    defaults = {"mean": (0.48145466, 0.4578275, 0.40821073),
                "std": (0.26862954, 0.26130258, 0.27577711), "interpolation": "bicubic"}
    merged = {**defaults, **config.get("preprocess_cfg", {})}
    size = config["model_cfg"]["vision_cfg"].get("image_size", 224)
    return {"image_size": int(size if isinstance(size, int) else size[0]),
            "mean": [float(v) for v in merged["mean"]], "std": [float(v) for v in merged["std"]],
            "interpolation": merged["interpolation"]}
