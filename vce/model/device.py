"""Where tensors run: the device a stage asked for, and bf16 autocast on CUDA only."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


def resolve_device(name: str, key: str = "device") -> torch.device:
    """`auto` → this process's CUDA device (torchrun's LOCAL_RANK) if there is one, else CPU.

    `cuda` without a CUDA device is an error naming `key` (no silent CPU fallback).
    """
    if name == "auto":
        if torch.cuda.is_available():
            local_rank = int(os.environ.get("LOCAL_RANK", "0"))
            torch.cuda.set_device(local_rank)
            return torch.device("cuda", local_rank)
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        from vce.core.params import ParamsError

        raise ParamsError(f"{key} = cuda but no CUDA device is available")
    return torch.device(name)


def autocast(device: torch.device, bf16: bool):
    """bf16 autocast on CUDA when asked for; a no-op context elsewhere."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16 and device.type == "cuda")


@dataclass
class Distributed:
    rank: int = 0
    world: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup_distributed(device: torch.device) -> Distributed:
    """Join the torchrun process group when launched by torchrun, else a single process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Distributed()
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Distributed(dist.get_rank(), dist.get_world_size())
