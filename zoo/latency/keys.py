"""What the cache keys are made of: a record's key (its module's architecture, variant and inputs) and a table's
condition (device, dtype, sizes, layout, threads, workload, timing protocol, ...: one cache file per condition).

Changing what feeds either key re-measures every cached table."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..models.depth import module_signature
from ..pruning.capture import Capture, describe
from .device import device_name, dtype_name, host_allocator
from .runtime import runtime_version
from .settings import TableSettings

# The kinds of record besides a segment variant ("segment") and a variant timed after its predecessor ("chain").
FIXED = "fixed"
WHOLE = "whole"
OVERHEAD = "call-overhead"


def _plain_attributes(module: nn.Module) -> str:
    """Public scalar attributes of every submodule (e.g. head counts that ``repr`` does not show)."""
    simple = (bool, int, float, str, tuple, list)

    def public(m: nn.Module) -> list[tuple[str, str]]:
        return sorted((k, describe(v)) for k, v in vars(m).items() if not k.startswith("_") and isinstance(v, simple))

    return ";".join(f"{name}:{public(m)}" for name, m in module.named_modules())


def record_key(kind: str, module: nn.Module, variant: Sequence[str], capture: Capture) -> str:
    """The cache key of one measurement: architecture signature, variant (relative names) and inputs."""
    first = next((a for a in capture.args if torch.is_tensor(a)), None)
    in_shape = tuple(first.shape[1:]) if first is not None else ()
    text = "|".join([kind, module_signature(module, in_shape), repr(sorted(variant)), describe(capture.args),
                     describe(capture.kwargs), _plain_attributes(module)])
    return hashlib.sha1(text.encode()).hexdigest()[:20]


def protocol_name(device: torch.device, settings: TableSettings) -> str:
    """How the records of a cache file were timed (part of its condition)."""
    shuffled = "-shuffled" if settings.round_order == "shuffled" else ""
    if settings.entries == "context":
        warm = f"-warm-{settings.warm_calls}" if settings.warm_calls else ""
        spacing = f"-spaced-{settings.probe_spacing}" if settings.probe_spacing > 1 else ""
        return f"context-peers-{settings.runs_per_round}{warm}{spacing}{shuffled}"
    return (f"round-robin-peers-{settings.runs_per_round}" + (f"-{settings.cuda_timing}" if device.type == "cuda"
                                                               else "") + shuffled)


def condition_key(device: torch.device, dtype: torch.dtype, batch_size: int, input_size: Sequence[int],
                  channels_last: bool, workload: str, settings: TableSettings) -> dict[str, Any]:
    """What a measurement depends on beyond the module: one cache file per distinct value."""
    return {"device_name": device_name(device), "device_type": device.type, "torch": torch.__version__,
            "dtype": dtype_name(dtype), "batch_size": int(batch_size), "input_size": list(input_size),
            "layout": "channels_last" if channels_last else "contiguous", "threads": int(settings.threads),
            "workload": workload, "cuda_graph": bool(settings.cuda_graph and device.type == "cuda"),
            "protocol": protocol_name(device, settings), "clock": settings.clock,
            "form": "deploy" if settings.deploy else "eager", "runtime": settings.runtime,
            "runtime_version": runtime_version(settings.runtime), "host_allocator": host_allocator()}


__all__ = ["FIXED", "OVERHEAD", "WHOLE", "condition_key", "protocol_name", "record_key"]
