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


def _reach_note() -> str:
    """Before a hub download: offline mode when the hub cannot be reached (`vce.model.hub`); the
    words an error then adds."""
    import huggingface_hub.constants as hub

    from vce.model.hub import go_offline_unless_reachable

    if hub.HF_HUB_OFFLINE:
        return " (offline mode: only the local cache is read)"
    if go_offline_unless_reachable():
        return ""
    return f" ({hub.ENDPOINT} cannot be reached: only the local cache is read)"


def _resolve_hub(source: str, cache_dir: str | None) -> tuple[dict, Path]:
    from open_clip.pretrained import download_pretrained_from_hf

    model_id = source[len(HF_HUB_PREFIX):]
    reach = _reach_note()
    files = {}
    for what, filename in (("config", "open_clip_config.json"), ("weights", None)):
        try:
            files[what] = Path(download_pretrained_from_hf(model_id, filename=filename, cache_dir=cache_dir))
        except Exception as err:  # hub errors come in many types; the message is what matters
            wanted = filename or "open_clip_pytorch_model.bin (or .safetensors)"
            raise SourceError(
                f"model.source={source}: cannot fetch {wanted} from the hub{reach} ({err}); without "
                "network use local-dir:PATH with an offline copy (refusing random weights)"
            ) from None
    return _read_json(files["config"], source), files["weights"]


def load_image_weights(tower: nn.Module, weights: Path, source: str) -> None:
    """Load the checkpoint's `visual.*` tensors into `tower`, strictly."""
    from open_clip.factory import load_state_dict

    try:
        state_dict = load_state_dict(str(weights))
    except Exception as err:
        reason = "holds objects other than tensors (loading it could run code)" \
            if "weights_only" in str(err) else " ".join(str(err).split())[:300]
        raise SourceError(f"model.source={source}: cannot read weights {weights}: {reason}") from None
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


# ----------------------------------------------------------------------------- timm: sources
#
# ``timm:local-dir:PATH`` / ``timm:hf-hub:ORG/NAME``: any timm image model, in timm's own hub
# layout: `config.json` ({"architecture": timm model name, "num_classes", optional
# "model_args", "pretrained_cfg": {input_size, mean, std, interpolation}}) beside
# `model.safetensors` (or `pytorch_model.bin`). E.g. timm:hf-hub:timm/vit_large_patch14_dinov2.lvd142m
# (DINOv2 ViT-L/14 at 518 px). The weights load strictly into the model the config names;
# only the image tower exists (no text tower: the frame model gets no contrastive head).

TIMM_PREFIX = "timm:"
TIMM_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
__all__ += ["TIMM_PREFIX", "TIMM_WEIGHT_FILES", "resolve_timm_source", "load_timm_trunk"]


def _read_timm_config(path: Path, source: str) -> dict:
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise SourceError(f"model.source={source}: cannot read {path}: {err}") from None
    if not isinstance(config, dict) or not isinstance(config.get("architecture"), str):
        raise SourceError(f"model.source={source}: {path} is not a timm config (needs \"architecture\": a timm model name)")
    return config


def _timm_files(source: str, cache_dir: str | None) -> tuple[Path, Path]:
    rest = source[len(TIMM_PREFIX):]
    if rest.startswith(LOCAL_DIR_PREFIX):
        folder = Path(rest[len(LOCAL_DIR_PREFIX):]).expanduser()
        if not folder.is_dir():
            raise SourceError(f"model.source={source}: folder {folder} not found")
        weights = [folder / n for n in TIMM_WEIGHT_FILES if (folder / n).is_file()]
        if not weights:
            raise SourceError(f"model.source={source}: no pretrained weights in {folder}: expected one of "
                              f"{list(TIMM_WEIGHT_FILES)} (refusing to fall back to random weights)")
        return folder / "config.json", weights[0]
    if rest.startswith(HF_HUB_PREFIX):
        from huggingface_hub import hf_hub_download

        repo = rest[len(HF_HUB_PREFIX):]
        reach = _reach_note()
        found, errors = {}, []
        for what, names in (("config", ("config.json",)), ("weights", TIMM_WEIGHT_FILES)):
            for name in names:
                try:
                    found[what] = Path(hf_hub_download(repo, name, cache_dir=cache_dir))
                    break
                except Exception as err:  # hub errors come in many types; the message is what matters
                    errors.append(f"{name}: {err}")
            if what not in found:
                raise SourceError(f"model.source={source}: cannot fetch {' or '.join(names)} from the hub{reach} "
                                  f"({'; '.join(errors)}); without network use timm:local-dir:PATH "
                                  "(refusing random weights)")
        return found["config"], found["weights"]
    raise SourceError(f"model.source={source!r}: must be timm:local-dir:PATH or timm:hf-hub:ORG/NAME")


def resolve_timm_source(source: str, cache_dir: str | None = None) -> tuple[dict, Path]:
    """(config in resolve_source's shape, weights file) of a timm: source; embed_dim is the trunk's width."""
    config_path, weights = _timm_files(source, cache_dir)
    timm_config = _read_timm_config(config_path, source)
    pretrained = timm_config.get("pretrained_cfg", {})
    vision_cfg = {"timm_model_name": timm_config["architecture"], "timm_pool": "", "timm_proj": "linear",
                  "timm_proj_identity": True, "timm_model_args": dict(timm_config.get("model_args", {})),
                  "timm_num_classes": int(timm_config.get("num_classes", pretrained.get("num_classes", 0)))}
    size = pretrained.get("input_size", [3, 224, 224])[-1]
    vision_cfg["image_size"] = int(vision_cfg["timm_model_args"].get("img_size", size))
    preprocess = {k: pretrained[k] for k in ("mean", "std", "interpolation") if k in pretrained}
    return {"model_cfg": {"embed_dim": None, "vision_cfg": vision_cfg}, "preprocess_cfg": preprocess}, weights


def load_timm_trunk(vision_cfg: dict, weights: Path, source: str) -> nn.Module:
    """The named timm model with the checkpoint loaded strictly, classifier then removed."""
    import timm
    import torch

    try:
        trunk = timm.create_model(vision_cfg["timm_model_name"], pretrained=False,
                                  num_classes=vision_cfg["timm_num_classes"], **vision_cfg["timm_model_args"])
    except Exception as err:  # unknown name, bad model_args
        raise SourceError(f"model.source={source}: timm cannot build {vision_cfg['timm_model_name']!r} "
                          f"with {vision_cfg['timm_model_args']}: {err}") from None
    try:
        if weights.suffix == ".safetensors":
            from safetensors.torch import load_file

            state_dict = load_file(str(weights))
        else:
            state_dict = torch.load(weights, map_location="cpu", weights_only=True)
    except Exception as err:
        reason = "holds objects other than tensors (loading it could run code)" \
            if "weights_only" in str(err) else " ".join(str(err).split())[:300]
        raise SourceError(f"model.source={source}: cannot read weights {weights}: {reason}") from None
    try:
        trunk.load_state_dict(state_dict, strict=True)
    except RuntimeError as err:  # missing / unexpected keys or shape mismatches, all listed
        raise SourceError(f"model.source={source}: {weights} does not fit {vision_cfg['timm_model_name']} "
                          f"as config.json describes it: {' '.join(str(err).split())}") from None
    trunk.reset_classifier(0)
    return trunk
