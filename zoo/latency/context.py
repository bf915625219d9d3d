"""In-context timing: how long each segment takes inside the running network.

:class:`ContextBench` times a whole network like :class:`~zoo.latency.measure.Bench` and, on every timed call,
also the time between a forward pre-hook and a forward hook on each named submodule (the segment's boundaries).
On the CPU the hooks read the bench's clock; on CUDA they record events on the current stream, so a segment's
time is the device's time between its boundaries, with the kernels queued as the network queues them.

A segment timed in context starts from the cache state the network leaves it (its input just written by the
layer before, its weights evicted by the layers since its last call), with the CPU in the state the whole
network keeps it in. Per timed call the bench also keeps the rest of the network's time (the total minus the
segments'): the stem, head and glue, with the hook calls themselves, which :func:`hook_overhead_ms` measures.

:func:`measure_in_context` times a table's records this way: the intact network and probe networks
(:func:`probe_variants`) that together run every variant of every segment, in interleaved rounds.
"""

from __future__ import annotations

import copy
import logging
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from ..pruning.surgery import Segment, build_segment
from .drift import estimator_runs, speed_levels, speeds_from_others
from .measure import Bench, measured_form, prepare, robust_summary, time_rounds
from .settings import ESTIMATORS, TableSettings

logger = logging.getLogger("zoo.latency")


