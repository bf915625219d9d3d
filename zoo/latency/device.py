"""Device and dtype selection, and the context every timed run happens in.

``device="auto"`` means CUDA when available, else CPU with a logged warning. An unavailable device or a dtype
the device cannot run raises :class:`LatencyDeviceError` (a ``ValueError``) before anything is measured.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import logging
import platform
from collections.abc import Iterator

import torch

from ..errors import LatencyDeviceError

logger = logging.getLogger("zoo.latency")

DTYPE_NAMES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}
SUPPORTED_DTYPES = {"cpu": ("float32", "bfloat16"), "cuda": ("float32", "bfloat16", "float16")}


@functools.cache
def _warn_cpu_fallback() -> None:
    """Once per process: ``device=auto`` found no GPU."""
    logger.warning("device=auto: no CUDA device available, so these latencies are CPU latencies.")


def resolve_device(device: str | torch.device | None = "auto", index: int | None = None,
                   warn_fallback: bool = True) -> torch.device:
    """The torch device for `device` (``auto``, ``cpu``, ``cuda``, ``cuda:N``); raises :class:`LatencyDeviceError` if
    it is not available.

    ``auto`` is CUDA when available, else the CPU (with `warn_fallback`, logged once per process: the latencies
    measured there are CPU latencies). `index`: the CUDA device that ``auto`` and ``cuda`` stand for (default: the
    current one; a torchrun process passes its local rank).
    """
    if device is None or str(device) == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device() if index is None else index)
        if warn_fallback:
            _warn_cpu_fallback()
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise LatencyDeviceError(
            f"Unknown device {device!r}. Allowed devices are 'auto', 'cpu', 'cuda' and 'cuda:N'."
        ) from None
    if dev.type == "cpu":
        return torch.device("cpu")
    if dev.type != "cuda":
        raise LatencyDeviceError(
            f"Device {device!r} is not supported for latency measurement; allowed are 'auto', 'cpu', 'cuda', 'cuda:N'."
        )
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if dev.index is not None:
        index = dev.index
    elif count:
        index = torch.cuda.current_device() if index is None else index
    else:
        index = 0
    if index >= count:
        raise LatencyDeviceError(
            f"Device {device!r} is not available: this machine has {count} CUDA device(s) "
            f"(torch {torch.__version__}, CUDA build {torch.version.cuda}). Use device='cpu' or device='auto', "
            f"which falls back to the CPU with a warning."
        )
    return torch.device("cuda", index)


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """The torch dtype for a name such as ``float32``/``bf16``/``fp16``, checked against what `device` supports."""
    if isinstance(dtype, torch.dtype):
        resolved = dtype
    elif str(dtype).lower().removeprefix("torch.") in DTYPE_NAMES:
        resolved = DTYPE_NAMES[str(dtype).lower().removeprefix("torch.")]
    else:
        raise LatencyDeviceError(
            f"Unknown dtype {dtype!r}. Allowed are float32 (fp32), bfloat16 (bf16) and float16 (fp16); "
            f"on {device.type}: {', '.join(SUPPORTED_DTYPES[device.type])}."
        )
    name = dtype_name(resolved)
    allowed = SUPPORTED_DTYPES[device.type]
    bf16_missing = device.type == "cuda" and resolved == torch.bfloat16 and not torch.cuda.is_bf16_supported()
    if name not in allowed or bf16_missing:
        raise LatencyDeviceError(
            f"dtype {name} is not supported for latency measurement on {device_name(device)} ({device.type}). "
            f"Allowed on {device.type}: {', '.join(a for a in allowed if not (bf16_missing and a == 'bfloat16'))}; "
            f"reduced precision runs as autocast (AMP) over float32 weights."
        )
    return resolved


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def device_name(device: torch.device) -> str:
    """A human-readable name: the GPU's name, or the CPU model from /proc/cpuinfo (else the architecture)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "cpu"


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# glibc's mallopt parameters (malloc.h): freed memory above the trim threshold goes back to the system, and buffers
# above the mmap threshold are fresh mmaps, page-faulted on every call. By default both thresholds are dynamic: the
# mmap threshold rises to the largest mmap'd buffer freed so far, at most 32 MiB, the trim threshold to twice that.
# Setting any of them ends the dynamic rule, so on exit they are set to where it ends up in a process that has freed
# a buffer of 32 MiB or more, as one running these networks has.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4
GLIBC_SETTLED = {M_MMAP_THRESHOLD: 32 * 2**20, M_TRIM_THRESHOLD: 64 * 2**20, M_MMAP_MAX: 65536}
KEEP_FREED = {M_TRIM_THRESHOLD: 2**31 - 1, M_MMAP_MAX: 0}
_kept_depth = 0


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def host_allocator() -> str:
    """How timed runs allocate host memory, part of every table's condition: ``glibc-keep-freed`` (see
    :func:`keep_freed_memory`) where the C library is glibc, else ``system``."""
    return "glibc-keep-freed" if _glibc() else "system"


@contextlib.contextmanager
def keep_freed_memory() -> Iterator[None]:
    """glibc keeps freed memory for reuse instead of returning it to the system (no mmap, no trim) while inside.

    Eager PyTorch re-lays a convolution's weights out for oneDNN on every call. Above 32 MiB (glibc's largest mmap
    threshold) that buffer is a fresh ``mmap``: a merged dense 3x3 conv of 2048 -> 512 channels page-faults 9217
    times per call and takes 27 ms instead of 14 ms on one thread, and what the faults cost moves with the memory's
    state (docs/latency.md, "Page faults"). Every timed run is inside this context; to serve at the latency a table
    predicts, run the network inside it too, or start the process with ``MALLOC_MMAP_MAX_=0
    MALLOC_TRIM_THRESHOLD_=2147483647`` (or jemalloc/tcmalloc). Re-entrant; on exit glibc's settled thresholds
    (mmap above 32 MiB, trim above 64 MiB) and a trim.
    """
    global _kept_depth
    libc = _glibc()
    if libc is not None and _kept_depth == 0:
        for param, value in KEEP_FREED.items():
            libc.mallopt(param, value)
    _kept_depth += 1
    try:
        yield
    finally:
        _kept_depth -= 1
        if libc is not None and _kept_depth == 0:
            for param, value in GLIBC_SETTLED.items():
                libc.mallopt(param, value)
            libc.malloc_trim(0)


@contextlib.contextmanager
def timing_context(device: torch.device, dtype: torch.dtype, threads: int) -> Iterator[None]:
    """Inference mode, autocast for reduced dtypes, a fixed CPU thread count, GC paused, denormals flushed, freed
    memory kept (:func:`keep_freed_memory`).

    ``torch.set_flush_denormal(True)`` stays on for the process afterwards (randomly initialised networks make
    denormal floats, which slow the CPU several-fold); the thread count is restored on exit.
    """
    if threads < 1:
        raise LatencyDeviceError(f"threads must be >= 1, got {threads}.")
    previous_threads = torch.get_num_threads()
    gc_was_enabled = gc.isenabled()
    torch.set_flush_denormal(True)
    torch.set_num_threads(threads)
    autocast = (torch.autocast(device_type=device.type, dtype=dtype, cache_enabled=False)
                if dtype != torch.float32 else contextlib.nullcontext())
    try:
        with torch.inference_mode(), autocast, keep_freed_memory(), (
                torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()):
            gc.collect()
            gc.disable()
            yield
    finally:
        if gc_was_enabled:
            gc.enable()
        torch.set_num_threads(previous_threads)
