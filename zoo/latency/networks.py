"""Whole networks timed side by side: interleaved rounds (A B C A B C ...) on the same inputs, under a table's
conditions (device, dtype, layout, threads, runtime). A table's prediction check (:mod:`zoo.latency.accuracy`),
``prune.py``'s final measurement and the benchmarks time networks this way."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ..pruning.surgery import apply_plan
from .cache import device_lock
from .device import resolve_dtype, timing_context
from .measure import Bench, measured_form, prepare, time_rounds
from .runtime import in_runtime
from .settings import NetworkTimingSettings
from .table import LatencyTable


def time_interleaved(callables: Sequence[Any], args: Sequence[Any], kwargs: Mapping[str, Any], device: torch.device,
                     dtype: torch.dtype, threads: int, settings: NetworkTimingSettings, cuda_graph: bool = False,
                     clock: str = "wall") -> list[Bench]:
    """Time callables on the same inputs in interleaved rounds (A B C A B C ...); one bench per callable."""
    benches = [Bench(fn, tuple(args), kwargs, device, cuda_graph, clock) for fn in callables]
    with device_lock(device), timing_context(device, dtype, threads):
        benches[0].warmup(settings.warmup_s)
        for bench in benches:
            bench.warmup(settings.net_warmup_s)
        time_rounds(benches, (settings.min_rounds, settings.max_rounds), settings.runs_per_round, settings.rel_tol,
                    settings.max_time_s, warm_calls=settings.warm_calls, order=settings.round_order)
    return benches


def time_networks(nets: Sequence[nn.Module], example: Any, forward_kwargs: Mapping[str, Any], table: LatencyTable,
                  settings: NetworkTimingSettings, labels: Sequence[str] | None = None) -> list[Bench]:
    """Time whole networks in interleaved rounds under the table's conditions (its runtime too: each network is
    compiled or exported first, once per distinct network); one bench per network. `labels` name them in errors."""
    device = next(iter(table.model.parameters())).device
    dtype = resolve_dtype(table.condition["dtype"], device)
    runtime, threads = table.settings.runtime, table.settings.threads
    made: dict[int, Any] = {}
    with timing_context(device, dtype, threads):
        for i, net in enumerate(nets):
            if id(net) not in made:
                what = f"network {labels[i] if labels else i}"
                made[id(net)] = in_runtime(net, (example,), forward_kwargs, runtime, device, threads, dtype, what)
    return time_interleaved([made[id(net)] for net in nets], (example,), forward_kwargs, device, dtype, threads,
                            settings, table.settings.cuda_graph, table.settings.clock)


def pruned_network(table: LatencyTable, plan: Mapping[str, Any]) -> nn.Module:
    """The table's model with `plan` applied (a copy), prepared like the table's segments."""
    model = measured_form(apply_plan(table.model, dict(plan), inplace=False), table.settings)
    channels_last = table.condition["layout"] == "channels_last"
    return prepare(model, next(iter(table.model.parameters())).device, channels_last)


__all__ = ["pruned_network", "time_interleaved", "time_networks"]
