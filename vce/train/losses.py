"""Training loss: asymmetric focal loss on the classifier + class-weighted BCE on the contrastive head.

    L = L_cls + con_weight · L_con

Targets t ∈ [0, 1] are hard labels or mixup's mixes of them. Label smoothing ε only shapes
the target each frame is pulled towards: a positive towards y⁺ = 1 − ε, a negative towards
y⁻ = ε. Both losses are linear in t, so a mixed target is the same mix of the losses of its
two hard labels (mixup's definition), and for hard t they are:

L_cls, asymmetric loss (ASL; Ridnik et al. 2021, "Asymmetric Loss For Multi-Label
Classification", eqs. 2-4) with Alibaba-MIIL's soft-target semantics (the focusing weight comes
from the HARD target, smoothing acts inside it, as in their `ASLSingleLabel`), p = σ(z),
shifted probability p_m = max(p − clip, 0):

    L_cls = t · (1 − p)^γ⁺ · CE(y⁺, p)  +  (1 − t) · p_m^γ⁻ · CE(y⁻, p)
    CE(y, p) = −[ y · log p + (1 − y) · log(1 − p_m) ]

The minimum of a negative's term is 0 for every p ≤ clip (p_m = 0: an easy negative costs
nothing), a positive's loss falls all the way to p = 1 (its weight (1 − p) reaches 0 there).
Written the other way round — focusing weights and smoothed targets multiplied per term, as
this module did before — the optimum of a negative sat at p ≈ 0.42 and of a positive at
p ≈ 0.86 (tests/test_losses.py pins both optima numerically).

L_con, binary cross-entropy on the contrastive logits s; positive frames weigh
w_c = clamp((1 − f_c) / f_c, 1, pos_weight_max), f_c the positive frame frequency of label c in
the training set (w = negatives per positive; a label never seen gets pos_weight_max):

    L_con = t · w_c · BCE(y⁺, σ(s))  +  (1 − t) · BCE(y⁻, σ(s))

The weight multiplies a positive's whole loss, never the ε target mass of a negative, so a
negative is pulled to σ = ε and a positive to 1 − ε for common and rare labels alike (with
torch's `pos_weight` on smoothed targets a rare label's negatives went to σ = 0.84, and a
perfect model's loss on Galar frequencies was 0.88). At the optimum L_cls is 0 and L_con is the
entropy floor H(ε) · mean over labels of ((1 − f_c) + f_c · w_c): 0.27 on Galar's label
frequencies with ε = 0.05, so L = 0.11 (the seed logged 0.18-0.41). All terms are averaged over
frames and labels.
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
                    gamma_neg: float, clip: float, eps: float, smoothing: float) -> torch.Tensor:
    """Element-wise ASL, same shape as `logits`; `targets` unsmoothed (formula in the module doc)."""
    probs = torch.sigmoid(logits)
    shifted = (probs - clip).clamp(min=0) if clip > 0 else probs
    positive = (1 - probs).pow(gamma_pos) * smoothed_bce(logits, 1 - smoothing, clip, eps)
    negative = shifted.pow(gamma_neg) * smoothed_bce(logits, smoothing, clip, eps)
    return targets * positive + (1 - targets) * negative


def contrastive_loss(logits: torch.Tensor, targets: torch.Tensor, pos_weight: torch.Tensor,
                     smoothing: float) -> torch.Tensor:
    """Element-wise L_con (module doc); `pos_weight` (17,) weighs positive frames only."""
    positive = F.binary_cross_entropy_with_logits(
        logits, torch.full_like(logits, 1 - smoothing), reduction="none")
    negative = F.binary_cross_entropy_with_logits(
        logits, torch.full_like(logits, smoothing), reduction="none")
    return targets * pos_weight * positive + (1 - targets) * negative


def masked_frame_loss(per_label: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Mean over labels, then over the frames where `valid` (…, 17) → scalar; 0 when none is."""
    per_frame = per_label.mean(dim=-1)
    valid = valid.to(per_frame.dtype)
    return (per_frame * valid).sum() / valid.sum().clamp(min=1)


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
        targets = targets.float()  # (B, 17) hard or mixed; smoothing is applied inside each loss
        loss_cls = asymmetric_loss(outputs["cls_logits"].float(), targets, p.gamma_pos, p.gamma_neg,
                                   p.clip, p.eps, p.label_smoothing).mean()
        loss = loss_cls
        parts = {"loss_cls": loss_cls.item()}
        con_logits = outputs.get("con_logits")
        if con_logits is not None and p.con_weight > 0:
            loss_con = contrastive_loss(con_logits.float(), targets, self.pos_weight, p.label_smoothing).mean()
            loss = loss + p.con_weight * loss_con
            parts["loss_con"] = loss_con.item()
        parts["loss"] = loss.item()
        return loss, parts
