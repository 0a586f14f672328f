"""Real pretrained weights from installed packages, converted to timm folders (vce/model/packaged_weights.py).

The checks are functional, not only shape-wise: a renaming that swapped two same-shaped
tensors (two BatchNorms, query and key) would still load strictly, so the EfficientNet must
still recognise a real photograph and the ViT must still compute the ONNX graph's features.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from sklearn.datasets import load_sample_image

from vce.core.errors import DataError
from vce.model.packaged_weights import convert_dinov2_vits14, main, onnx_backbone_tokens

IMAGENET_DAISY = 985  # ImageNet-1k class index of "daisy" (timm.data.ImageNetInfo)


def load_folder(folder, **changes) -> torch.nn.Module:
    config = json.loads((folder / "config.json").read_text())
    model = timm.create_model(config["architecture"], pretrained=False, num_classes=config["num_classes"],
                              **{**config["model_args"], **changes})
    model.load_state_dict(load_file(str(folder / "model.safetensors")), strict=True)
    return model.eval()


def test_efficientnet_lite0_keeps_its_imagenet_function(packaged_efficientnet, one_thread):
    model = load_folder(packaged_efficientnet)
    photo = torch.from_numpy(load_sample_image("flower.jpg").copy()).permute(2, 0, 1)[None].float() / 255
    photo = F.interpolate(photo, size=(224, 224), mode="bicubic", antialias=True)
    with torch.no_grad():
        logits = model((photo - 0.5) / 0.5)  # the folder's pretrained_cfg: mean 0.5, std 0.5
    assert int(logits.argmax()) == IMAGENET_DAISY
    config = json.loads((packaged_efficientnet / "config.json").read_text())
    assert config["architecture"] == "tf_efficientnet_lite0" and config["pretrained_cfg"]["mean"] == [0.5] * 3


def test_dinov2_conversion_matches_the_onnx_graph(tmp_path, one_thread):
    folder = convert_dinov2_vits14(tmp_path / "dinov2", 224)  # the ONNX graph's fixed input size
    model = load_folder(folder)
    images = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    with torch.no_grad():
        ours = model.forward_features(torch.from_numpy(images)).numpy()  # (1, 1 + 256, 384)
    reference = onnx_backbone_tokens(images)
    assert ours.shape == reference.shape == (1, 257, 384)
    assert np.abs(ours - reference).max() < 1e-4  # measured 2.2e-5 (float32 summation order)


def test_dinov2_small_size_is_the_position_grid_resized(packaged_dinov2, tmp_path, one_thread):
    small, full = load_folder(packaged_dinov2), load_folder(convert_dinov2_vits14(tmp_path / "d98", 98))
    assert small.pos_embed.shape == (1, 1 + 4 * 4, 384) and full.pos_embed.shape == (1, 1 + 7 * 7, 384)
    # every other weight is the same tensor at either size
    for (name, a), (_, b) in zip(small.state_dict().items(), full.state_dict().items()):
        assert name == "pos_embed" or torch.equal(a, b), name
    config = json.loads((packaged_dinov2 / "config.json").read_text())
    assert config["model_args"] == {"img_size": 56} and config["pretrained_cfg"]["input_size"] == [3, 56, 56]


def test_image_size_must_be_a_multiple_of_the_patch(tmp_path, capsys):
    with pytest.raises(DataError, match="--image-size 100 must be a positive multiple of 14"):
        convert_dinov2_vits14(tmp_path / "d", 100)
    assert main(["dinov2-vits14", str(tmp_path / "d"), "--image-size", "100"]) == 2
    assert "error: dinov2-vits14: --image-size 100" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()
