"""torchrun support: process-group setup (gloo on CPU, nccl on CUDA), a start time shared by all ranks
(one output directory), and metric reduction. Everything is a no-op in a single process."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime

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


_START_TIME: datetime | None = None


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


START_TIME_ENV = "DEPTHZOO_START_TIME"


def shared_start_time() -> datetime:
    """The run's start time, the same in every process of the run, so ``${dz_now:...}`` names one directory.

    Rank 0's time is broadcast to the other DDP ranks; the time is also exported as ``DEPTHZOO_START_TIME`` so
    that the worker processes of a multirun launcher (joblib, submitit) resolve the same sweep directory.
    """
    global _START_TIME
    if _START_TIME is None:
        inherited = os.environ.get(START_TIME_ENV)
        stamp = [datetime.fromisoformat(inherited) if inherited else datetime.now()]
        if setup().enabled:
            dist.broadcast_object_list(stamp, src=0)
        _START_TIME = stamp[0]
        os.environ[START_TIME_ENV] = _START_TIME.isoformat()
    return _START_TIME


def register_resolvers() -> None:
    """Register the ``dz_now`` OmegaConf resolver (like Hydra's ``now`` but equal on every rank)."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("dz_now"):
        OmegaConf.register_new_resolver("dz_now", lambda fmt: shared_start_time().strftime(fmt))


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
