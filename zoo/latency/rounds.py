"""Isolated timing: each record's module alone on its captured inputs, all of them in interleaved rounds, the
build's drift divided out by a network-sized reference timed in every round."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from ..pruning.capture import Capture
from .drift import speed_levels, speeds_from_others
from .measure import Bench, call_peak_memory, robust_summary, time_rounds
from .runtime import in_runtime
from .settings import TableSettings

logger = logging.getLogger("zoo.latency")


@dataclass
class Pending:
    """A record still to be measured: its key, module, inputs and a description for the cache file."""

    key: str
    module: nn.Module
    capture: Capture
    what: str


def measure_rounds(pending: Sequence[Pending], device: torch.device, settings: TableSettings,
                   reference: Pending | None = None) -> dict[str, dict[str, Any]]:
    """Time every pending record in interleaved rounds; returns cache records keyed by record key.

    With a `reference` (the network-sized record behind the fixed part: the replay network in eager, the whole
    network elsewhere), drift inside the build is divided out as in context
    (:func:`~zoo.latency.context.measure_in_context`): the reference runs in every round (first, unless
    ``round_order`` shuffles it; timed even when it is cached), every record runs in every round until all have
    converged, and each record's runs of a round are divided by that round's :func:`~zoo.latency.drift.machine_speed`
    as the other records (the reference among them) saw it (:func:`~zoo.latency.drift.speeds_from_others`). Each
    estimator's statistic is then put back at the speed that statistic picks out of the reference's raw runs
    (:func:`~zoo.latency.drift.speed_levels`; p10: the machine's fast state, as a whole network measured end to end
    reports it), so the fixed part (whole less intact segments) and the records timed in one call describe one
    machine state (records reused from the cache keep the level of the build that timed them).
    """
    queued = settings.cuda_timing == "queued"
    timed = list(pending)
    if reference is not None:
        timed = [reference] + [p for p in pending if p.key != reference.key]
    calls = [in_runtime(p.module, p.capture.args, p.capture.kwargs, settings.runtime, device, settings.threads,
                        what=p.what) for p in timed]
    benches = [Bench(call, p.capture.args, p.capture.kwargs, device, settings.cuda_graph, settings.clock, queued)
               for p, call in zip(timed, calls)]
    for bench in benches:
        bench.warmup(settings.entry_warmup_s)
    caps = time_rounds(benches, (settings.min_rounds, settings.max_rounds), settings.runs_per_round,
                       settings.rel_tol, settings.max_time_s, together=reference is not None,
                       order=settings.round_order)
    speeds = (speeds_from_others([b.times_ms for b in benches], settings.runs_per_round) if reference is not None
              else [None] * len(benches))
    speed = speeds[0]
    levels = speed_levels(benches[0].times_ms, speed) if speed is not None else {}
    wanted = {p.key for p in pending}
    records = {}
    for p, bench, cap_hit, call, own_speed in zip(timed, benches, caps, calls, speeds):
        if p.key not in wanted:
            continue
        times = np.asarray(bench.times_ms) if own_speed is None else np.asarray(bench.times_ms) / own_speed
        summary = robust_summary(times)
        summary.update({f"{est}_ms": summary[f"{est}_ms"] * level for est, level in levels.items()})
        mem, estimated = call_peak_memory(p.module, p.capture.args, p.capture.kwargs, device)
        records[p.key] = {**summary, "n_runs": len(bench.times_ms), "cap_hit": cap_hit,
                          "runtime_build_s": getattr(call, "build_s", 0.0),
                          "time_s": bench.time_s, "peak_mem_bytes": mem, "mem_estimated": estimated,
                          "what": p.what, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
        if own_speed is not None:
            records[p.key]["speed_range"] = [float(own_speed.min()), float(own_speed.max())]
    if speed is not None:
        logger.info("latency table: %d entries x %d rounds; machine speed ranged %.2f-%.2f of its median",
                    len(pending), speed.size // settings.runs_per_round, speed.min(), speed.max())
    return records


__all__ = ["Pending", "measure_rounds"]
