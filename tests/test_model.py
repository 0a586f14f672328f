"""One factory for every source; pretrained weights load for real or fail loudly."""

import io
import json

import huggingface_hub.constants
import open_clip
import pytest
import torch
from clip_checkpoints import REPO_ID, tiny_config, write_hub_cache, write_local_dir
from conftest import repo_params, section_params
from timm.layers import DiffAttention

from vce.core.labels import NUM_LABELS
from vce.core.params import ParamsError, from_dict
from vce.model.frame_model import (
    ImageTower,
    ModelParams,
    SourceError,
    build_from_config,
    create_model,
)
from vce.train.losses import LossParams, VCELoss

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]


@pytest.fixture
def offline_hub(monkeypatch):
    """No network: huggingface_hub serves only what a local cache holds."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def assert_tower_holds(model, clip):
    """The model's image tower carries the CLIP checkpoint's visual weights, bit for bit."""
    own = model.visual.state_dict()
    for key, tensor in clip.visual.state_dict().items():
        assert torch.equal(own[key], tensor), key


def test_tiny_forward_shapes_and_fusion():
    torch.manual_seed(0)
    model = create_model(section_params(ModelParams, "model"), torch.randn(NUM_LABELS, 2, 64)).eval()
    with torch.no_grad():
        out = model(torch.randn(3, 3, 64, 64))
    assert out["cls_logits"].shape == out["con_logits"].shape == (3, NUM_LABELS)
    assert out["embedding"].shape == (3, 64)
    expected = (torch.sigmoid(out["cls_logits"]) + torch.sigmoid(out["con_logits"])) / 2
    torch.testing.assert_close(model.frame_probs(out), expected)
    assert model.preprocess == {"image_size": 64, "mean": CLIP_MEAN,
                                "std": [0.26862954, 0.26130258, 0.27577711], "interpolation": "bicubic"}
    no_prompts = create_model(section_params(ModelParams, "model", fusion="mean"))
    out = no_prompts(torch.randn(2, 3, 64, 64))
    assert out["con_logits"] is None
    torch.testing.assert_close(no_prompts.frame_probs(out), torch.sigmoid(out["cls_logits"]))
    assert "label_text_embeddings" not in no_prompts.state_dict()


def test_image_tower_is_open_clip_timm_tower():
    """Same keys and function as open_clip's own TimmModel built from the same config."""
    clip = open_clip.CLIP(**tiny_config()["model_cfg"]).eval()
    tower = ImageTower(tiny_config()["model_cfg"]["vision_cfg"], 64).eval()
    tower.load_state_dict(clip.visual.state_dict(), strict=True)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(tower(x), clip.visual(x))


def test_local_dir_loads_pretrained_weights_and_preprocess(tmp_path):
    clip = write_local_dir(tmp_path / "ckpt", tiny_config(mean=[0.1, 0.2, 0.3]))
    plain = create_model(section_params(ModelParams, "model", source=f"local-dir:{tmp_path / 'ckpt'}", diff_attention=False))
    assert_tower_holds(plain, clip)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(plain.eval()(x)["embedding"], clip.visual(x))
    assert plain.preprocess["mean"] == [0.1, 0.2, 0.3]
    diff = create_model(section_params(ModelParams, "model", source=f"local-dir:{tmp_path / 'ckpt'}", diff_init="neutral"))
    assert sum(isinstance(m, DiffAttention) for m in diff.modules()) == 4
    for block, original in zip(diff.visual.trunk.blocks, clip.visual.trunk.blocks):
        assert torch.equal(block.attn.qkv.weight, original.attn.qkv.weight)
        assert torch.equal(block.attn.proj.weight, original.attn.proj.weight)


