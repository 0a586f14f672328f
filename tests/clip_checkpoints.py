"""Write small open_clip checkpoints of the real layout: a local-dir folder, a Hugging Face cache.

The files are what an offline copy of `microsoft/BiomedCLIP-PubMedBERT_256-vit_base_patch16_224`
holds (open_clip_config.json + open_clip_pytorch_model.bin), at the tiny size.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import open_clip
import torch

from vce.model.clip_source import PACKAGED_SOURCES

REPO_ID = "test-org/tiny-clip"


def tiny_config(**preprocess) -> dict:
    config = json.loads(PACKAGED_SOURCES["tiny"].read_text())
    config["preprocess_cfg"].update(preprocess)
    return config


def write_local_dir(folder: Path, config: dict | None = None, weights: bool = True,
                    seed: int = 0) -> open_clip.CLIP:
    """Folder with open_clip_config.json (+ weights); returns the CLIP whose weights it holds."""
    config = config or tiny_config()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "open_clip_config.json").write_text(json.dumps(config))
    torch.manual_seed(seed)
    clip = open_clip.CLIP(**config["model_cfg"]).eval()
    if weights:
        torch.save(clip.state_dict(), folder / "open_clip_pytorch_model.bin")
    return clip


def write_hub_cache(cache_dir: Path, source_folder: Path, repo_id: str = REPO_ID) -> Path:
    """A huggingface_hub cache holding `source_folder`'s files as repo `repo_id` at `main`."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache_dir / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for file in source_folder.iterdir():
        shutil.copy(file, snapshot / file.name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return cache_dir


def write_hf_text_local_dir(folder: Path, words: list[str]) -> open_clip.CustomTextCLIP:
    """BiomedCLIP's layout in miniature: timm image tower + HF BERT text tower, offline files.

    Besides open_clip_config.json and the weights, the folder holds the text model's
    config.json and a BERT tokenizer (vocab.txt, tokenizer_config.json).
    """
    from transformers import BertConfig

    folder.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(set(words))
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "BertTokenizer", "do_lower_case": True}))
    BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
               intermediate_size=64, max_position_embeddings=64).save_pretrained(folder)
    config = tiny_config()
    config["model_cfg"]["text_cfg"] = {
        "hf_model_name": "test-org/tiny-bert", "hf_tokenizer_name": "test-org/tiny-bert",
        "hf_proj_type": "mlp", "hf_pooler_type": "cls_last_hidden_state_pooler", "context_length": 16,
    }
    (folder / "open_clip_config.json").write_text(json.dumps(config))
    text_cfg = dict(config["model_cfg"]["text_cfg"], hf_model_name=str(folder), hf_model_pretrained=False)
    torch.manual_seed(0)
    clip = open_clip.CustomTextCLIP(**dict(config["model_cfg"], text_cfg=text_cfg)).eval()
    torch.save(clip.state_dict(), folder / "open_clip_pytorch_model.bin")
    return clip
