"""Model files and training state: tensors and plain data only, loaded with weights_only=True."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import sys
from pathlib import Path

import torch

from vce.core.errors import DataError
from vce.core.io import atomic_path
from vce.core.labels import LABELS

PACKAGE = Path(__file__).resolve().parents[1]  # the vce package, whose source a resumed run must share


def save(path, payload: dict) -> None:
    """torch.save atomically: a killed write never replaces a good file."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        try:
            torch.save(payload, f)  # a file object: the archive's inner name does not follow the temp name
        except RuntimeError as err:  # torch's zip writer can report a failed write (disk full) as RuntimeError
            raise OSError(f"{path}: cannot write checkpoint ({str(err).splitlines()[0]})") from None


class CheckpointError(DataError):
    """A checkpoint file that is corrupt, truncated, or holds more than tensors and plain data."""


def load(path, map_location="cpu") -> dict:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    # weights_only=True: a checkpoint from elsewhere cannot run code when loaded.
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        # torch's own message suggests weights_only=False, i.e. running the file's code: never.
        what = "holds objects other than tensors and plain data (loading it could run code)" \
            if "global" in str(err).lower() else "is corrupt or not a checkpoint"
        raise CheckpointError(f"{path}: refused, the file {what}; only checkpoints written by "
                              "this project load") from None
    except (RuntimeError, EOFError, ValueError, OSError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise CheckpointError(f"{path}: not a readable checkpoint ({reason})") from None
    if not isinstance(payload, dict):
        raise CheckpointError(f"{path}: not a checkpoint of this project (holds {type(payload).__name__})")
    return payload


def load_train_state(path, map_location="cpu") -> dict | None:
    """The training state at `path`, or None (with a warning) when it is missing or unusable.

    The state is scratch that only speeds a rerun up: a corrupt or foreign file must not block
    training until someone deletes it, so it is ignored and training starts fresh.
    """
    if not Path(path).is_file():
        return None
    try:
        state = load(path, map_location)
    except CheckpointError as err:
        print(f"warning: ignoring the training state, starting fresh: {err}", file=sys.stderr)
        return None
    if "fingerprint" not in state:
        print(f"warning: ignoring the training state, starting fresh: {path} has no run fingerprint",
              file=sys.stderr)
        return None
    return state


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
    for key in ("arch", "state_dict"):
        if not isinstance(payload.get(key), dict):
            raise CheckpointError(f"{path}: not a model file of this project (no {key!r} mapping)")
    try:
        model = build_from_config(payload["arch"])
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        raise CheckpointError(f"{path}: its 'arch' does not build a model ({type(err).__name__}: "
                              f"{str(err).splitlines()[0] if str(err) else ''})") from None
    try:
        model.load_state_dict(payload["state_dict"])
    except RuntimeError as err:  # missing / unexpected keys, wrong shapes: another architecture's weights
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        raise CheckpointError(f"{path}: weights do not fit its architecture ({' '.join(lines[1:2] or lines[:1])[:300]})") \
            from None
    return model.to(device).eval(), payload


def fingerprint(*parts) -> str:
    """Stable hash of JSON-able parts and of what else decides the numbers (`run_environment`):
    a checkpoint resumes only the run that wrote it."""
    text = json.dumps([parts, run_environment()], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def run_environment(package: Path = PACKAGE) -> dict:
    """What a resumed run must share with the one that wrote the state besides its params: the
    package's source (a changed loss or model would continue another run's weights), torch's
    version and the CPU numerics settings (`base.exact_cpu`). Without it, a finished run in the
    scratch state folder outlives a code change and is handed back as the new run's model."""
    from vce.core.exact import MARKER, SETTINGS

    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    exact = {key: os.environ.get(key) for key in SETTINGS} if os.environ.get(MARKER) == "1" else None
    return {"source": digest.hexdigest(), "torch": torch.__version__, "exact_cpu": exact}
