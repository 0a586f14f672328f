"""The frame model: BiomedCLIP's image tower with differential attention, and two heads.

One factory, `create_model(params)`, builds the model for every `model.source` (tiny, random,
hf-hub:…, local-dir:…; where configs and weights come from: vce/model/clip_source.py). `tiny` is the
same code path at demo size (timm ViT 64 px, patch 8, width 64, 4 blocks, 4 heads: one CPU
training step at batch 64 runs at roughly 800 frames/s on 2 cores).

Only the image tower is built and loaded (the `visual.*` weights of the checkpoint): the text
tower is used once, by the prompts stage, and its embeddings arrive here as a tensor. Asking for
pretrained weights that cannot be loaded raises `SourceError`; there is no random fallback.

The image tower (`ImageTower`) is open_clip's `TimmModel` rebuilt from timm alone with the same
state_dict keys, so open_clip checkpoints load strictly and a GPU box with torch + timm but no
open_clip can build and benchmark it (bench/model.py).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from copy import deepcopy
from typing import Literal

import timm
import torch
import torch.nn as nn
import torch.nn.functional as F
from pydantic import Field, model_validator

from vce.core.errors import ParamsError
from vce.core.labels import NUM_LABELS
from vce.core.params import Section
from vce.model.clip_source import (
    HF_HUB_PREFIX,
    LOCAL_DIR_PREFIX,
    PACKAGED_SOURCES,
    TIMM_PREFIX,
    SourceError,
    load_image_weights,
    load_timm_trunk,
    preprocess_config,
    resolve_source,
    resolve_timm_source,
)
from vce.model.diff_attention import convert_to_diff_attention, unconvertible

__all__ = [
    "ModelParams", "SourceError", "ImageTower", "Excitation", "VCEModel",
    "create_model", "build_from_config", "check_diff_attention",
]


class ModelParams(Section):
    """`model`: the image model, one factory for every source."""

    source: str
    diff_attention: bool
    diff_init: Literal["neutral", "preserving"]
    dropout: float = Field(ge=0, lt=1)
    # frame_probs: "mean" = average of classifier and contrastive sigmoid probabilities (the
    # project's choice; the seed's report does not say how it combined them), "cls" or "con" alone.
    fusion: Literal["mean", "cls", "con"]
    excitation_reduction: int = Field(ge=1)
    con_scale_init: float = Field(gt=0)
    con_bias_init: float
    cache_dir: str | None

    @model_validator(mode="after")
    def _known_source(self):
        prefixed = self.source.startswith((HF_HUB_PREFIX, LOCAL_DIR_PREFIX))
        timm_source = self.source.startswith(TIMM_PREFIX)
        self.require(self.source in PACKAGED_SOURCES or prefixed or timm_source, "source",
                     "must be tiny, random, hf-hub:ORG/NAME, local-dir:PATH, timm:hf-hub:ORG/NAME or timm:local-dir:PATH")
        inner = self.source[len(TIMM_PREFIX):] if timm_source else self.source
        self.require(not timm_source or inner.startswith((HF_HUB_PREFIX, LOCAL_DIR_PREFIX)), "source",
                     "a timm source is timm:hf-hub:ORG/NAME or timm:local-dir:PATH")
        self.require(inner not in (HF_HUB_PREFIX, LOCAL_DIR_PREFIX), "source",
                     "empty name after the prefix")
        self.require(not (timm_source and self.fusion == "con"), "fusion",
                     "con needs a text tower; timm: sources have none (use cls or mean: the classifier)")
        return self


class ImageTower(nn.Module):
    """open_clip's TimmModel (timm trunk → head.drop → head.proj), built from timm alone.

    Supports what BiomedCLIP uses: timm_pool '' (the trunk's own pooling: class token),
    'token' or 'avg', and timm_proj 'linear'. Module names and state_dict keys match
    `open_clip.timm_model.TimmModel`, so a checkpoint's `visual.*` weights load strictly.
    """

    def __init__(self, vision_cfg: dict, embed_dim: int, trunk: nn.Module | None = None):
        super().__init__()
        pool = vision_cfg.get("timm_pool", "avg")
        proj = vision_cfg.get("timm_proj", "linear")
        if proj != "linear" or pool not in ("", "token", "avg"):
            raise SourceError(
                f"image tower: timm_pool={pool!r}, timm_proj={proj!r} unsupported "
                "(supported: timm_pool '', 'token' or 'avg' with timm_proj 'linear')"
            )
        trunk_kwargs = {}
        if vision_cfg.get("timm_drop_path") is not None:
            trunk_kwargs["drop_path_rate"] = vision_cfg["timm_drop_path"]
        if vision_cfg.get("patch_dropout", 0.0) > 0:
            trunk_kwargs["patch_drop_rate"] = vision_cfg["patch_dropout"]
        trunk_kwargs.update(vision_cfg.get("timm_model_args", {}))  # timm: sources (config.json model_args)
        if trunk is None:  # else a timm: source's trunk, its checkpoint loaded (load_timm_trunk)
            trunk = timm.create_model(vision_cfg["timm_model_name"], pretrained=False, **trunk_kwargs)
            trunk.reset_classifier(0, **({"global_pool": pool} if pool else {}))
        self.trunk = trunk
        self.head = nn.Sequential(OrderedDict(
            drop=nn.Dropout(vision_cfg.get("timm_drop", 0.0)),
            proj=nn.Linear(self.trunk.num_features, embed_dim,
                           bias=vision_cfg.get("timm_proj_bias", False)),
        ))
        if vision_cfg.get("timm_proj_identity"):  # timm: sources: the pretrained features pass unchanged at init
            nn.init.eye_(self.head.proj.weight)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.trunk(images))  # (B, 3, H, W) -> (B, embed_dim)


class Excitation(nn.Module):
    """Squeeze-and-excitation gating of a feature vector (Hu et al. 2018): x · σ(W₂ ReLU(W₁ x))."""

    def __init__(self, dim: int, reduction: int):
        super().__init__()
        hidden = max(1, dim // reduction)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return features * torch.sigmoid(self.fc2(F.relu(self.fc1(features))))


class VCEModel(nn.Module):
    """Image tower → (excitation → dropout → linear) and (cosine vs label prompts) logits.

    Build with `create_model` (weights from a source) or `build_from_config` (architecture
    only, for loading a checkpoint's state_dict); `arch_config` is the plain dict that rebuilds it.
    """

    def __init__(self, arch: dict, image_tower: ImageTower | None = None):
        super().__init__()
        self._arch = deepcopy(arch)
        embed_dim = arch["embed_dim"]
        self.visual = image_tower or ImageTower(arch["vision_cfg"], embed_dim)
        if arch["diff_attention"]:
            convert_to_diff_attention(self.visual.trunk, arch.get("diff_init", "neutral"))  # older files: neutral
        self.excitation = Excitation(embed_dim, arch["excitation_reduction"])
        self.dropout = nn.Dropout(arch["dropout"])
        self.classifier = nn.Linear(embed_dim, NUM_LABELS)
        self.has_prompts = arch["contrastive"]
        if self.has_prompts:
            # (17, D) unit vectors: frozen (a buffer), but saved with the state_dict.
            self.register_buffer("label_text_embeddings", torch.zeros(NUM_LABELS, embed_dim))
            # Learnable temperature and bias of the sigmoid contrastive logits (SigLIP,
            # Zhai et al. 2023: t' = log 10, b = -10 at init); one bias per label.
            self.con_logit_scale = nn.Parameter(torch.tensor(math.log(arch["con_scale_init"])))
            self.con_logit_bias = nn.Parameter(torch.full((NUM_LABELS,), arch["con_bias_init"]))
        self.preprocess = dict(arch["preprocess"])

    @property
    def arch_config(self) -> dict:
        return deepcopy(self._arch)

    @torch.no_grad()
    def set_prompt_embeddings(self, prompt_embeddings: torch.Tensor) -> None:
        """Store label text embeddings: (17, D) or (17, T, D), T templates averaged (CLIP zero-shot)."""
        if not self.has_prompts:
            raise ValueError("model was built without a contrastive head")
        embeddings = prompt_embeddings.detach().float()
        if embeddings.dim() == 2:
            embeddings = embeddings[:, None]  # (17, 1, D)
        expected = (NUM_LABELS, self._arch["embed_dim"])
        if embeddings.dim() != 3 or (embeddings.shape[0], embeddings.shape[2]) != expected:
            raise ValueError(
                f"prompt embeddings of shape {tuple(prompt_embeddings.shape)} do not fit the model: "
                f"expected ({expected[0]}, T, {expected[1]}) or {expected}"
            )
        per_label = F.normalize(F.normalize(embeddings, dim=-1).mean(dim=1), dim=-1)  # (17, D)
        self.label_text_embeddings.copy_(per_label)

    def forward(self, images: torch.Tensor) -> dict:
        return self.heads(self.visual(images))  # (B, 3, H, W) -> (B, D) -> the heads' outputs

    def heads(self, features: torch.Tensor) -> dict:
        """The heads on the image tower's features (B, D): what a probe trains on cached features."""
        cls_logits = self.classifier(self.dropout(self.excitation(features)))  # (B, 17)
        con_logits = None
        if self.has_prompts:
            scale = self.con_logit_scale.exp().clamp(max=100.0)
            cosine = F.normalize(features, dim=-1) @ self.label_text_embeddings.t()  # (B, 17)
            con_logits = scale * cosine + self.con_logit_bias
        return {"cls_logits": cls_logits, "con_logits": con_logits, "embedding": features}

    def frame_probs(self, outputs: dict) -> torch.Tensor:
        """(B, 17) probabilities, combined per `fusion` (classifier only without prompts)."""
        cls_probs = torch.sigmoid(outputs["cls_logits"].float())
        if outputs.get("con_logits") is None:
            if self._arch["fusion"] == "con":
                raise ParamsError("model.fusion = 'con' needs prompt embeddings (contrastive head)")
            return cls_probs
        con_probs = torch.sigmoid(outputs["con_logits"].float())
        fusion = self._arch["fusion"]
        if fusion == "cls":
            return cls_probs
        if fusion == "con":
            return con_probs
        return 0.5 * (cls_probs + con_probs)

    def param_groups(self, lr_head: float, lr_backbone: float, weight_decay: float) -> list[dict]:
        """AdamW groups: backbone (image tower) vs heads, no decay on norms, biases, λ, scale."""
        # timm ViTs name their 1-token tables (pos_embed, cls_token); a timm CNN has no such method
        trunk_no_decay = getattr(self.visual.trunk, "no_weight_decay", None)
        no_decay_names = {f"visual.trunk.{n}" for n in (trunk_no_decay() if trunk_no_decay else ())}
        groups = {
            (part, decay): [] for part in ("backbone", "head") for decay in (True, False)
        }
        for name, param in self.named_parameters():
            if not param.requires_grad:
                continue
            part = "backbone" if name.startswith("visual.") else "head"
            decay = param.ndim > 1 and name not in no_decay_names
            groups[(part, decay)].append(param)
        lrs = {"backbone": lr_backbone, "head": lr_head}
        return [
            {"name": f"{part}{'' if decay else '_no_decay'}", "params": params,
             "lr": lrs[part], "weight_decay": weight_decay if decay else 0.0}
            for (part, decay), params in groups.items() if params
        ]


def create_model(params: ModelParams, prompt_embeddings: torch.Tensor | None = None) -> VCEModel:
    """Build the frame model from `params.source`; pretrained weights loaded or an error."""
    if params.source.startswith(TIMM_PREFIX):
        return _create_timm_model(params)
    config, weights = resolve_source(params.source, params.cache_dir)
    model_cfg = config["model_cfg"]
    arch = {
        "source": params.source,
        "vision_cfg": deepcopy(model_cfg["vision_cfg"]),
        "embed_dim": int(model_cfg["embed_dim"]),
        "preprocess": preprocess_config(config),
        **{k: v for k, v in params.model_dump().items() if k not in ("source", "cache_dir")},
        "contrastive": prompt_embeddings is not None,
    }
    tower = ImageTower(arch["vision_cfg"], arch["embed_dim"])
    if weights is not None:
        load_image_weights(tower, weights, params.source)  # before the differential conversion
    model = VCEModel(arch, image_tower=tower)
    if prompt_embeddings is not None:
        model.set_prompt_embeddings(prompt_embeddings)
    return model


def _create_timm_model(params: ModelParams) -> VCEModel:
    """A timm: source: its trunk (checkpoint loaded strictly), the same heads, no contrastive head.

    The projection is square (the trunk's width) and starts as the identity. There is no text
    tower, so prompt embeddings are not used and frame probabilities are the classifier's.
    """
    config, weights = resolve_timm_source(params.source, params.cache_dir)
    vision_cfg = config["model_cfg"]["vision_cfg"]
    trunk = load_timm_trunk(vision_cfg, weights, params.source)
    _refuse_unconvertible(params, trunk, vision_cfg["timm_model_name"])
    arch = {
        "source": params.source,
        "vision_cfg": deepcopy(vision_cfg),
        "embed_dim": int(trunk.num_features),
        "preprocess": preprocess_config(config),
        **{k: v for k, v in params.model_dump().items() if k not in ("source", "cache_dir")},
        "contrastive": False,
    }
    return VCEModel(arch, image_tower=ImageTower(vision_cfg, arch["embed_dim"], trunk=trunk))


def _refuse_unconvertible(params: ModelParams, trunk: nn.Module, name: str) -> None:
    reason = unconvertible(trunk, params.diff_init) if params.diff_attention else None
    if reason is not None:
        raise ParamsError(f"model.diff_attention: {name} {reason}; set it to false for this model")


def check_diff_attention(params: ModelParams) -> None:
    """The params check's early form of create_model's: `model.diff_attention: true` on a
    timm:local-dir: architecture without ViT attention is a ParamsError, found from config.json
    alone (the trunk built on the meta device: no weights read, no memory). Hub sources and
    folders that cannot be read are left to create_model, which reports them."""
    if not (params.diff_attention and params.source.startswith(TIMM_PREFIX + LOCAL_DIR_PREFIX)):
        return
    try:
        config, _ = resolve_timm_source(params.source)
        vision_cfg = config["model_cfg"]["vision_cfg"]
        with torch.device("meta"):
            trunk = timm.create_model(vision_cfg["timm_model_name"], pretrained=False,
                                      num_classes=vision_cfg["timm_num_classes"], **vision_cfg["timm_model_args"])
    except Exception:  # a missing folder, an unknown architecture: create_model's errors say it better
        return
    _refuse_unconvertible(params, trunk, vision_cfg["timm_model_name"])


def build_from_config(arch: dict) -> VCEModel:
    """The exact architecture of `arch` (a model's `arch_config`), no weights, no network."""
    return VCEModel(arch)