class ContextBench(Bench):
    """A :class:`Bench` of a network that also records, per timed call, the time of each of `names` inside it.

    ``segment_ms[name]`` and ``rest_ms`` are aligned with ``times_ms``. The hooks stay registered for the bench's
    life; call :meth:`close` to remove them (the network is then unchanged).
    """

    def __init__(self, net: nn.Module, names: Sequence[str], args: tuple = (), kwargs: Mapping[str, Any] | None = None,
                 device: torch.device | None = None, clock: str = "wall"):
        super().__init__(net, args, kwargs, device, cuda_graph=False, clock=clock)
        self.names = list(names)
        self.segment_ms: dict[str, list[float]] = {name: [] for name in self.names}
        self.rest_ms: list[float] = []
        self._marks: dict[str, list[Any]] = {}
        cuda = self.device.type == "cuda"
        self._read: Callable[[], Any] = self._event if cuda else (
            time.thread_time_ns if clock == "thread" else time.perf_counter_ns)
        self._handles = []
        for name in self.names:
            module = net.get_submodule(name)
            self._handles += [module.register_forward_pre_hook(self._mark(name, 0)),
                              module.register_forward_hook(self._mark(name, 1))]

    def _event(self) -> Any:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _mark(self, name: str, side: int) -> Callable[..., None]:
        def hook(*_: Any) -> None:
            marks = self._marks.setdefault(name, [None, None])
            if marks[side] is None:  # a segment called twice in one forward keeps its first call
                marks[side] = self._read()
        return hook

    def _elapsed_ms(self, marks: list[Any]) -> float:
        start, end = marks
        if self.device.type == "cuda":
            return start.elapsed_time(end)
        return (end - start) * 1e-6

    def _time_once(self) -> float:
        self._marks = {}
        total = super()._time_once()
        missing = [name for name in self.names if None in self._marks.get(name, [None, None])]
        if missing:
            raise RuntimeError(f"Segments {missing[:5]} were not called in the forward pass; they cannot be timed.")
        times = [self._elapsed_ms(self._marks[name]) for name in self.names]
        for name, ms in zip(self.names, times):
            self.segment_ms[name].append(ms)
        self.rest_ms.append(total - sum(times))
        return total

    def close(self) -> None:
        """Remove the hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles = []


def hook_overhead_ms(device: torch.device, clock: str = "wall", calls: int = 2000) -> float:
    """What one pair of timing hooks adds to a network call (ms): a hooked minus a plain ``nn.Identity`` call,
    the minimum of five alternating blocks of `calls` calls each."""
    plain, hooked = nn.Identity(), nn.Identity()
    x = torch.zeros(1, device=device)
    bench = ContextBench(nn.Sequential(hooked), ["0"], (x,), device=device, clock=clock)
    best = float("inf")
    try:
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(calls):
                plain(x)
            t1 = time.perf_counter()
            for _ in range(calls):
                bench._marks = {}
                hooked(x)
            t2 = time.perf_counter()
            best = min(best, ((t2 - t1) - (t1 - t0)) * 1e3 / calls)
    finally:
        bench.close()
    return max(0.0, best)


def probe_variants(keys: Sequence[Mapping[frozenset[str], str | None]], spacing: int = 1
                   ) -> list[list[frozenset[str]]]:
    """Variant choices for the probe networks of in-context timing: together they use every measured variant of
    every segment.

    ``spacing=1``: segment i takes its variant ``(k + i) mod n_i`` in network k, so every segment changes and
    neighbours vary. ``spacing=m``: network k changes only the segments with ``(i + k) mod m == 0`` (to their
    ``k // m``-th changed variant, cycling) and keeps the others intact, so each changed variant runs between intact
    neighbours; up to m times as many networks.
    """
    options = [[variant for variant, key in seg_keys.items() if key is not None] for seg_keys in keys]
    if spacing == 1:
        return [[opts[(k + i) % len(opts)] for i, opts in enumerate(options)]
                for k in range(max(map(len, options), default=0))]
    changed = [[variant for variant in opts if variant] for opts in options]
    probes: list[list[frozenset[str]]] = []
    for k in range(spacing * max(map(len, changed), default=0)):
        choice = [ch[(k // spacing) % len(ch)] if ch and (i + k) % spacing == 0 else frozenset()
                  for i, ch in enumerate(changed)]
        if any(choice) and choice not in probes:  # the intact network and repeats add nothing
            probes.append(choice)
    return probes


def measure_in_context(model: nn.Module, segs: Sequence[Segment], keys: Sequence[Mapping[frozenset[str], str | None]],
                       fixed_key: str, example: Any, forward_kwargs: Mapping[str, Any], device: torch.device,
                       channels_last: bool, merge: bool, settings: TableSettings) -> dict[str, dict[str, Any]]:
    """Time every (segment, variant) and the fixed part inside running networks; cache records by key.

    The intact network and the probe networks (:func:`probe_variants`) run in interleaved rounds, every network
    once per round (``runs_per_round`` times), with a hook pair at every segment boundary (:class:`ContextBench`).
    The machine's speed drifts over seconds (docs/latency.md), so each network's runs of a round are divided by that
    round's :func:`~zoo.latency.drift.machine_speed` as the other networks saw it
    (:func:`~zoo.latency.drift.speeds_from_others`), and each estimator's costs are put back at the speed that
    estimator picks out of the intact network's raw runs (:func:`~zoo.latency.drift.speed_levels`). For each
    estimator, a part's cost is its mean over the runs in the estimator's window of its network's totals
    (:func:`~zoo.latency.drift.estimator_runs`), so a network's parts add up to its estimated total; records met in
    several networks (or segments) average their per-network costs. The fixed part is the time outside the segments,
    less the hooks' own cost (:func:`hook_overhead_ms`).
    """
    names = [seg.name for seg in segs]
    choices = [[frozenset()] * len(segs), *probe_variants(keys, settings.probe_spacing)]
    benches = []
    for variants in choices:
        net = copy.deepcopy(model)
        for seg, variant in zip(segs, variants):  # the very modules isolated timing times
            net.set_submodule(seg.name, build_segment(model, seg, variant, merge))
        net = prepare(measured_form(net, settings), device, channels_last)
        benches.append(ContextBench(net, names, (example,), forward_kwargs, device, settings.clock))
    start = time.perf_counter()
    try:
        for bench in benches:
            bench.warmup(settings.entry_warmup_s)
        cap_hit = any(time_rounds(benches, (settings.min_rounds, settings.max_rounds), settings.runs_per_round,
                                  settings.rel_tol, settings.max_time_s, together=True,
                                  warm_calls=settings.warm_calls, order=settings.round_order))
    finally:
        for bench in benches:
            bench.close()
    speeds = speeds_from_others([b.times_ms for b in benches], settings.runs_per_round)
    speed = speeds[0]
    levels = speed_levels(benches[0].times_ms, speed)
    hooks_ms = hook_overhead_ms(device, settings.clock) * len(names)
    parts: dict[str, dict[str, list[float]]] = {}  # key -> estimator -> per-network costs
    samples: dict[str, list[float]] = {}
    for variants, bench, own_speed in zip(choices, benches, speeds):
        windows = {est: estimator_runs(np.asarray(bench.times_ms) / own_speed, est) for est in ESTIMATORS}
        series = [(keys[i][v], bench.segment_ms[name]) for i, (name, v) in enumerate(zip(names, variants))]
        series.append((fixed_key, [ms - hooks_ms for ms in bench.rest_ms]))
        for key, times in series:
            values = np.asarray(times) / own_speed
            for est, runs in windows.items():
                parts.setdefault(key, {}).setdefault(est, []).append(max(0.0, float(values[runs].mean()) * levels[est]))
            samples.setdefault(key, []).extend(values.tolist())
    stamp, spent = time.strftime("%Y-%m-%dT%H:%M:%S"), time.perf_counter() - start
    logger.info("latency table: %d networks x %d rounds in %.0f s; machine speed ranged %.2f-%.2f of its median",
                len(benches), len(benches[0].times_ms) // settings.runs_per_round, spent, speed.min(), speed.max())
    return {key: {**robust_summary(samples[key]), **{f"{est}_ms": statistics.fmean(v) for est, v in by_est.items()},
                  "n_runs": len(samples[key]), "cap_hit": cap_hit, "networks": len(by_est["median"]),
                  "time_s": spent, "speed_range": [float(speed.min()), float(speed.max())], "measured_at": stamp}
            for key, by_est in parts.items()}


def context_overhead_record() -> dict[str, Any]:
    """In context there is no call of a record's module on its own to subtract: the call-overhead record is 0."""
    return {**{f"{name}_ms": 0.0 for name in ("median", "iqr", "mad", "mean", "min", "p10")}, "rel_uncertainty": 0.0,
            "n_runs": 0, "cap_hit": False, "time_s": 0.0, "peak_mem_bytes": 0, "mem_estimated": True,
            "what": "no call overhead: entries are timed inside the network",
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")}


__all__ = ["ContextBench", "context_overhead_record", "hook_overhead_ms", "measure_in_context", "probe_variants"]
