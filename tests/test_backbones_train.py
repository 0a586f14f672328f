"""Every backbone trains: a real timm CNN (the packaged ImageNet EfficientNet-Lite0), a timm ResNet
and a real timm ViT (the packaged DINOv2 ViT-S/14, with differential attention) take real
optimiser steps through the project's Trainer, and a CNN refuses differential attention with a
one-line error naming the key, from the params check as from the model factory."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import yaml
from conftest import ROOT, section_params
from test_timm_source import write_checkpoint
from test_training_rules import Frames

from vce.core.params import ParamsError
from vce.model.frame_model import ModelParams, create_model
from vce.train.losses import LossParams, VCELoss
from vce.train.trainer import Trainer, TrainParams

RESNET = {"architecture": "resnet10t", "num_classes": 0, "model_args": {},
          "pretrained_cfg": {"input_size": [3, 64, 64], "mean": [0.5] * 3, "std": [0.25] * 3}}


def trainer_for(folder, tmp_path, image_size: int, train: dict | None = None, **model) -> Trainer:
    params = section_params(ModelParams, "model", source=f"timm:local-dir:{folder}", **model)
    torch.manual_seed(0)
    net = create_model(params)
    train_set, val_set = Frames(8, 1, image_size), Frames(4, 2, image_size)
    loss_fn = VCELoss(section_params(LossParams, "loss"), train_set.targets.mean(dim=0))
    train = section_params(TrainParams, "train", epochs=1, batch_size=4, samples_per_epoch=8, num_workers=0,
                           device="cpu", checkpoint_every=0, lr_backbone=1e-4, mixup_alpha=0.0, **(train or {}))
    return Trainer(net, loss_fn, train, 42, train_set, np.ones(len(train_set)), val_set, tmp_path / "state", "t")


def take_a_step(trainer: Trainer, image_size: int) -> dict[str, float]:
    """One train_step; how far each part's weights moved (largest absolute change)."""
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    frames = Frames(4, 3, image_size)
    loss = trainer.train_step(frames.images, frames.targets, seed=7)
    assert loss is not None and np.isfinite(loss)
    moved = {"backbone": 0.0, "head": 0.0}
    for name, param in trainer.model.named_parameters():
        part = "backbone" if name.startswith("visual.trunk.") else "head"
        moved[part] = max(moved[part], float((param.detach() - before[name]).abs().max()))
    return moved


def test_a_real_pretrained_cnn_fine_tunes(packaged_efficientnet, tmp_path, one_thread):
    trainer = trainer_for(packaged_efficientnet, tmp_path, 64, diff_attention=False)
    groups = {g["name"] for g in trainer.optimizer.param_groups}
    assert groups == {"backbone", "backbone_no_decay", "head", "head_no_decay"}  # BatchNorm: no decay
    moved = take_a_step(trainer, 64)
    assert moved["backbone"] > 0 and moved["head"] > 0


def test_a_resnet_fine_tunes(tmp_path, one_thread):
    write_checkpoint(tmp_path / "resnet", RESNET)
    moved = take_a_step(trainer_for(tmp_path / "resnet", tmp_path, 64, diff_attention=False), 64)
    assert moved["backbone"] > 0 and moved["head"] > 0


@pytest.mark.parametrize("diff_init", ["preserving", "neutral"])
def test_a_real_pretrained_vit_with_diff_attention_fine_tunes(packaged_dinov2, tmp_path, one_thread, diff_init):
    trainer = trainer_for(packaged_dinov2, tmp_path, 56, diff_attention=True, diff_init=diff_init)
    no_decay = {id(p) for g in trainer.optimizer.param_groups if g["weight_decay"] == 0 for p in g["params"]}
    trunk = trainer.model.visual.trunk
    assert id(trunk.pos_embed) in no_decay and id(trunk.cls_token) in no_decay
    moved = take_a_step(trainer, 56)
    assert moved["backbone"] > 0 and moved["head"] > 0


def test_a_probe_on_a_real_cnn_moves_the_heads_only(packaged_efficientnet, tmp_path, one_thread):
    trainer = trainer_for(packaged_efficientnet, tmp_path, 64, {"freeze_backbone": True}, diff_attention=False)
    moved = take_a_step(trainer, 64)
    assert moved["backbone"] == 0 and moved["head"] > 0


def test_diff_attention_on_a_cnn_names_the_key(packaged_efficientnet, tmp_path):
    from stages.params import validate_params

    source = f"timm:local-dir:{packaged_efficientnet}"
    message = r"^model.diff_attention: tf_efficientnet_lite0 has no ViT attention blocks to convert .*set it to false"
    with pytest.raises(ParamsError, match=message):
        create_model(section_params(ModelParams, "model", source=source, diff_attention=True))
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["model"].update(source=source, diff_attention=True)
    params["train"].update(lr_backbone=1e-4)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(ParamsError, match=message):  # the params stage, before any model is built
        validate_params(tmp_path / "params.yaml")
    params["model"].update(diff_attention=False)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    assert validate_params(tmp_path / "params.yaml")["model"].source == source


def test_a_timm_source_is_pretrained_so_a_from_scratch_rate_is_refused(packaged_efficientnet, tmp_path):
    from vce.train.trainer import check_learning_rates

    source = f"timm:local-dir:{packaged_efficientnet}"
    with pytest.raises(ParamsError, match="train.lr_backbone = 0.003 with the pretrained model.source"):
        check_learning_rates(section_params(TrainParams, "train", lr_backbone=3e-3), source)
    check_learning_rates(section_params(TrainParams, "train", lr_backbone=1e-4), source)
    assert json.loads((packaged_efficientnet / "config.json").read_text())["num_classes"] == 1000
