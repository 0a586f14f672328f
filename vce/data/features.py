"""A frozen backbone's frame features, computed once (stage `embed`) and read by train and predict.

With `train.freeze_backbone: true` the image tower never changes, so its output for a frame is
one fixed vector: the embed stage computes it once per frame into `data/embed/`, the probe heads
train on those vectors in seconds, and predict applies the trained heads to the same vectors (its
embeddings output, which the temporal stage reads, is these bytes). A head setting swept with
`dvc exp run -S` then reruns train and predict, never the backbone.

Layout of `data/embed/`:
- `meta.json`: `enabled` (false: `train.freeze_backbone` is off and nothing else is written), the
  model source, `backbone` (`backbone_fingerprint` of the tower that computed the features) and
  the frame counts;
- `labelled.parquet`: every frame of the split index (all folds), `test.parquet`: the test set;
  columns video_id, frame, valid (false: the frame could not be decoded) and `embedding`, a
  float16 vector (the embeddings contract, `vce.core.contracts.embeddings_schema`, plus valid).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from vce.core.errors import DataError
from vce.core.io import read_json, write_json

META = "meta.json"
PARTS = ("labelled", "test")


def backbone_fingerprint(tower) -> str:
    """Hash of the image tower's weights and buffers (names, dtypes, shapes, bytes): the features'
    identity. The probe refuses features computed by another tower (another source, seed or init)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(tower.state_dict().items()):
        value = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{value.dtype}:{tuple(value.shape)}".encode())
        digest.update(value.view(-1).view(torch.uint8).numpy().tobytes() if value.numel() else b"")
    return digest.hexdigest()[:16]


def write_disabled(out: str | Path) -> None:
    """`train.freeze_backbone: false`: the folder says so (a constant output, nothing to recompute)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for part in PARTS:
        (out / f"{part}.parquet").unlink(missing_ok=True)
    write_json(out / META, {"enabled": False})


def read_meta(folder: str | Path) -> dict:
    """`meta.json` of an embed folder; a missing folder or file is an error naming it."""
    path = Path(folder) / META
    if not path.is_file():
        raise DataError(f"{path}: no frame features (run the embed stage: `dvc repro embed`)")
    return read_json(path, "frame features meta")


def features_table(video_ids: np.ndarray, frames: np.ndarray, valid: np.ndarray, embeddings: pa.Array) -> pa.Table:
    """One block of a features file: the embeddings contract's columns plus valid."""
    return pa.table({"video_id": pa.array(video_ids.astype(str)), "frame": pa.array(frames.astype(np.int64)),
                     "valid": pa.array(valid.astype(bool)), "embedding": embeddings})


def read_features(folder: str | Path, part: str, rows: pd.DataFrame, backbone: str) -> tuple[np.ndarray, np.ndarray]:
    """(features (N, D) float16, valid (N,)) of `rows` (video_id, frame), in their order.

    Checks that the features were computed by the tower `backbone` names, and that every row has
    one: a missing frame or another tower is an error naming the file and what to rerun.
    """
    folder = Path(folder)
    meta = read_meta(folder)
    if not meta.get("enabled"):
        raise DataError(f"{folder / META}: no frame features (train.freeze_backbone was false when the embed "
                        "stage ran): rerun it")
    if meta.get("backbone") != backbone:
        raise DataError(f"{folder / META}: features of another backbone ({meta.get('backbone')}, "
                        f"{meta.get('source')}) than this model's ({backbone}): rerun the embed stage")
    path = folder / f"{part}.parquet"
    if not path.is_file():
        raise DataError(f"{path}: missing (rerun the embed stage)")
    table = pq.read_table(path)
    keys = pd.DataFrame({"video_id": table.column("video_id").to_numpy(zero_copy_only=False).astype(str),
                         "frame": table.column("frame").to_numpy(), "position": np.arange(table.num_rows)})
    wanted = pd.DataFrame({"video_id": rows["video_id"].astype(str).to_numpy(), "frame": rows["frame"].to_numpy()})
    found = wanted.merge(keys, on=["video_id", "frame"], how="left", validate="many_to_one")
    if found["position"].isna().any():
        first = found[found["position"].isna()].iloc[0]
        raise DataError(f"{path}: no features for {int(found['position'].isna().sum())} frame(s), e.g. video "
                        f"{first['video_id']} frame {first['frame']}: rerun the embed stage")
    position = found["position"].to_numpy(np.int64)
    column = table.column("embedding").combine_chunks()
    dim = column.type.list_size
    values = column.flatten().to_numpy(zero_copy_only=False).astype(np.float16).reshape(-1, dim)
    valid = table.column("valid").to_numpy(zero_copy_only=False).astype(bool)
    return values[position], valid[position]
