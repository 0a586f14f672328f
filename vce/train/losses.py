"""Training loss: asymmetric focal loss on the classifier + class-weighted BCE on the contrastive head.

    L = L_cls + con_weight · L_con

L_cls, asymmetric loss (ASL; Ridnik et al. 2021, "Asymmetric Loss For Multi-Label
Classification", eqs. 2-4), with p = σ(z), shifted probability p_m = max(p − clip, 0):

    L_cls = −[ y · (1 − p)^γ⁺ · log p  +  (1 − y) · p_m^γ⁻ · log(1 − p_m) ]

written with y and 1 − y as weights so soft targets (label smoothing, mixup) interpolate
between the positive and the negative term; for hard targets it is the paper's loss.

L_con, binary cross-entropy on the contrastive logits with positive weight per label
w_c = clamp((1 − f_c) / f_c, 1, pos_weight_max), f_c the positive frame frequency of label c
in the training set (w = negatives per positive; a label never seen gets pos_weight_max):

    L_con = −[ w_c · y · log σ(s)  +  (1 − y) · log(1 − σ(s)) ]

Targets are smoothed first: y ← ε + (1 − 2ε) · y, so hard labels become [ε, 1 − ε].
Both terms are averaged over frames and labels.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from pydantic import Field

from vce.core.labels import NUM_LABELS
from vce.core.params import Section


class LossParams(Section):
    """`loss`: asymmetric focal loss + contrastive weighted BCE."""

    gamma_pos: float = Field(ge=0)
    gamma_neg: float = Field(ge=0)
    clip: float = Field(ge=0, lt=1)
    label_smoothing: float = Field(ge=0, lt=0.5)
    con_weight: float = Field(ge=0)
    pos_weight_max: float = Field(ge=1)
    eps: float = Field(gt=0, lt=1e-3)


def smoothed_bce(logits: torch.Tensor, target: float, clip: float, eps: float) -> torch.Tensor:
    """CE(y, p) = −[y · log p + (1 − y) · log(1 − p_m)] element-wise, p = σ(logits)."""
    probs = torch.sigmoid(logits)
    shifted = (probs - clip).clamp(min=0) if clip > 0 else probs
    loss = -(1 - target) * torch.log((1 - shifted).clamp(min=eps))
    if target > 0:
        loss = loss - target * torch.log(probs.clamp(min=eps))
    return loss


def asymmetric_loss(logits: torch.Tensor, targets: torch.Tensor, gamma_pos: float,
                    gamma_neg: float, clip: float, eps: float) -> torch.Tensor:
    """Element-wise ASL (B, 17), formula in the module docstring."""
    probs = torch.sigmoid(logits)
    shifted = (probs - clip).clamp(min=0) if clip > 0 else probs
    positive = targets * (1 - probs).pow(gamma_pos) * torch.log(probs.clamp(min=eps))
    negative = (1 - targets) * shifted.pow(gamma_neg) * torch.log((1 - shifted).clamp(min=eps))
    return -(positive + negative)


def contrastive_pos_weight(pos_freq: torch.Tensor, pos_weight_max: float) -> torch.Tensor:
    """(17,) negatives-per-positive weight, clamped to [1, pos_weight_max]."""
    freq = pos_freq.double()
    weight = torch.where(freq > 0, (1 - freq) / freq.clamp(min=1e-300), torch.full_like(freq, pos_weight_max))
    return weight.clamp(1.0, pos_weight_max).float()


class VCELoss(nn.Module):
    def __init__(self, params: LossParams, pos_freq: torch.Tensor):
        super().__init__()
        pos_freq = torch.as_tensor(pos_freq, dtype=torch.float32)
        if pos_freq.shape != (NUM_LABELS,) or not ((pos_freq >= 0) & (pos_freq <= 1)).all():
            raise ValueError(
                f"pos_freq must be ({NUM_LABELS},) frequencies in [0, 1], got shape "
                f"{tuple(pos_freq.shape)}"
            )
        self.params = params
        self.register_buffer("pos_weight", contrastive_pos_weight(pos_freq, params.pos_weight_max))

    def forward(self, outputs: dict, targets: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        p = self.params
        targets = p.label_smoothing + (1 - 2 * p.label_smoothing) * targets.float()  # (B, 17)
        loss_cls = asymmetric_loss(outputs["cls_logits"].float(), targets,
                                   p.gamma_pos, p.gamma_neg, p.clip, p.eps).mean()
        loss = loss_cls
        parts = {"loss_cls": loss_cls.item()}
        con_logits = outputs.get("con_logits")
        if con_logits is not None and p.con_weight > 0:
            loss_con = F.binary_cross_entropy_with_logits(
                con_logits.float(), targets, pos_weight=self.pos_weight)
            loss = loss + p.con_weight * loss_con
            parts["loss_con"] = loss_con.item()
        parts["loss"] = loss.item()
        return loss, parts
