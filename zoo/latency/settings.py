"""How tables and whole networks are timed: :class:`TableSettings` (``prune.table``) and
:class:`NetworkTimingSettings` (``prune.measure``), both extending the interleaved rounds of
:class:`~zoo.latency.measure.RoundSettings`, and the values their fields allow.

What the cache keys are made of: a record's key (its module's architecture, variant and inputs) and a table's
condition (device, dtype, sizes, layout, threads, workload, timing protocol, ...: one cache file per condition).

Changing what feeds either key re-measures every cached table.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from ..errors import ZooError
from ..models.depth import module_signature
from ..pruning.capture import Capture, describe
from .device import device_name, dtype_name, host_allocator
from .measure import CLOCKS, RoundSettings
from .runtime import RUNTIMES, runtime_version

ESTIMATORS = ("median", "p10", "min")
ENTRY_TIMINGS = ("auto", "context", "isolated")
CUDA_TIMINGS = ("auto", "queued", "isolated")


@dataclass(frozen=True)
class TableSettings(RoundSettings):
    """How a table is measured: the rounds of :class:`~zoo.latency.measure.RoundSettings` (each record leaves the
    rounds once its median is precise enough), plus:

    runtime: the deploy runtime every record (and every whole network in a prediction check and in ``prune.py``'s
        final timing) runs in (:mod:`zoo.latency.runtime`): ``eager``, ``compile`` (torch.compile, inductor),
        ``onnxruntime`` or ``tensorrt`` (CUDA), or an INT8 form (``compile_int8``, ``onnxruntime_int8``,
        ``tensorrt_int8``: each record quantised first). Outside eager every record's module is compiled or exported
        on its own and timed isolated; the compile/export time is part of the build time (``runtime_build_s``).
    entries: how the records are timed. ``context`` times every (segment, variant) inside running probe networks
        (hooks at the segment boundaries), so each one starts from the cache state the network leaves it in;
        ``isolated`` times each alone on its captured inputs in interleaved rounds, the machine's drift divided out
        by the fixed part's network timed in every round; ``auto``: context on the CPU in eager, isolated elsewhere.
    entry_warmup_s: untimed calls of each record's module (each probe network in context) before the rounds.
    min_rounds: 150 by default: fewer rounds leave a per-build shift in every predicted speed-up (docs/latency.md,
        "Where the error sits").
    estimator: the statistic of the runs the costs use: ``median``, ``p10`` (robust to a busy machine, whose
        interference only adds time) or ``min``. In context, a part's cost is its mean over the runs whose
        whole-network time is near that statistic of the totals, so the parts add up to it.
    threads, cuda_graph, clock: as :class:`~zoo.latency.measure.MeasureSettings`.
    probe_spacing: in context, every m-th segment of a probe network takes a changed variant (1: all of them, the
        fewest networks; m: each changed variant between intact neighbours, m times the networks).
    deploy: time every record and network in its deploy form (:func:`zoo.fuse`), the form a pruned network is
        served in.
    cuda_timing: on CUDA, ``queued`` times each record's device time behind already queued kernels (a device-bound
        network); ``isolated`` from an idle device, host launch time included (host-bound small batches);
        ``auto`` keeps an existing cache's protocol, else takes ``queued`` when the device is busy for at least
        80 % of the network's latency (:func:`~zoo.latency.timing.resolve_cuda_timing`). Whole networks are always
        timed isolated.
    """

    warmup_s: float = 3.0
    min_rounds: int = 150
    max_rounds: int = 400
    rel_tol: float = 0.01
    max_time_s: float = 240.0
    entry_warmup_s: float = 0.05
    threads: int = 1
    cuda_graph: bool = False
    estimator: str = "p10"
    clock: str = "wall"
    deploy: bool = True
    cuda_timing: str = "auto"
    entries: str = "auto"
    runtime: str = "eager"
    probe_spacing: int = 1
    label: ClassVar[str] = "TableSettings (prune.table)"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.threads < 1:
            raise ZooError(f"TableSettings (prune.table): threads={self.threads} must be >= 1.")
        if self.probe_spacing < 1:
            raise ZooError(f"TableSettings (prune.table): probe_spacing={self.probe_spacing} must be >= 1.")
        if self.entry_warmup_s < 0:
            raise ZooError(f"TableSettings (prune.table): entry_warmup_s={self.entry_warmup_s} must be >= 0.")
        if self.clock not in CLOCKS:
            raise ZooError(f"Unknown clock {self.clock!r}; allowed are {', '.join(CLOCKS)}.")
        if self.estimator not in ESTIMATORS:
            raise ZooError(f"Unknown estimator {self.estimator!r}; allowed are {', '.join(ESTIMATORS)}.")
        if self.entries not in ENTRY_TIMINGS:
            raise ZooError(f"Unknown entries timing {self.entries!r}; allowed are {', '.join(ENTRY_TIMINGS)}.")
        if self.runtime not in RUNTIMES:
            raise ZooError(f"Unknown runtime {self.runtime!r}; allowed are {', '.join(RUNTIMES)}.")
        if self.entries == "context" and self.runtime != "eager":
            raise ZooError(f"entries='context' times segments inside the running eager network; runtime="
                           f"{self.runtime!r} runs one compiled graph without segment boundaries: use entries='auto' "
                           f"or 'isolated'.")
        if self.cuda_graph and self.runtime in ("onnxruntime", "onnxruntime_int8", "tensorrt", "tensorrt_int8"):
            raise ZooError(f"cuda_graph=true replays a captured PyTorch call; runtime={self.runtime!r} runs its own "
                           f"engine (it manages its own graphs): use cuda_graph=false, or runtime=eager / compile.")
        if self.cuda_timing not in CUDA_TIMINGS:
            raise ZooError(f"Unknown cuda_timing {self.cuda_timing!r}; allowed are {', '.join(CUDA_TIMINGS)}.")


@dataclass(frozen=True)
class NetworkTimingSettings(RoundSettings):
    """Interleaved timing of whole networks (:func:`~zoo.latency.accuracy.time_networks`: a table's prediction check
    and correction, ``prune.py``'s side-by-side measurement, ``prune.measure``): the rounds of
    :class:`~zoo.latency.measure.RoundSettings`, each network warmed for `net_warmup_s` first; the table's estimator
    summarises the runs. No warm calls by default: a warm call makes a network's time its own steady state, which
    inside a served pipeline it is not (docs/latency.md, "Neighbours").

    min_rounds: 200 by default. A measured speed-up decides whether a plan meets its target (the measured-target
    loop) and then whether the run did: two timings some seconds apart, which must agree well inside the tolerance
    (at 20 rounds CI measured one plan at 1.537x, then 1.640x; docs/latency.md, "Whole networks side by side")."""

    net_warmup_s: float = 0.1
    min_rounds: int = 200
    max_rounds: int = 400
    label: ClassVar[str] = "NetworkTimingSettings (prune.measure)"




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


__all__ = ["CUDA_TIMINGS", "ENTRY_TIMINGS", "ESTIMATORS", "FIXED", "NetworkTimingSettings", "OVERHEAD",
    "TableSettings", "WHOLE", "condition_key", "protocol_name", "record_key"]
