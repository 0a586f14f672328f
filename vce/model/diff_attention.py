"""Differential attention in every block of a timm ViT, keeping the pretrained weights.

Differential attention (Ye et al. 2024, "Differential Transformer", arXiv 2410.05258):

    DiffAttn(X) = (softmax(Q1 K1ᵀ/√d) − λ·softmax(Q2 K2ᵀ/√d)) · V
    λ = exp(λq1·λk1) − exp(λq2·λk2) + λ_init,   λ_init = 0.8 − 0.6·exp(−0.3·depth)

each head's output goes through RMSNorm and is scaled by (1 − λ_init). The maintained
`timm.layers.DiffAttention` implements exactly this with both softmax maps through
`F.scaled_dot_product_attention` (fused kernels on GPU), so it is used as is.

Transfer of a pretrained attention layer with H heads of width d (ViT-B/16: H = 12, d = 64)
into `DiffAttention(num_heads=H/2)`, the paper's layout (half as many heads, each with two
query/key groups of width d and a value of width 2d, so parameters and matmuls match):

    Q/K/V/proj weights and biases are copied unchanged, bit for bit;
    differential head h takes pretrained head 2h as its first map (Q1, K1) and
    pretrained head 2h+1 as its second (Q2, K2), and the values of both heads [V_2h, V_2h+1]
    (the columns the output projection already expects there);
    new: λ vectors (paper init, normal std 0.1) and the per-head RMSNorm weight (ones).

It is NOT function-preserving at initialisation: the per-head RMSNorm and the subtraction
change the block's output, and no choice of λ undoes the normalisation. What it keeps, and what
tests/test_diff_attention.py checks: every pretrained weight, each softmax map equal to a
pretrained head's map, and the layer's output equal to the formula above evaluated on the
pretrained heads (reference computed independently from the original layer's weights).
This is `model.diff_init: neutral` (the seed's "QKV decomposed", parameter-neutral).

`model.diff_init: preserving` (`PreservingDiffAttention`) keeps the function instead: all H
pretrained heads stay as the positive branch (Q1, K1, V = the pretrained Q, K, V), a second
query/key projection (Q2, K2) starts as a copy of the pretrained one, and

    head_h = (softmax(Q1 K1ᵀ/√d) − g · λ · softmax(Q2 K2ᵀ/√d)) · V_h

with λ the paper's (λ vectors, λ_init by depth) and a learnable gate g starting at 0: at step 0
the layer IS the pretrained attention (the converted model's output equals the original's,
tested), and the gradient reaches g at once (∂out/∂g = −λ·A₂V ≠ 0), then Q2/K2 and λ. No
RMSNorm (it would change the function). Cost: the second Q/K, 2·dim² (+ 2·dim) per block,
+16.7 % of a ViT block's parameters and matmul FLOPs.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import DiffAttention
from timm.models.vision_transformer import Attention


def convert_attention(attn: Attention, depth: int) -> DiffAttention:
    """A DiffAttention with `attn`'s Q/K/V/proj weights copied in (layout in the module doc)."""
    _check_plain(attn)
    if attn.num_heads % 2:
        raise ValueError(
            f"differential attention pairs heads: {attn.num_heads} heads is odd"
        )
    dim = attn.qkv.in_features
    weight = attn.qkv.weight
    diff = DiffAttention(
        dim,
        num_heads=attn.num_heads // 2,
        qkv_bias=attn.qkv.bias is not None,
        proj_bias=attn.proj.bias is not None,
        attn_drop=attn.attn_drop.p,
        proj_drop=attn.proj_drop.p,
        depth=depth,
        device=weight.device,
        dtype=weight.dtype,
    )
    # DiffAttention views Q and K as 2·(H/2) = H heads of width d: the pretrained heads, in order.
    assert diff.head_dim == attn.head_dim
    diff.qkv.load_state_dict(attn.qkv.state_dict())
    diff.proj.load_state_dict(attn.proj.state_dict())
    diff.train(attn.training)
    return diff


def _check_plain(attn) -> None:
    if not isinstance(attn, Attention):
        raise TypeError(f"expected timm Attention, got {type(attn).__name__}")
    dim = attn.qkv.in_features
    plain = (
        isinstance(attn.q_norm, nn.Identity)
        and isinstance(attn.norm, nn.Identity)
        and getattr(attn, "gate", None) is None
        and attn.attn_dim == dim == attn.proj.out_features
    )
    if not plain:
        raise ValueError(
            "conversion supports plain ViT attention only (no q/k norm, scale norm, gate, "
            "or head width other than dim / num_heads)"
        )


