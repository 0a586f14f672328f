"""Prompt embeddings: computed once by the text tower, stored as plain data, read back checked."""

import importlib.util

import open_clip
import pytest
import torch
from clip_checkpoints import write_hf_text_local_dir, write_local_dir
from conftest import ROOT, section_params, write_params

from vce.core.labels import LABELS, NUM_LABELS
from vce.model.frame_model import ModelParams, SourceError, create_model
from vce.model.prompts import (
    DEFAULT_TEMPLATES,
    compute_prompt_embeddings,
    load_prompt_embeddings,
    prompt_texts,
    save_prompt_embeddings,
)

_spec = importlib.util.spec_from_file_location("stage_prompts", ROOT / "stages" / "prompts.py")
prompts_stage = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(prompts_stage)

TEMPLATES = ["a video capsule endoscopy image showing {label}", "an endoscopy frame of {label}"]


def test_prompt_texts_are_label_major():
    texts = prompt_texts(TEMPLATES)
    assert len(texts) == 2 * NUM_LABELS
    assert texts[0] == "a video capsule endoscopy image showing mouth"
    assert texts[1] == "an endoscopy frame of mouth"
    assert texts[-1] == "an endoscopy frame of ulcer"


def test_tiny_embeddings_shape_and_seed_determinism():
    torch.manual_seed(1)
    first = compute_prompt_embeddings(section_params(ModelParams, "model"), TEMPLATES)
    torch.manual_seed(1)
    again = compute_prompt_embeddings(section_params(ModelParams, "model"), TEMPLATES)
    assert first.shape == (NUM_LABELS, 2, 64)
    torch.testing.assert_close(first, again, rtol=0, atol=0)
    assert not torch.allclose(first[0, 0], first[1, 0])  # labels give different texts


def test_file_round_trip_with_weights_only(tmp_path):
    embeddings = torch.randn(NUM_LABELS, 2, 64)
    path = tmp_path / "models" / "prompt_embeddings.pt"
    save_prompt_embeddings(path, embeddings, TEMPLATES, "tiny")
    payload = torch.load(path, weights_only=True)
    assert payload["labels"] == list(LABELS) and payload["templates"] == TEMPLATES
    assert payload["source"] == "tiny"
    torch.testing.assert_close(load_prompt_embeddings(path), embeddings)
    assert [p.name for p in path.parent.iterdir()] == ["prompt_embeddings.pt"]  # no temp left
    model = create_model(section_params(ModelParams, "model"), load_prompt_embeddings(path))
    assert model.label_text_embeddings.shape == (NUM_LABELS, 64)


def test_file_with_other_labels_or_missing_is_named(tmp_path):
    path = tmp_path / "prompts.pt"
    torch.save({"labels": list(LABELS[::-1]), "embeddings": torch.zeros(17, 64)}, path)
    with pytest.raises(ValueError, match=f"{path}.*labels"):
        load_prompt_embeddings(path)
    with pytest.raises(ValueError, match="not found"):
        load_prompt_embeddings(tmp_path / "absent.pt")
    assert load_prompt_embeddings(None) is None


def test_local_dir_open_clip_text_tower_runs_the_real_loader(tmp_path):
    clip = write_local_dir(tmp_path / "ckpt", seed=3)
    embeddings = compute_prompt_embeddings(section_params(ModelParams, "model", source=f"local-dir:{tmp_path / 'ckpt'}"),
                                           DEFAULT_TEMPLATES)
    tokenizer = open_clip.SimpleTokenizer(context_length=32)
    with torch.no_grad():
        expected = clip.encode_text(tokenizer(prompt_texts(DEFAULT_TEMPLATES)))
    torch.testing.assert_close(embeddings[:, 0], expected)


def test_local_dir_hf_text_tower_offline(tmp_path):
    """BiomedCLIP's layout (HF BERT text tower) from a folder: config + tokenizer read there."""
    words = " ".join(prompt_texts(DEFAULT_TEMPLATES)).replace("-", " - ").split()
    clip = write_hf_text_local_dir(tmp_path / "ckpt", words)
    source = f"local-dir:{tmp_path / 'ckpt'}"
    embeddings = compute_prompt_embeddings(section_params(ModelParams, "model", source=source), DEFAULT_TEMPLATES)
    tokenizer = open_clip.get_tokenizer(source)
    with torch.no_grad():
        expected = clip.encode_text(tokenizer(prompt_texts(DEFAULT_TEMPLATES)))
    torch.testing.assert_close(embeddings[:, 0], expected)  # the checkpoint's weights, not random
    (tmp_path / "ckpt" / "config.json").unlink()
    with pytest.raises(SourceError, match="config.json"):
        compute_prompt_embeddings(section_params(ModelParams, "model", source=source), DEFAULT_TEMPLATES)


def test_missing_weights_are_an_error_not_random(tmp_path):
    write_local_dir(tmp_path / "ckpt", weights=False)
    with pytest.raises(SourceError, match="no pretrained weights"):
        compute_prompt_embeddings(section_params(ModelParams, "model", source=f"local-dir:{tmp_path / 'ckpt'}"), TEMPLATES)


def test_random_source_gives_seeded_vectors_of_biomedclip_width():
    torch.manual_seed(0)
    embeddings = compute_prompt_embeddings(section_params(ModelParams, "model", source="random"), TEMPLATES)
    assert embeddings.shape == (NUM_LABELS, 2, 512)


def test_stage_writes_the_file_and_reports_bad_templates(tmp_path, capsys):
    params = write_params(tmp_path / "params.yaml", model={"source": "tiny"},
                          prompts={"templates": ["capsule image of {label}"]})
    out = tmp_path / "prompt_embeddings.pt"
    assert prompts_stage.main(["--params", str(params), "--out", str(out)]) == 0
    assert load_prompt_embeddings(out).shape == (NUM_LABELS, 1, 64)
    write_params(params, model={"source": "tiny"}, prompts={"templates": ["no label"]})
    assert prompts_stage.main(["--params", str(params), "--out", str(out)]) == 2
    assert "prompts.templates[0] = 'no label': has no {label} placeholder" in capsys.readouterr().err
