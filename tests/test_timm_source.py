"""The `timm:` source: any timm image model, weights from a local folder (or the hub), loaded strictly."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import timm
import torch
import yaml
from conftest import ROOT, load_stage, prepare_demo
from safetensors.torch import save_file

from vce.core.errors import ParamsError
from vce.core.params import from_dict
from vce.model import checkpoint
from vce.model.clip_source import SourceError
from vce.model.frame_model import ModelParams, create_model

TINY_VIT = {"architecture": "vit_tiny_patch16_224", "num_classes": 5,
            "model_args": {"img_size": 64, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 4},
            "pretrained_cfg": {"input_size": [3, 64, 64], "mean": [0.4, 0.4, 0.4], "std": [0.2, 0.2, 0.2],
                               "interpolation": "bilinear"}}


def write_checkpoint(folder, config=TINY_VIT, weights="model.safetensors", seed=0):
    """A timm hub-layout folder: config.json + weights of the model it names (with its 5-class head)."""
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = timm.create_model(config["architecture"], pretrained=False, num_classes=config["num_classes"],
                              **config["model_args"])
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if weights.endswith(".safetensors"):
        save_file(state, str(folder / weights))
    else:
        torch.save(state, folder / weights)
    (folder / "config.json").write_text(json.dumps(config))
    return model, state


def model_params(source: str, **changes) -> ModelParams:
    values = yaml.safe_load((ROOT / "params.yaml").read_text())["model"]
    return from_dict(ModelParams, {**values, "source": source, **changes}, "model")


@pytest.mark.parametrize("weights", ["model.safetensors", "pytorch_model.bin"])
def test_local_checkpoint_loads_every_weight_into_the_trunk(tmp_path, weights):
    reference, state = write_checkpoint(tmp_path / "ckpt", weights=weights)
    model = create_model(model_params(f"timm:local-dir:{tmp_path / 'ckpt'}", diff_attention=False),
                         prompt_embeddings=torch.randn(17, 1, 512))
    trunk = model.visual.trunk.state_dict()
    for key, value in state.items():
        if not key.startswith("head."):  # the 5-class classifier is removed; our heads replace it
            assert torch.equal(trunk[key], value), key
    assert model.arch_config["embed_dim"] == 32 and not model.has_prompts
    assert model.preprocess == {"image_size": 64, "mean": [0.4] * 3, "std": [0.2] * 3, "interpolation": "bilinear"}
    images = torch.randn(2, 3, 64, 64)
    reference.reset_classifier(0)
    reference.eval(), model.eval()
    with torch.no_grad():  # projection starts as the identity: the embedding is the pretrained feature
        torch.testing.assert_close(model(images)["embedding"], reference(images))
        assert model.frame_probs(model(images)).shape == (2, 17)


def test_missing_weights_are_an_error_never_random_init(tmp_path):
    write_checkpoint(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "model.safetensors").unlink()
    with pytest.raises(SourceError, match="no pretrained weights in .*refusing to fall back to random weights"):
        create_model(model_params(f"timm:local-dir:{tmp_path / 'ckpt'}"))
    with pytest.raises(SourceError, match="folder .* not found"):
        create_model(model_params(f"timm:local-dir:{tmp_path / 'nowhere'}"))


def test_weights_that_do_not_fit_the_config_are_refused(tmp_path):
    write_checkpoint(tmp_path / "ckpt")
    other = {**TINY_VIT, "model_args": {**TINY_VIT["model_args"], "depth": 3}}  # the config says 3 blocks
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(other))
    with pytest.raises(SourceError, match="does not fit vit_tiny_patch16_224.*blocks.2"):
        create_model(model_params(f"timm:local-dir:{tmp_path / 'ckpt'}"))
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps({"num_classes": 5}))
    with pytest.raises(SourceError, match="not a timm config"):
        create_model(model_params(f"timm:local-dir:{tmp_path / 'ckpt'}"))


def test_hub_source_without_network_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SourceError, match="cannot fetch config.json from the hub.*timm:local-dir"):
        create_model(model_params("timm:hf-hub:timm/no_such_model_h7", cache_dir=str(tmp_path)))


def test_source_names_are_checked(tmp_path):
    for source, message in (("timm:vit_base", "timm:hf-hub:ORG/NAME or timm:local-dir:PATH"),
                            ("timm:local-dir:", "empty name after the prefix")):
        with pytest.raises(ParamsError, match=f"model.source.*{message}"):
            model_params(source)
    with pytest.raises(ParamsError, match="model.fusion.*timm: sources have none"):
        model_params(f"timm:local-dir:{tmp_path}", fusion="con")


def test_a_convnet_with_diff_attention_is_a_params_error(tmp_path):
    config = {"architecture": "resnet10t", "num_classes": 0, "model_args": {}, "pretrained_cfg": {"input_size": [3, 64, 64]}}
    write_checkpoint(tmp_path / "cnn", config)
    with pytest.raises(ParamsError, match="model.diff_attention: resnet10t has no ViT attention blocks"):
        create_model(model_params(f"timm:local-dir:{tmp_path / 'cnn'}"))
    model = create_model(model_params(f"timm:local-dir:{tmp_path / 'cnn'}", diff_attention=False))
    assert model(torch.randn(1, 3, 64, 64))["cls_logits"].shape == (1, 17)


CNN = {"architecture": "resnet10t", "num_classes": 0, "model_args": {}, "pretrained_cfg": {"input_size": [3, 64, 64]}}


@pytest.mark.parametrize("config, model, train", [
    (TINY_VIT, {}, {}),  # a ViT fine-tuned, differential attention (the default)
    (CNN, {"diff_attention": False}, {"freeze_backbone": True}),  # a CNN probed (no attention to convert)
], ids=["vit-fine-tune", "cnn-probe"])
def test_the_demo_trains_and_predicts_with_a_timm_checkpoint(tmp_path, config, model, train):
    write_checkpoint(tmp_path / "ckpt", config)
    args = prepare_demo(tmp_path, model={"source": f"timm:local-dir:{tmp_path / 'ckpt'}", **model},
                        train={"epochs": 1, "samples_per_epoch": 64, "lr_backbone": 1e-3, **train})  # pretrained: <= 1e-3
    assert load_stage("train").main(args["train"]) == 0
    assert load_stage("predict").main(args["predict"]) == 0
    saved = checkpoint.load(tmp_path / "models/model.pt")
    assert saved["arch"]["vision_cfg"]["timm_model_name"] == config["architecture"]
    probs = pd.read_parquet(tmp_path / "predict/val.parquet")
    assert len(probs) and probs["valid"].all()
    # the saved model rebuilds from its file alone (no checkpoint folder needed any more)
    (tmp_path / "ckpt" / "model.safetensors").unlink()
    rebuilt, _ = checkpoint.load_model(tmp_path / "models/model.pt")
    assert rebuilt.arch_config["diff_attention"] == model.get("diff_attention", True)
    if train.get("freeze_backbone"):  # a probe: the saved backbone is the checkpoint's, unchanged
        _, state = write_checkpoint(tmp_path / "again", config)
        trunk = rebuilt.visual.trunk.state_dict()
        assert all(torch.equal(trunk[k], v) for k, v in state.items() if k in trunk and "num_batches" not in k)