def test_local_dir_without_weights_is_an_error_not_random(tmp_path):
    write_local_dir(tmp_path / "ckpt", weights=False)
    with pytest.raises(SourceError, match="open_clip_pytorch_model.bin") as err:
        create_model(section_params(ModelParams, "model", source=f"local-dir:{tmp_path / 'ckpt'}"))
    assert str(tmp_path / "ckpt") in str(err.value) and "random" in str(err.value)
    with pytest.raises(SourceError, match="not found"):
        create_model(section_params(ModelParams, "model", source=f"local-dir:{tmp_path / 'nowhere'}"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match="open_clip_config.json"):
        create_model(section_params(ModelParams, "model", source=f"local-dir:{tmp_path / 'empty'}"))


def test_local_dir_with_weights_of_another_shape_is_an_error(tmp_path):
    config = tiny_config()
    config["model_cfg"]["embed_dim"] = 32  # weights' projection is 64 -> 32
    write_local_dir(tmp_path / "ckpt", config)
    (tmp_path / "ckpt" / "open_clip_config.json").write_text(json.dumps(tiny_config()))
    with pytest.raises(SourceError, match="does not fit"):
        create_model(section_params(ModelParams, "model", source=f"local-dir:{tmp_path / 'ckpt'}"))


def test_hf_hub_loads_through_the_hub_download(tmp_path, offline_hub):
    clip = write_local_dir(tmp_path / "repo", tiny_config(std=[0.5, 0.5, 0.5]))
    cache = write_hub_cache(tmp_path / "cache", tmp_path / "repo")
    model = create_model(section_params(ModelParams, "model", source=f"hf-hub:{REPO_ID}", cache_dir=str(cache)))
    assert torch.equal(model.visual.head.proj.weight, clip.visual.head.proj.weight)
    assert torch.equal(model.visual.trunk.blocks[2].attn.qkv.weight, clip.visual.trunk.blocks[2].attn.qkv.weight)
    assert model.preprocess["std"] == [0.5, 0.5, 0.5]


def test_hf_hub_without_weights_is_an_error_not_random(tmp_path, offline_hub):
    write_local_dir(tmp_path / "repo", weights=False)
    cache = write_hub_cache(tmp_path / "cache", tmp_path / "repo")
    with pytest.raises(SourceError, match=f"hf-hub:{REPO_ID}.*open_clip_pytorch_model.bin"):
        create_model(section_params(ModelParams, "model", source=f"hf-hub:{REPO_ID}", cache_dir=str(cache)))
    with pytest.raises(SourceError, match="open_clip_config.json"):
        create_model(section_params(ModelParams, "model", source="hf-hub:test-org/absent", cache_dir=str(cache)))


@pytest.fixture
def unreachable_hub(monkeypatch):
    """Network on, but the hub's address refuses connections (as a machine without network does)."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "https://127.0.0.1:9")


def test_hub_reachable_is_false_for_a_refused_or_unnamed_host():
    from vce.model.hub import hub_reachable

    assert not hub_reachable("https://127.0.0.1:9", timeout=2.0)
    assert not hub_reachable("not a url", timeout=2.0)


def test_an_unreachable_hub_fails_in_seconds_naming_the_source(tmp_path, unreachable_hub):
    """No hub and nothing cached: one error within seconds (huggingface_hub alone retried ~40 s a file)."""
    import time

    began = time.perf_counter()
    with pytest.raises(SourceError, match=r"hf-hub:test-org/absent: cannot fetch open_clip_config.json "
                                          r"from the hub \(https://127.0.0.1:9 cannot be reached"):
        create_model(section_params(ModelParams, "model", source="hf-hub:test-org/absent",
                                    cache_dir=str(tmp_path / "empty")))
    assert time.perf_counter() - began < 10
    assert huggingface_hub.constants.HF_HUB_OFFLINE is True  # for the rest of the process


def test_an_unreachable_hub_still_loads_what_the_cache_holds(tmp_path, unreachable_hub):
    clip = write_local_dir(tmp_path / "repo", tiny_config())
    cache = write_hub_cache(tmp_path / "cache", tmp_path / "repo")
    model = create_model(section_params(ModelParams, "model", source=f"hf-hub:{REPO_ID}", cache_dir=str(cache)))
    assert torch.equal(model.visual.head.proj.weight, clip.visual.head.proj.weight)


def test_random_source_is_biomedclip_vit_b16_with_12_differential_blocks():
    with torch.device("meta"):  # architecture only: skip initialising 2 × 86 M parameters
        model = create_model(section_params(ModelParams, "model", source="random", diff_init="neutral"))
        plain = create_model(section_params(ModelParams, "model", source="random", diff_attention=False))
    trunk = model.visual.trunk
    assert len(trunk.blocks) == 12 and all(isinstance(b.attn, DiffAttention) for b in trunk.blocks)
    assert trunk.embed_dim == 768 and trunk.patch_embed.patch_size == (16, 16)
    assert model.visual.head.proj.weight.shape == (512, 768)
    assert model.preprocess == {"image_size": 224, "mean": CLIP_MEAN,
                                "std": [0.26862954, 0.26130258, 0.27577711], "interpolation": "bicubic"}
    count = lambda m: sum(p.numel() for p in m.visual.parameters())  # noqa: E731
    assert count(model) - count(plain) == 12 * 6 * 64  # λ (4·64) + RMSNorm (2·64) per block


def test_build_from_config_rebuilds_a_checkpoint_exactly():
    torch.manual_seed(0)
    model = create_model(section_params(ModelParams, "model"), torch.randn(NUM_LABELS, 64)).eval()
    buffer = io.BytesIO()
    torch.save({"arch": model.arch_config, "state_dict": model.state_dict()}, buffer)
    buffer.seek(0)
    payload = torch.load(buffer, weights_only=True)
    json.dumps(payload["arch"])  # plain data
    rebuilt = build_from_config(payload["arch"])
    rebuilt.load_state_dict(payload["state_dict"])  # strict: prompts buffer included
    rebuilt.eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        a, b = model(x), rebuilt(x)
    for key in ("cls_logits", "con_logits", "embedding"):
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)
    assert rebuilt.preprocess == model.preprocess


def test_prompt_embeddings_are_normalised_template_means():
    emb = torch.randn(NUM_LABELS, 3, 64)
    model = create_model(section_params(ModelParams, "model"), emb)
    unit = emb / emb.norm(dim=-1, keepdim=True)
    mean = unit.mean(dim=1)
    torch.testing.assert_close(model.label_text_embeddings, mean / mean.norm(dim=-1, keepdim=True))
    assert not any(n.startswith("label_text") for n, _ in model.named_parameters())  # frozen
    with pytest.raises(ValueError, match="do not fit"):
        create_model(section_params(ModelParams, "model"), torch.randn(NUM_LABELS, 512))


def test_param_groups_split_backbone_heads_and_decay():
    model = create_model(section_params(ModelParams, "model"), torch.randn(NUM_LABELS, 64))
    groups = {g["name"]: g for g in model.param_groups(lr_head=3e-4, lr_backbone=9e-5, weight_decay=5e-4)}
    ids = [id(p) for g in groups.values() for p in g["params"]]
    assert len(ids) == len(set(ids)) == len(list(model.parameters()))
    name_of = {id(p): n for n, p in model.named_parameters()}
    assert all(name_of[id(p)].startswith("visual.") for p in groups["backbone"]["params"])
    head_names = {name_of[id(p)] for g in ("head", "head_no_decay") for p in groups[g]["params"]}
    assert {"con_logit_scale", "con_logit_bias", "classifier.weight", "excitation.fc1.weight"} <= head_names
    no_decay = {name_of[id(p)] for p in groups["backbone_no_decay"]["params"]}
    assert {"visual.trunk.blocks.0.attn.lambda_q1", "visual.trunk.blocks.0.norm1.weight",
            "visual.trunk.pos_embed", "visual.trunk.cls_token"} <= no_decay
    assert groups["backbone"]["lr"] == 9e-5 and groups["head"]["lr"] == 3e-4
    assert groups["head_no_decay"]["weight_decay"] == 0.0 and groups["head"]["weight_decay"] == 5e-4


def test_tiny_model_overfits_a_small_batch(one_thread):
    torch.manual_seed(0)
    model = create_model(section_params(ModelParams, "model", dropout=0.0), torch.randn(NUM_LABELS, 64))
    loss_fn = VCELoss(section_params(LossParams, "loss"), torch.full((NUM_LABELS,), 0.2))
    optimizer = torch.optim.AdamW(model.param_groups(3e-3, 1e-3, 0.0))
    images, targets = torch.randn(8, 3, 64, 64), (torch.rand(8, NUM_LABELS) < 0.2).float()
    losses = []
    for _ in range(15):
        loss, _ = loss_fn(model(images), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]


def test_params_are_checked_with_their_key():
    with pytest.raises(ParamsError, match="model.source"):
        from_dict(ModelParams, {**repo_params()["model"], "source": "biomedclip"}, "model")
    with pytest.raises(ParamsError, match="model.fusion"):
        from_dict(ModelParams, {**repo_params()["model"], "fusion": "max"}, "model")
    with pytest.raises(ParamsError, match="model.dropout"):
        from_dict(ModelParams, {**repo_params()["model"], "dropout": 1.5}, "model")


def test_diff_init_preserving_keeps_the_pretrained_tower_function(tmp_path):
    """model.diff_init: preserving — the converted image tower equals the checkpoint's at step 0."""
    clip = write_local_dir(tmp_path / "ckpt", tiny_config())
    source = f"local-dir:{tmp_path / 'ckpt'}"
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        original = clip.visual(x)
        preserving = create_model(section_params(ModelParams, "model", source=source, diff_init="preserving"))
        neutral = create_model(section_params(ModelParams, "model", source=source, diff_init="neutral"))
        torch.testing.assert_close(preserving.eval()(x)["embedding"], original, rtol=0, atol=1e-5)
        assert not torch.allclose(neutral.eval()(x)["embedding"], original, atol=1e-2)
    rebuilt = build_from_config(preserving.arch_config)  # the checkpoint's arch names the scheme
    rebuilt.load_state_dict(preserving.state_dict())
    assert preserving.arch_config["diff_init"] == "preserving"
    with pytest.raises(ParamsError, match="model.diff_init"):
        section_params(ModelParams, "model", diff_init="exact")
