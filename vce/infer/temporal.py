"""Temporal refinement: a dilated temporal convolution network over per-frame embeddings.

The frame model sees one frame at a time; in a capsule video findings persist over consecutive
frames and regions last thousands of frames, so a frame's neighbours say much about it. This
module trains a light sequence model on the frozen embeddings `predict` writes
(`predict.embeddings: true`) and outputs refined probabilities in the probabilities contract
(video_id, frame, 17 float32 label columns, valid), so thresholds, events and score run on them
unchanged (`post.probs: temporal`).

Model (a non-causal TCN; Bai et al. 2018, "An Empirical Evaluation of Generic Convolutional and
Recurrent Networks for Sequence Modeling", with centred instead of causal padding since whole
videos are available offline): standardised embeddings → Linear(D, hidden) → one residual
block per dilation d, x ← x + Dropout(GELU(Conv1d_k,d(LayerNorm(x)))) → Linear(hidden, 17).
The receptive field is 1 + (k − 1)·Σd frames (127 with k = 3 and dilations 1..32). Chosen
over windowed self-attention: linear in video length, no window edges, a few seconds on CPU.

Training: random crops of `chunk_frames` consecutive frames of the training videos (a video
shorter than that is one zero-padded, masked crop), `batch_chunks` crops per step, `steps`
AdamW steps; loss = the frame model's asymmetric focal loss (vce.train.losses, params `loss`) with
its label smoothing, averaged over valid frames. Inference runs each whole video at once.
Frames are taken in frame order; gaps in the numbering are not modelled. Invalid frames
(undecodable) enter as the mean embedding, are left out of the loss, and keep valid=False and
NaN probabilities in the output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.nn as nn
from pydantic import Field

from vce.core.contracts import check_unique_keys, parquet_schema
from vce.core.errors import DataError
from vce.core.labels import LABELS, NUM_LABELS
from vce.core.params import OddInt, Section
from vce.post.timeline import match_frames
from vce.train.losses import LossParams, asymmetric_loss, masked_frame_loss


class TemporalParams(Section):
    """`temporal`: the dilated TCN over frame embeddings."""

    hidden: int = Field(ge=1)
    kernel_size: OddInt
    dilations: list[Annotated[int, Field(ge=1)]] = Field(min_length=1)
    dropout: float = Field(ge=0, lt=1)
    steps: int = Field(ge=1)
    batch_chunks: int = Field(ge=1)
    chunk_frames: int = Field(ge=1)
    lr: float = Field(gt=0)
    weight_decay: float = Field(ge=0)
    device: Literal["auto", "cpu", "cuda"]
    cross_fit: int = Field(ge=2)


# ----------------------------------------------------------------------------- data


@dataclass
class Sequences:
    """Frames of several videos, sorted by (video_id, frame), with per-video row offsets."""

    frames: pd.DataFrame  # video_id, frame
    embeddings: np.ndarray  # (N, D) float32
    valid: np.ndarray  # (N,) bool
    labels: np.ndarray | None  # (N, 17) uint8, or None for unlabelled frames
    offsets: np.ndarray  # (V + 1,) first row of each video, then N


def read_embeddings(path) -> tuple[pd.DataFrame, np.ndarray]:
    """(video_id, frame) rows sorted by video and frame, and their (N, D) float32 embeddings."""
    parquet_schema(path)  # a file that is not Parquet: one line naming it
    table = pq.read_table(path)
    missing = [c for c in ("video_id", "frame", "embedding") if c not in table.column_names]
    if missing:
        raise DataError(f"{path}: not an embeddings file (lacks column(s) {missing})")
    column = table.column("embedding").combine_chunks()
    if not pa.types.is_fixed_size_list(column.type):
        raise DataError(f"{path}: embedding column must be a fixed-size list, got {column.type}")
    dim = column.type.list_size
    embeddings = column.flatten().to_numpy(zero_copy_only=False).astype(np.float32).reshape(-1, dim)
    frames = pd.DataFrame({"video_id": table.column("video_id").to_numpy(zero_copy_only=False).astype(str),
                           "frame": table.column("frame").to_numpy().astype(np.int64)})
    check_unique_keys(frames, path)
    finite = np.isfinite(embeddings).all(axis=1)
    if not finite.all():  # float16 overflow or a NaN model: the TCN would spread it over the video
        row = int(np.flatnonzero(~finite)[0])
        raise DataError(f"{path}: embedding of video {frames['video_id'].iloc[row]} frame "
                        f"{frames['frame'].iloc[row]} (row {row}) is not finite ({int((~finite).sum())} such row(s))")
    order = np.lexsort((frames["frame"].to_numpy(), frames["video_id"].to_numpy()))
    return frames.iloc[order].reset_index(drop=True), embeddings[order]


def build_sequences(frames: pd.DataFrame, embeddings: np.ndarray, valid: np.ndarray | None = None,
                    labels: np.ndarray | None = None) -> Sequences:
    """Sequences from rows already sorted by (video_id, frame)."""
    n = len(frames)
    video_ids = frames["video_id"].to_numpy()
    starts = np.flatnonzero(np.r_[True, video_ids[1:] != video_ids[:-1]]) if n else np.zeros(0, np.int64)
    return Sequences(frames=frames[["video_id", "frame"]].reset_index(drop=True),
                     embeddings=np.asarray(embeddings, np.float32),
                     valid=np.ones(n, bool) if valid is None else np.asarray(valid, bool),
                     labels=labels, offsets=np.append(starts, n).astype(np.int64))


def sequences_of_videos(seq: Sequences, videos: set[str]) -> Sequences:
    """The rows of `seq` whose video is in `videos`, whole videos, order kept."""
    keep = seq.frames["video_id"].astype(str).isin(videos).to_numpy()
    return build_sequences(seq.frames[keep].reset_index(drop=True), seq.embeddings[keep], seq.valid[keep],
                           None if seq.labels is None else seq.labels[keep])


def align(frames: pd.DataFrame, other: pd.DataFrame, columns: list[str], where: str) -> pd.DataFrame:
    """`other`'s `columns` for each (video_id, frame) row of `frames`; every row must match."""
    keys = frames[["video_id", "frame"]].astype({"video_id": str})
    right = other[["video_id", "frame", *columns]].astype({"video_id": str})
    return match_frames(keys, right, f"embedding row(s) have no match in {where}")[columns]


