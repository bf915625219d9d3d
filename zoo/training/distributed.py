"""torchrun support: process-group setup (gloo on CPU, nccl on CUDA), broadcasting rank 0's values, and metric
reduction. Everything is a no-op in a single process.

The processes of one group are started by torchrun (its variables: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, ...)
or by SLURM's ``srun`` with several tasks (``srun --ntasks=2 python train.py``), whose variables say the same
(SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID, the step's first node): :func:`slurm_group_env`."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
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


def slurm_group_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """torchrun's variables for a process that ``srun`` started as one of several tasks of a job step (none when
    torchrun started it, or when the step has one task): rank and world from SLURM_PROCID and SLURM_STEP_NUM_TASKS,
    the local rank and local world from SLURM_LOCALID and the tasks on this node, the rendezvous on the step's first
    node at a port derived from the job id."""
    tasks = environ.get("SLURM_STEP_NUM_TASKS", "")
    if "WORLD_SIZE" in environ or not tasks.isdigit() or int(tasks) < 2 or "SLURM_PROCID" not in environ:
        return {}
    local_tasks = environ.get("SLURM_STEP_TASKS_PER_NODE", tasks).split("(")[0].split(",")[0]
    return {"RANK": environ["SLURM_PROCID"], "WORLD_SIZE": tasks, "LOCAL_RANK": environ.get("SLURM_LOCALID", "0"),
            "LOCAL_WORLD_SIZE": local_tasks if local_tasks.isdigit() else tasks,
            "MASTER_ADDR": environ.get("MASTER_ADDR") or _first_node(environ.get("SLURM_STEP_NODELIST", "")),
            "MASTER_PORT": environ.get("MASTER_PORT") or str(20000 + int(environ.get("SLURM_JOB_ID", "0")) % 20000)}


def _first_node(nodelist: str) -> str:
    """The first host of a SLURM host list (``node[01-04]``), as ``scontrol show hostnames`` expands it."""
    if not nodelist:
        return "127.0.0.1"
    try:
        shown = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30)
        hosts = shown.stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        hosts = []
    return hosts[0] if hosts else nodelist.split(",")[0]


def setup() -> DistInfo:
    """Join the torchrun process group once (idempotent); returns this process's rank and world size.

    Backend: gloo for CPU tensors and, where CUDA is available, nccl for CUDA tensors.
    """
    os.environ.update(slurm_group_env())
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
