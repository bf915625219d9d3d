"""Device and dtype selection, and the context every timed run happens in.

``device="auto"`` means CUDA when available, else CPU with a logged warning. An unavailable device or a dtype
the device cannot run raises :class:`LatencyDeviceError` (a ``ValueError``) before anything is measured.
"""

from __future__ import annotations

import contextlib
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


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """The torch device for `device` (``auto``, ``cpu``, ``cuda``, ``cuda:N``); raises if it is not available."""
    if device is None or str(device) == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
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
    index = torch.cuda.current_device() if dev.index is None and count else (dev.index or 0)
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


@contextlib.contextmanager
def timing_context(device: torch.device, dtype: torch.dtype, threads: int) -> Iterator[None]:
    """Inference mode, autocast for reduced dtypes, a fixed CPU thread count, GC paused, denormals flushed.

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
        with torch.inference_mode(), autocast, (torch.cuda.device(device) if device.type == "cuda"
                                                 else contextlib.nullcontext()):
            gc.collect()
            gc.disable()
            yield
    finally:
        if gc_was_enabled:
            gc.enable()
        torch.set_num_threads(previous_threads)