class PreservingDiffAttention(nn.Module):
    """Differential attention that equals the pretrained attention at initialisation (module doc)."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool, proj_bias: bool, attn_drop: float,
                 proj_drop: float, depth: int, device=None, dtype=None):
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias, **dd)   # Q1, K1, V: the pretrained heads
        self.qk2 = nn.Linear(dim, 2 * dim, bias=qkv_bias, **dd)   # Q2, K2: the second map
        self.attn_drop_p = attn_drop
        self.proj = nn.Linear(dim, dim, bias=proj_bias, **dd)
        self.proj_drop = nn.Dropout(proj_drop)
        self.lambda_init = 0.8 - 0.6 * math.exp(-0.3 * depth)
        self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = (
            nn.Parameter(torch.randn(self.head_dim, device=device) * 0.1) for _ in range(4))
        self.lambda_gate = nn.Parameter(torch.zeros((), device=device))

    def lam(self) -> torch.Tensor:
        """g · λ, the weight of the second map (0 at initialisation)."""
        lam = (torch.exp(torch.dot(self.lambda_q1, self.lambda_k1)) - torch.exp(torch.dot(self.lambda_q2, self.lambda_k2))
               + self.lambda_init)
        return self.lambda_gate * lam

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        B, N, C = x.shape
        heads = lambda t: t.reshape(B, N, self.num_heads, self.head_dim).transpose(1, 2)  # noqa: E731
        q1, k1, v = (heads(t) for t in self.qkv(x).chunk(3, dim=-1))
        q2, k2 = (heads(t) for t in self.qk2(x).chunk(2, dim=-1))
        dropout = self.attn_drop_p if self.training else 0.0
        out = F.scaled_dot_product_attention(q1, k1, v, attn_mask=attn_mask, dropout_p=dropout, is_causal=is_causal)
        second = F.scaled_dot_product_attention(q2, k2, v, attn_mask=attn_mask, dropout_p=dropout,
                                                is_causal=is_causal)
        out = out - self.lam().to(out.dtype) * second
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(B, N, C)))


def convert_attention_preserving(attn: Attention, depth: int) -> PreservingDiffAttention:
    """A PreservingDiffAttention equal to `attn` (Q/K/V/proj copied, Q2/K2 = copies of Q/K, gate 0)."""
    _check_plain(attn)
    dim = attn.qkv.in_features
    weight = attn.qkv.weight
    diff = PreservingDiffAttention(dim, attn.num_heads, attn.qkv.bias is not None, attn.proj.bias is not None,
                                   attn.attn_drop.p, attn.proj_drop.p, depth, weight.device, weight.dtype)
    diff.qkv.load_state_dict(attn.qkv.state_dict())
    diff.proj.load_state_dict(attn.proj.state_dict())
    with torch.no_grad():
        diff.qk2.weight.copy_(weight[: 2 * dim])
        if attn.qkv.bias is not None:
            diff.qk2.bias.copy_(attn.qkv.bias[: 2 * dim])
    diff.train(attn.training)
    return diff


DIFF_INIT = {"neutral": convert_attention, "preserving": convert_attention_preserving}


def unconvertible(trunk: nn.Module, init: Literal["neutral", "preserving"]) -> str | None:
    """Why `trunk` cannot take differential attention with `init`, in words; None when it can.

    Convertible: a timm ViT, i.e. `trunk.blocks` whose every block has a plain timm `Attention`
    as `.attn` (or one converted already). A CNN (timm's EfficientNet has `.blocks` too, of
    convolution stages; a ResNet has none) has no attention to convert.
    """
    blocks = getattr(trunk, "blocks", None)
    attentions = ([getattr(block, "attn", None) for block in blocks]
                  if isinstance(blocks, (nn.Sequential, nn.ModuleList)) else [])
    if not attentions or any(attn is None for attn in attentions):
        return "has no ViT attention blocks to convert (a CNN?)"
    for depth, attn in enumerate(attentions):
        if isinstance(attn, (DiffAttention, PreservingDiffAttention)):
            continue
        try:
            _check_plain(attn)
        except (TypeError, ValueError) as err:
            return f"blocks[{depth}].attn cannot be converted: {err}"
        if init == "neutral" and attn.num_heads % 2:
            return f"has {attn.num_heads} heads per block: diff_init neutral pairs heads (preserving does not)"
    return None


def convert_to_diff_attention(trunk: nn.Module, init: Literal["neutral", "preserving"] = "neutral") -> nn.Module:
    """Replace `trunk.blocks[i].attn` by differential attention in every block, in place.

    `init`: neutral (DiffAttention, the seed's parameter-neutral head pairing) or preserving
    (PreservingDiffAttention, the pretrained function kept at step 0); module docstring.
    A trunk that cannot be converted (`unconvertible`) is a TypeError naming why.
    """
    reason = unconvertible(trunk, init)
    if reason is not None:
        raise TypeError(f"{type(trunk).__name__} {reason}")
    for depth, block in enumerate(trunk.blocks):
        if isinstance(block.attn, (DiffAttention, PreservingDiffAttention)):
            continue
        block.attn = DIFF_INIT[init](block.attn, depth)
    return trunk


def count_diff_attention(module: nn.Module) -> int:
    return sum(isinstance(m, (DiffAttention, PreservingDiffAttention)) for m in module.modules())