# ----------------------------------------------------------------------------- model


class TemporalBlock(nn.Module):
    def __init__(self, hidden: int, kernel_size: int, dilation: int, dropout: float):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.conv = nn.Conv1d(hidden, hidden, kernel_size, dilation=dilation, padding=dilation * (kernel_size - 1) // 2)
        self.act = nn.GELU()
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, H)
        y = self.conv(self.norm(x).transpose(1, 2)).transpose(1, 2)  # (B, H, T) -> (B, T, H)
        return x + self.drop(self.act(y))


class TemporalConvNet(nn.Module):
    """(B, T, D) embeddings -> (B, T, 17) logits; the input standardisation is part of the model."""

    def __init__(self, embed_dim: int, params: TemporalParams):
        super().__init__()
        self.register_buffer("mean", torch.zeros(embed_dim))
        self.register_buffer("std", torch.ones(embed_dim))
        self.inp = nn.Linear(embed_dim, params.hidden)
        self.blocks = nn.ModuleList(TemporalBlock(params.hidden, params.kernel_size, d, params.dropout)
                                    for d in params.dilations)
        self.head = nn.Sequential(nn.LayerNorm(params.hidden), nn.Linear(params.hidden, NUM_LABELS))

    def forward(self, embeddings: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        x = (embeddings - self.mean) / self.std * valid.unsqueeze(-1)  # invalid frames -> the mean
        x = self.inp(x)  # (B, T, H)
        for block in self.blocks:
            x = block(x)
        return self.head(x)  # (B, T, 17)


def _crop_batch(seq: Sequences, chunk: int, count: int, rng: np.random.Generator):
    """`count` random crops of `chunk` frames: (B, C, D) embeddings, (B, C) valid, (B, C, 17) labels.

    C is `chunk` cut to the longest video: a crop never holds more padding than the shortest
    crop needs. (Without the cut, validation videos of 60 frames were trained in crops of 256,
    4x the work of their frames: 147 s for 120 frames, issue 51. Videos as long as the chunk
    draw the same crops either way.)"""
    lengths = np.diff(seq.offsets)
    chunk = min(chunk, int(lengths.max()))
    video = rng.choice(len(lengths), size=count, p=lengths / lengths.sum())
    start = seq.offsets[video] + (rng.random(count) * np.maximum(lengths[video] - chunk + 1, 1)).astype(np.int64)
    take = np.minimum(lengths[video], chunk)
    rows = start[:, None] + np.arange(chunk)[None, :]  # (B, C)
    inside = np.arange(chunk)[None, :] < take[:, None]
    rows = np.where(inside, rows, 0)
    return seq.embeddings[rows], seq.valid[rows] & inside, seq.labels[rows]


def temporal_loss(model: TemporalConvNet, embeddings: torch.Tensor, valid: torch.Tensor, labels: torch.Tensor,
                  loss_params: LossParams) -> torch.Tensor:
    """The frame model's ASL (its smoothing inside) averaged over valid frames only: invalid and
    padded frames (valid False) carry no label and add nothing to the loss or its gradient."""
    logits = model(embeddings, valid.float())  # (B, C, 17)
    per_label = asymmetric_loss(logits, labels.float(), loss_params.gamma_pos, loss_params.gamma_neg,
                                loss_params.clip, loss_params.eps, loss_params.label_smoothing)
    return masked_frame_loss(per_label, valid)


def train_temporal(train: Sequences, params: TemporalParams, loss_params: LossParams, seed: int,
                   device: torch.device) -> tuple[TemporalConvNet, list[float]]:
    """Train on random crops of the training videos; returns the model (eval mode) and step losses.

    On the CPU the steps run on one thread: a step's tensors are small ((8, 256, 64) at the
    defaults) and a second OpenMP thread costs more than it does. Measured on the 2-core machine
    at load ~8 (issue 51), 100 steps: 42 frames 1.7 CPU-s / 2.3 s wall on one thread against
    13.1 / 19.3 on two; 3,000 frames 5.4 / 14.6 against 23.2 / 48.7. (`base.exact_cpu` pins one
    thread anyway: the demo's bytes do not change.)"""
    if train.labels is None or len(train.frames) == 0:
        raise DataError("temporal: no labelled training frames")
    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)
    try:
        return _train(train, params, loss_params, seed, device)
    finally:
        torch.set_num_threads(threads)


