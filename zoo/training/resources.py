"""What a training process sets up and reads about itself: seeds and determinism (:func:`seed_everything`), mixed
precision (:func:`autocast`), its peak memory (:func:`process_peak_memory`: the process's resident set, and CUDA's
peak where there is one), and its share of the machine's cores (:func:`set_threads`; :func:`share_cores` and
:class:`WaitedLock` while other jobs wait for its work)."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import Any

import torch

_log = logging.getLogger(__name__)


def process_peak_memory(device: torch.device) -> dict[str, float]:
    """Peak memory of this training process: allocated tensors on CUDA (since :func:`reset_peak_memory`), resident
    memory of the process on the CPU (its lifetime peak, as the OS counts it)."""
    if device.type == "cuda":
        return {"peak_allocated_mb": torch.cuda.max_memory_allocated(device) / 2**20,
                "peak_reserved_mb": torch.cuda.max_memory_reserved(device) / 2**20}
    return {"peak_rss_mb": peak_rss_mb()}


def peak_rss_mb() -> float:
    """This process's peak resident memory in MB: Linux's VmHWM (its own address space's high-water mark), else
    ru_maxrss (which on Linux also carries over a parent's peak into a child started from it)."""
    import resource

    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20


def reset_peak_memory(device: torch.device) -> str:
    """Start counting the peak anew: CUDA's allocator statistics; on Linux the process's resident high-water mark
    (``/proc/self/clear_refs``). Returns what the peak covers: ``training`` or, where it cannot be reset,
    ``process`` (the whole process's lifetime)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return "training"
    try:
        Path("/proc/self/clear_refs").write_text("5")  # 5: reset the peak resident set size (Linux 4.0+)
        return "training"
    except OSError:
        return "process"


def seed_everything(seed: int, deterministic: bool = True) -> None:
    """Seed Python, NumPy and torch; with `deterministic`, ask torch for deterministic kernels."""
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def _cgroup_cpus(root: Path) -> int | None:
    """The CPUs a cgroup's quota allows (v2 ``cpu.max``, v1 ``cpu/cpu.cfs_quota_us``), rounded up; None if unlimited."""
    try:
        if (root / "cpu.max").exists():
            quota, period = (root / "cpu.max").read_text().split()[:2]
        else:
            quota = (root / "cpu" / "cpu.cfs_quota_us").read_text().strip()
            period = (root / "cpu" / "cpu.cfs_period_us").read_text().strip()
    except (OSError, ValueError):
        return None
    if quota in ("max", "-1") or not quota.lstrip("-").isdigit() or not period.isdigit() or int(period) <= 0:
        return None
    return max(1, -(-int(quota) // int(period)))


def allocated_cores(cgroup_root: Path = Path("/sys/fs/cgroup")) -> tuple[int, str]:
    """The cores this process was given, and by whom: the fewest of the CPU affinity mask, a scheduler's allocation
    (``SLURM_CPUS_PER_TASK``) and the cgroup's CPU quota."""
    limits = [(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1),
               "the CPU affinity mask")]
    slurm = os.environ.get("SLURM_CPUS_PER_TASK", "")
    if slurm.isdigit() and int(slurm) > 0:
        limits.append((int(slurm), "SLURM_CPUS_PER_TASK"))
    quota = _cgroup_cpus(cgroup_root)
    if quota is not None:
        limits.append((quota, "the cgroup's CPU quota"))
    return min(limits, key=lambda limit: limit[0])


def set_threads(requested: int | None, sharing: int = 1, why: str = "alone") -> dict[str, Any]:
    """Set this process's torch threads for training and calibration (timing sets its own, per measurement).

    `requested` (``trainer.threads``) wins; else ``$OMP_NUM_THREADS`` when set; else the cores this process was given
    (:func:`allocated_cores`: a SLURM job's allocation, not the machine's) divided by the `sharing` jobs that run on
    them at once (a joblib study's workers, torchrun's local processes): jobs that each took every core would fight
    over them (17x slower seen on a 2-core machine). Returns what was set and why, for ``results.json``."""
    cores, cores_from = allocated_cores()
    env = os.environ.get("OMP_NUM_THREADS", "")
    if requested is not None:
        threads, source = int(requested), "trainer.threads"
    elif env.isdigit() and int(env) > 0:
        threads, source = int(env), "OMP_NUM_THREADS"
    else:
        threads, source = max(1, cores // max(1, sharing)), f"auto: the cores / {max(1, sharing)} job(s) ({why})"
    torch.set_num_threads(threads)
    _SHARE.clear()
    if requested is None and sharing > 1:  # ours to change while the jobs sharing the cores wait (share_cores)
        _SHARE.update(cores=cores, sharing=sharing, threads=threads)
    return {"threads": threads, "cores": cores, "cores_from": cores_from, "jobs_sharing_cores": max(1, sharing),
            "from": source}


_SHARE: dict[str, int] = {}  # set by set_threads when the thread count is the cores shared out, not asked for


def share_cores(idle_jobs: int) -> int:
    """Take the cores of `idle_jobs` jobs that wait for this one (on a shared baseline): threads become the cores
    divided by the jobs still working. Only a count that :func:`set_threads` shared out itself changes (never one set
    by ``trainer.threads``); ``share_cores(0)`` gives the cores back. Returns the threads now set."""
    if not _SHARE:
        return torch.get_num_threads()
    threads = max(1, _SHARE["cores"] // max(1, _SHARE["sharing"] - idle_jobs))
    if threads != torch.get_num_threads():
        _log.info("threads: %d (%d of %d jobs sharing the cores wait for this one)", threads, idle_jobs,
                  _SHARE["sharing"])
        torch.set_num_threads(threads)
    return threads


class WaitedLock:
    """A file lock around work that other jobs wait for (a cached baseline). A process that finds it held marks
    itself waiting (``<lock>.waiting/<host>-<pid>``) until it gets it, so the holder can count the jobs on this
    machine that wait for it (:meth:`waiters`) and take their cores (:func:`share_cores`)."""

    def __init__(self, path: str | Path):
        from filelock import FileLock

        self.lock = FileLock(str(path))
        self.waiting = Path(f"{path}.waiting")

    def __enter__(self) -> WaitedLock:
        from filelock import Timeout

        try:
            self.lock.acquire(timeout=0)
        except Timeout:
            marker = self.waiting / f"{_host()}-{os.getpid()}"
            try:
                self.waiting.mkdir(exist_ok=True)
                marker.touch()
            except OSError:
                marker = None  # no marker: the holder does not count this job, nothing else changes
            try:
                self.lock.acquire()
            finally:
                if marker is not None:
                    marker.unlink(missing_ok=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self.lock.release()

    def waiters(self) -> int:
        """The live processes on this machine waiting for the lock (markers of dead ones are removed)."""
        count = 0
        for marker in self.waiting.glob(f"{_host()}-*") if self.waiting.is_dir() else ():
            pid = marker.name.rsplit("-", 1)[-1]
            if pid.isdigit() and _alive(int(pid)):
                count += 1
            else:
                marker.unlink(missing_ok=True)
        return count


def _host() -> str:
    import socket

    return socket.gethostname().replace("-", "_")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
