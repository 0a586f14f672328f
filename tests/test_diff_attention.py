"""The differential-attention transfer keeps what vce/diff_attention.py promises, exactly."""

import copy
import math

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.layers import DiffAttention
from timm.models.vision_transformer import Attention
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import vce.model.frame_model  # noqa: F401  (registers the tiny ViT with timm)
from vce.model.diff_attention import (
    PreservingDiffAttention,
    convert_attention,
    convert_attention_preserving,
    convert_to_diff_attention,
    count_diff_attention,
)


def reference_output(original: Attention, diff: DiffAttention, x: torch.Tensor, depth: int):
    """Ye et al. 2024 on the ORIGINAL layer's heads: head h = (A_2h − λ A_2h+1)·[V_2h, V_2h+1]."""
    B, N, C = x.shape
    H, d = original.num_heads, original.head_dim
    q, k, v = F.linear(x, original.qkv.weight, original.qkv.bias).split(C, dim=-1)
    q, k, v = (t.reshape(B, N, H, d).transpose(1, 2) for t in (q, k, v))  # (B, H, N, d)
    maps = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d), dim=-1)  # pretrained heads' maps
    lambda_init = 0.8 - 0.6 * math.exp(-0.3 * depth)
    lam = (torch.exp(diff.lambda_q1 @ diff.lambda_k1) - torch.exp(diff.lambda_q2 @ diff.lambda_k2)
           + lambda_init)
    heads = []
    for h in range(H // 2):
        value = torch.cat([v[:, 2 * h], v[:, 2 * h + 1]], dim=-1)  # (B, N, 2d)
        out = (maps[:, 2 * h] - lam * maps[:, 2 * h + 1]) @ value
        out = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + 1e-5) * diff.sub_norm.weight
        heads.append(out * (1 - lambda_init))
    return F.linear(torch.cat(heads, dim=-1), original.proj.weight, original.proj.bias)


@pytest.mark.parametrize("dim,heads,depth", [(768, 12, 0), (768, 12, 11), (64, 4, 3)])
def test_converted_layer_computes_the_formula_on_the_pretrained_heads(dim, heads, depth):
    torch.manual_seed(depth)
    original = Attention(dim, num_heads=heads, qkv_bias=True).double().eval()
    diff = convert_attention(original, depth).double().eval()
    with torch.no_grad():  # move the new parameters off their init so all of them are exercised
        for p in (diff.lambda_q1, diff.lambda_k1, diff.lambda_q2, diff.lambda_k2):
            p.normal_(0, 0.3)
        diff.sub_norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 17, dim, dtype=torch.float64)
    with torch.no_grad():
        expected = reference_output(original, diff, x, depth)
        torch.testing.assert_close(diff(x), expected, rtol=0, atol=1e-6)  # λ is computed in float32 by timm
        diff.fused_attn = False  # the explicit-softmax path agrees with the two SDPA calls
        torch.testing.assert_close(diff(x), expected, rtol=0, atol=1e-6)  # λ is computed in float32 by timm


def test_transfer_keeps_every_pretrained_weight_and_adds_only_lambda_and_norm():
    torch.manual_seed(0)
    plain = timm.create_model("vce_vit_tiny_patch8_64", num_classes=0).eval()
    converted = convert_to_diff_attention(copy.deepcopy(plain))
    assert count_diff_attention(converted) == len(plain.blocks) == 4
    before, after = plain.state_dict(), converted.state_dict()
    for key, tensor in before.items():  # Q/K/V/proj, MLPs, norms, embeddings: bit for bit
        assert torch.equal(after[key], tensor), key
    new = sorted({k.split(".", 3)[-1] for k in set(after) - set(before)})
    assert new == ["lambda_k1", "lambda_k2", "lambda_q1", "lambda_q2", "sub_norm.weight"]
    head_dim = plain.blocks[0].attn.head_dim  # 16: Q/K groups keep the pretrained head width
    extra = sum(p.numel() for p in converted.parameters()) - sum(p.numel() for p in plain.parameters())
    assert extra == len(plain.blocks) * (4 * head_dim + 2 * head_dim)
    for depth, block in enumerate(converted.blocks):
        assert block.attn.lambda_init == pytest.approx(0.8 - 0.6 * math.exp(-0.3 * depth))
        assert block.attn.fused_attn  # both softmax maps through scaled_dot_product_attention