def _train(train: Sequences, params: TemporalParams, loss_params: LossParams, seed: int,
           device: torch.device) -> tuple[TemporalConvNet, list[float]]:
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = TemporalConvNet(train.embeddings.shape[1], params)
    usable = train.embeddings[train.valid]
    model.mean.copy_(torch.from_numpy(usable.mean(axis=0)))
    model.std.copy_(torch.from_numpy(usable.std(axis=0) + 1e-6))
    model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=params.lr, weight_decay=params.weight_decay,
                                  fused=True)  # exact sqrt, not MKL VML's (vce/core/exact.py)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=params.lr, total_steps=params.steps, pct_start=0.1)
    losses = []
    for _ in range(params.steps):
        embeddings, valid, labels = _crop_batch(train, params.chunk_frames, params.batch_chunks, rng)
        loss = temporal_loss(model, torch.from_numpy(embeddings).to(device), torch.from_numpy(valid).to(device),
                             torch.from_numpy(labels).to(device), loss_params)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    return model.eval(), losses


@torch.no_grad()
def refine(model: TemporalConvNet, seq: Sequences, device: torch.device) -> np.ndarray:
    """(N, 17) float32 refined probabilities, each video at once; NaN on invalid frames."""
    probs = np.full((len(seq.frames), NUM_LABELS), np.nan, np.float32)
    for first, end in zip(seq.offsets[:-1], seq.offsets[1:]):
        embeddings = torch.tensor(seq.embeddings[first:end], device=device)[None]  # (1, T, D)
        valid = torch.tensor(seq.valid[first:end], device=device).float()[None]  # (1, T)
        probs[first:end] = torch.sigmoid(model(embeddings, valid))[0].float().cpu().numpy()
    probs[~seq.valid] = np.nan
    return probs


def probs_frame(seq: Sequences, probs: np.ndarray) -> pd.DataFrame:
    """The probabilities contract: video_id, frame, 17 float32 label columns, valid."""
    table = seq.frames[["video_id", "frame"]].copy()
    table["video_id"] = table["video_id"].astype(str)
    table["frame"] = table["frame"].astype(np.int64)
    for k, label in enumerate(LABELS):
        table[label] = probs[:, k].astype(np.float32)
    table["valid"] = seq.valid.astype(bool)
    return table


def save_temporal(path, model: TemporalConvNet | None, params: TemporalParams, routes: dict[str, str]) -> None:
    """The trained sequence model (or, when there is none, a file that says so) and each label's
    route (`vce.infer.route`: what `post.probs: auto` chose; detect mixes the same way)."""
    from vce.model.checkpoint import save

    state = None if model is None else {k: v.detach().cpu() for k, v in model.state_dict().items()}
    save(path, {"enabled": model is not None, "params": params.model_dump(), "state_dict": state,
                "embed_dim": None if model is None else int(model.mean.numel()), "routes": dict(routes)})


def load_routes(path) -> dict[str, str] | None:
    """The per-label routes `save_temporal` recorded (None in a file written before routes)."""
    from vce.model.checkpoint import load

    return load(path).get("routes")


def load_temporal(path) -> TemporalConvNet | None:
    """The model `save_temporal` wrote (eval mode, CPU), or None when the stage was disabled."""
    from vce.model.checkpoint import load

    payload = load(path)
    if not payload.get("enabled"):
        return None
    try:
        model = TemporalConvNet(payload["embed_dim"], TemporalParams.model_validate(payload["params"]))
        model.load_state_dict(payload["state_dict"])
    except (KeyError, TypeError, ValueError, RuntimeError) as err:  # another version's or architecture's file
        reason = " ".join(str(err).split())[:200] or type(err).__name__
        raise DataError(f"{path}: not a temporal model this version loads ({type(err).__name__}: {reason})") from None
    return model.eval()
