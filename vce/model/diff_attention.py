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
"""

from __future__ import annotations

import torch.nn as nn
from timm.layers import DiffAttention
from timm.models.vision_transformer import Attention


def convert_attention(attn: Attention, depth: int) -> DiffAttention:
    """A DiffAttention with `attn`'s Q/K/V/proj weights copied in (layout in the module doc)."""
    if not isinstance(attn, Attention):
        raise TypeError(f"expected timm Attention, got {type(attn).__name__}")
    if attn.num_heads % 2:
        raise ValueError(
            f"differential attention pairs heads: {attn.num_heads} heads is odd"
        )
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


def convert_to_diff_attention(trunk: nn.Module) -> nn.Module:
    """Replace `trunk.blocks[i].attn` by differential attention in every block, in place."""
    blocks = getattr(trunk, "blocks", None)
    if blocks is None:
        raise TypeError(f"{type(trunk).__name__} has no `blocks`: not a timm ViT")
    for depth, block in enumerate(blocks):
        if isinstance(block.attn, DiffAttention):
            continue
        block.attn = convert_attention(block.attn, depth)
    return trunk


def count_diff_attention(module: nn.Module) -> int:
    return sum(isinstance(m, DiffAttention) for m in module.modules())