def test_not_function_preserving_but_same_shapes_and_finite():
    """Stated in the module doc: the per-head RMSNorm changes the output; shapes stay."""
    torch.manual_seed(0)
    plain = timm.create_model("vce_vit_tiny_patch8_64", num_classes=0).eval()
    converted = convert_to_diff_attention(copy.deepcopy(plain)).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        a, b = plain(x), converted(x)
    assert a.shape == b.shape and torch.isfinite(b).all()
    assert not torch.allclose(a, b)


def test_compute_cost_attention_matmuls_grow_by_half():
    """Q·Kᵀ as before; the (two maps)·V products double: attention matmuls × 1.5, rest equal."""
    plain = timm.create_model("vce_vit_tiny_patch8_64", num_classes=0).eval()
    converted = convert_to_diff_attention(copy.deepcopy(plain)).eval()
    counts = []
    for model in (plain, converted):
        with torch.no_grad(), sdpa_kernel([SDPBackend.MATH]), FlopCounterMode(display=False) as fc:
            model(torch.randn(1, 3, 64, 64))
        counts.append({str(k): v for k, v in fc.get_flop_counts()["Global"].items()})
    tokens, dim, depth = 65, 64, 4
    assert counts[0]["aten.bmm"] == depth * 2 * (2 * tokens * tokens * dim)
    assert counts[1]["aten.bmm"] == counts[0]["aten.bmm"] * 3 // 2
    assert counts[1]["aten.addmm"] == counts[0]["aten.addmm"]


def test_odd_head_count_is_rejected():
    with pytest.raises(ValueError, match="odd"):
        convert_attention(Attention(48, num_heads=3), 0)


# ---------------------------------------------------------------------------- diff_init: preserving

def preserving_pair(seed=0):
    torch.manual_seed(seed)
    plain = timm.create_model("vce_vit_tiny_patch8_64", num_classes=0).eval()
    return plain, convert_to_diff_attention(copy.deepcopy(plain), "preserving").eval()


