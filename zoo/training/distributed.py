"""torchrun support: process-group setup (gloo on CPU, nccl on CUDA), broadcasting rank 0's values, and metric
reduction. Everything is a no-op in a single process."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_by_torchrun() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def setup() -> DistInfo:
    """Join the torchrun process group once (idempotent); returns this process's rank and world size.

    Backend: gloo for CPU tensors and, where CUDA is available, nccl for CUDA tensors.
    """
    if not launched_by_torchrun():
        return DistInfo()
    if not dist.is_initialized():
        backend = "gloo"
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            backend = "cpu:gloo,cuda:nccl"
        dist.init_process_group(backend=backend)
    return info()


def info() -> DistInfo:
    if not (dist.is_available() and dist.is_initialized()):
        return DistInfo()
    return DistInfo(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def broadcast_object(value: Any) -> Any:
    """Rank 0's `value` on every rank (joins the torchrun process group if needed); `value` in a single process."""
    if not setup().enabled:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over ranks (in place on a copy); identity in a single process."""
    if info().enabled:
        values = values.clone()
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def any_rank(flag: bool, device: torch.device) -> bool:
    """True when `flag` is set on any rank (used to stop all ranks together)."""
    if not info().enabled:
        return flag
    return bool(all_reduce_sum(torch.tensor([float(flag)], device=device)).item() > 0)


def barrier() -> None:
    if info().enabled:
        dist.barrier()


def cleanup() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
