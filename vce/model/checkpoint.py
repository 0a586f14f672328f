"""Model files and training state: tensors and plain data only, loaded with weights_only=True."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from vce.core.errors import DataError
from vce.core.io import atomic_path
from vce.core.labels import LABELS


def save(path, payload: dict) -> None:
    """torch.save atomically: a killed write never replaces a good file."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        torch.save(payload, f)  # a file object: the archive's inner name does not follow the temp name


def load(path, map_location="cpu") -> dict:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    # weights_only=True: a checkpoint from elsewhere cannot run code when loaded.
    return torch.load(path, map_location=map_location, weights_only=True)


def save_model(path, model, **info) -> None:
    """The file predict reads: architecture config, weights, and plain metadata."""
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    save(path, {"arch": model.arch_config, "state_dict": state, "labels": list(LABELS), **info})


def load_model(path, device="cpu"):
    """Rebuild the architecture from the file (no network) and load its weights."""
    from vce.model.frame_model import build_from_config

    payload = load(path)
    if payload.get("labels") != list(LABELS):
        raise DataError(f"{path}: model was trained on other labels: {payload.get('labels')}")
    model = build_from_config(payload["arch"])
    model.load_state_dict(payload["state_dict"])
    return model.to(device).eval(), payload


def fingerprint(*parts) -> str:
    """Stable hash of JSON-able parts: a checkpoint resumes only the run that wrote it."""
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