def test_preserving_conversion_equals_the_original_model_at_step_0():
    plain, converted = preserving_pair()
    assert count_diff_attention(converted) == 4
    assert all(isinstance(b.attn, PreservingDiffAttention) for b in converted.blocks)
    x = torch.randn(3, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(converted(x), plain(x), rtol=0, atol=1e-5)
        _, neutral = plain, convert_to_diff_attention(copy.deepcopy(plain), "neutral").eval()
        cosine = F.cosine_similarity(neutral(x), plain(x), dim=-1)
    assert cosine.max() < 0.99  # the neutral pairing does not keep the function (module doc)


def test_preserving_layer_is_the_formula_once_the_gate_opens():
    torch.manual_seed(1)
    original = Attention(64, num_heads=4, qkv_bias=True).double().eval()
    diff = convert_attention_preserving(original, depth=2).double().eval()
    assert torch.equal(diff.qk2.weight, original.qkv.weight[:128]) and torch.equal(diff.qk2.bias, original.qkv.bias[:128])
    with torch.no_grad():
        diff.lambda_gate.fill_(0.7)
        diff.qk2.weight.add_(torch.randn_like(diff.qk2.weight) * 0.2)  # a second map of its own
    x = torch.randn(2, 17, 64, dtype=torch.float64)
    B, N, C = x.shape
    split = lambda t: t.reshape(B, N, 4, 16).transpose(1, 2)  # noqa: E731
    q1, k1, v = (split(t) for t in F.linear(x, original.qkv.weight, original.qkv.bias).split(C, dim=-1))
    q2, k2 = (split(t) for t in F.linear(x, diff.qk2.weight, diff.qk2.bias).split(C, dim=-1))
    a1 = torch.softmax(q1 @ k1.transpose(-2, -1) / 4.0, dim=-1)
    a2 = torch.softmax(q2 @ k2.transpose(-2, -1) / 4.0, dim=-1)
    lam = 0.7 * (torch.exp(diff.lambda_q1 @ diff.lambda_k1) - torch.exp(diff.lambda_q2 @ diff.lambda_k2)
                 + 0.8 - 0.6 * math.exp(-0.6))
    heads = ((a1 - lam * a2) @ v).transpose(1, 2).reshape(B, N, C)
    with torch.no_grad():
        torch.testing.assert_close(diff(x), F.linear(heads, original.proj.weight, original.proj.bias),
                                   rtol=0, atol=1e-6)


def test_preserving_gate_learns_from_the_first_step_and_costs_two_qk_projections():
    plain, converted = preserving_pair()
    converted.train()
    converted(torch.randn(2, 3, 64, 64)).pow(2).sum().backward()
    gates = [b.attn.lambda_gate.grad for b in converted.blocks]
    assert all(g is not None and g.abs() > 0 for g in gates)  # not stuck at its zero init
    dim = plain.embed_dim
    extra = sum(p.numel() for p in converted.parameters()) - sum(p.numel() for p in plain.parameters())
    assert extra == len(plain.blocks) * (2 * dim * dim + 2 * dim + 4 * (dim // 4) + 1)
    vit_b_block = 12 * 768 * 768
    assert 2 * 768 * 768 / vit_b_block == pytest.approx(0.167, abs=1e-3)  # the +16.7 % of the module doc


def test_preserving_lambda_vectors_learn_once_the_gate_opens():
    """The λ vectors start as the paper's small random draws: at zero their gradient
    (∂λ/∂λq1 = exp(λq1·λk1)·λk1) would be zero forever and λ would stay λ_init."""
    torch.manual_seed(2)
    layer = convert_attention_preserving(Attention(64, num_heads=4, qkv_bias=True), depth=2)
    vectors = [layer.lambda_q1, layer.lambda_k1, layer.lambda_q2, layer.lambda_k2]
    assert all(v.shape == (16,) for v in vectors)
    assert 0.05 < torch.cat([v.detach() for v in vectors]).std() < 0.2  # normal(0, 0.1), as DiffAttention's
    with torch.no_grad():
        layer.lambda_gate.fill_(0.5)
    layer(torch.randn(2, 9, 64)).pow(2).sum().backward()
    assert all(v.grad is not None and v.grad.abs().max() > 0 for v in vectors)


def test_preserving_keeps_a_real_pretrained_vit_on_real_frames(packaged_dinov2, fixtures_dir, one_thread):
    """The real DINOv2 ViT-S/14 (packaged, 56 px) on real capsule stills: preserving keeps the
    pretrained embedding (cosine >= 0.9999 at step 0); the neutral pairing does not."""
    import numpy as np
    from conftest import section_params

    from vce.data.frames import decode_frame
    from vce.model.frame_model import ModelParams, create_model

    stills = sorted((fixtures_dir / "wcebleedgen" / "frames").glob("*.png"))[::60]  # 5 stills, both classes
    pixels = torch.from_numpy(np.stack([decode_frame(p, 56) for p in stills])).permute(0, 3, 1, 2).float() / 255
    embeddings = {}
    for name, values in {"plain": {"diff_attention": False}, "preserving": {"diff_init": "preserving"},
                         "neutral": {"diff_init": "neutral"}}.items():
        model = create_model(section_params(ModelParams, "model", source=f"timm:local-dir:{packaged_dinov2}",
                                            **{"diff_attention": True, **values})).eval()
        pre = model.preprocess
        images = (pixels - torch.tensor(pre["mean"]).view(1, 3, 1, 1)) / torch.tensor(pre["std"]).view(1, 3, 1, 1)
        with torch.no_grad():
            embeddings[name] = model(images)["embedding"]
    cosine = {name: F.cosine_similarity(e, embeddings["plain"], dim=-1) for name, e in embeddings.items()}
    assert cosine["preserving"].min() >= 0.9999
    assert cosine["neutral"].max() < 0.9  # measured 0.36-0.43 at 112 px (docs/training.md)
