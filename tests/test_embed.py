"""Features once: with `train.freeze_backbone` the embed stage computes the frozen backbone's frame
features, train fits the heads on them and predict applies the heads to them; a head key swept
afterwards never runs the backbone again, in the stages or in DVC's graph."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from conftest import ROOT, load_stage, prepare_demo

from vce.core.errors import DataError
from vce.core.params import from_dict
from vce.data.features import backbone_fingerprint, read_features, read_meta
from vce.model import checkpoint
from vce.model.frame_model import ModelParams, VCEModel, create_model

PROBE = {"train": {"freeze_backbone": True, "epochs": 3, "mixup_alpha": 0.0}, "model": {"dropout": 0.0}}


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    """The tiny demo through embed (frozen backbone) → train → predict."""
    tmp_path = tmp_path_factory.mktemp("probe")
    args = prepare_demo(tmp_path, **PROBE)  # runs embed after prompts
    assert load_stage("train").main(args["train"]) == 0
    assert load_stage("predict").main(args["predict"]) == 0
    return tmp_path, args


def params_of(tmp_path: Path) -> dict:
    return yaml.safe_load((tmp_path / "params.yaml").read_text())


def test_features_are_the_backbone_of_the_trained_model_for_every_frame(probe):
    tmp_path, _ = probe
    params = params_of(tmp_path)
    meta = read_meta(tmp_path / "embed")
    frames = pd.read_parquet(tmp_path / "split/frames.parquet")
    test = pd.read_parquet(tmp_path / "index/test.parquet")
    assert meta["enabled"] and meta["labelled"]["frames"] == len(frames) and meta["test"]["frames"] == len(test)
    torch.manual_seed(params["base"]["seed"])
    fresh = create_model(from_dict(ModelParams, params["model"], "model"))
    assert meta["backbone"] == backbone_fingerprint(fresh.visual)
    trained, payload = checkpoint.load_model(tmp_path / "models/model.pt")
    assert payload["features"] == meta["backbone"] == backbone_fingerprint(trained.visual), "the tower moved"
    # The cached feature of a frame is the tower's output on its pixels (float16 storage).
    from vce.core.contracts import label_matrix
    from vce.data.dataset import FrameDataset, eval_transform, normalize_batch
    rows = frames.iloc[:8]
    size = fresh.preprocess["image_size"]
    dataset = FrameDataset(params["data"]["root"], rows["path"], label_matrix(rows), size, size,
                           fresh.preprocess.get("interpolation", "bicubic"), eval_transform(), "pyspng", None)
    images = torch.stack([dataset[i][0] for i in range(len(rows))])
    with torch.no_grad():
        direct = fresh.eval().visual(normalize_batch(images, fresh.preprocess["mean"], fresh.preprocess["std"],
                                                     torch.device("cpu")))
    cached, valid = read_features(tmp_path / "embed", "labelled", rows, meta["backbone"])
    assert valid.all()
    np.testing.assert_allclose(cached.astype(np.float32), direct.numpy(), rtol=2e-3, atol=2e-3)


def test_predict_of_a_probe_writes_the_cached_features_as_its_embeddings(probe):
    tmp_path, _ = probe
    meta = read_meta(tmp_path / "embed")
    for split, part in (("val", "labelled"), ("test", "test")):
        probs = pd.read_parquet(tmp_path / "predict" / f"{split}.parquet")
        embeddings = pd.read_parquet(tmp_path / "predict" / f"{split}_embeddings.parquet")
        cached, _ = read_features(tmp_path / "embed", part, embeddings, meta["backbone"])
        assert len(probs) > 0 and np.array_equal(np.stack(embeddings["embedding"].to_numpy()), cached)
        assert np.isfinite(probs.drop(columns=["video_id", "frame", "valid"]).to_numpy()).all()
    train = json.loads((tmp_path / "metrics/train.json").read_text())
    assert train["epochs"] == 3 and train["final"]["lr_backbone"] == 0.0


def test_a_head_sweep_never_runs_the_backbone(probe, tmp_path, monkeypatch):
    """After embed, another head setting trains and predicts with the image tower's forward broken:
    the features are read, never recomputed (the call counter is the exception)."""
    demo_path, args = probe
    params = params_of(demo_path)
    params["train"].update(lr_head=1e-2, weight_decay=0.05)
    params["model"].update(dropout=0.2)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    calls = []

    def no_backbone(self, images):
        calls.append(len(images))
        raise AssertionError("the backbone ran")

    monkeypatch.setattr(type(create_model(from_dict(ModelParams, params["model"], "model")).visual), "forward",
                        no_backbone)
    swap = {"--params": tmp_path / "params.yaml", "--model-out": tmp_path / "model.pt", "--metrics": tmp_path / "t.json",
            "--live-dir": tmp_path / "live", "--state-dir": tmp_path / "state", "--model": tmp_path / "model.pt",
            "--out-dir": tmp_path / "predict", "--report": tmp_path / "p.json"}
    for stage in ("train", "predict"):
        argv = list(args[stage])
        for flag, value in swap.items():
            if flag in argv:
                argv[argv.index(flag) + 1] = str(value)
        assert load_stage(stage).main(argv) == 0
    assert calls == []
    first = pd.read_parquet(demo_path / "predict/val.parquet")
    second = pd.read_parquet(tmp_path / "predict/val.parquet")
    assert not np.allclose(first["blood"], second["blood"]), "the new heads predicted"


def test_features_of_another_backbone_are_refused(probe, tmp_path):
    demo_path, args = probe
    frames = pd.read_parquet(demo_path / "split/frames.parquet")
    with pytest.raises(DataError, match="another backbone"):
        read_features(demo_path / "embed", "labelled", frames, "0" * 16)
    params = params_of(demo_path)
    params["base"]["seed"] += 1  # the tiny source's tower is seeded: another tower
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    argv = list(args["train"])
    argv[argv.index("--params") + 1] = str(tmp_path / "params.yaml")
    argv[argv.index("--model-out") + 1] = str(tmp_path / "model.pt")
    assert load_stage("train").main(argv) == 2  # a DataError: one line naming the file, exit 2
    assert not (tmp_path / "model.pt").exists()


def test_fine_tuning_writes_no_features(tmp_path):
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"train": {"freeze_backbone": False}}))
    from conftest import repo_params
    params = repo_params()
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    assert load_stage("embed").main(["--params", str(tmp_path / "params.yaml"), "--out", str(tmp_path / "embed")]) == 0
    assert read_meta(tmp_path / "embed") == {"enabled": False}
    assert sorted(p.name for p in (tmp_path / "embed").iterdir()) == ["meta.json"]


HEAD_KEYS = {"model": ["dropout", "fusion", "excitation_reduction", "con_scale_init", "con_bias_init"],
             "train": [k for k in yaml.safe_load((ROOT / "params.yaml").read_text())["train"] if k != "freeze_backbone"],
             "loss": list(yaml.safe_load((ROOT / "params.yaml").read_text())["loss"])}


def test_dvc_reruns_no_embed_for_a_head_or_training_key():
    """DVC's graph: the embed stage depends on the tower's params only, so `dvc exp run -S` of any
    head, loss or training key leaves it cached (a `model` or `train` section dep would rerun it)."""
    stage = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]["embed"]
    deps = set(stage["params"])
    assert {"model", "train", "loss"}.isdisjoint(deps)
    for section, keys in HEAD_KEYS.items():
        assert not {f"{section}.{key}" for key in keys} & deps, section
    assert {"model.source", "train.freeze_backbone"} <= deps
    for name in ("train", "predict", "predict_test"):
        assert "data/embed" in yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"][name]["deps"]


def test_heads_on_features_equal_the_forward_pass():
    """`VCEModel.heads` is the forward after the tower: a probe trains what predict would compute."""
    torch.manual_seed(0)
    from conftest import section_params
    model = create_model(section_params(ModelParams, "model")).eval()
    assert isinstance(model, VCEModel)
    images = torch.randn(2, 3, model.preprocess["image_size"], model.preprocess["image_size"])
    with torch.no_grad():
        whole = model(images)
        parts = model.heads(model.visual(images))
    assert torch.equal(whole["cls_logits"], parts["cls_logits"])
