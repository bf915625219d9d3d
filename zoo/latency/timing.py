"""Drift statistics: how fast the machine was in each round, as the other networks (or records) timed in the same
rounds saw it, and the level each estimator's statistic sits at.

The machine's speed drifts over seconds (docs/latency.md), so a table's timings divide each run by its round's
speed (:func:`speeds_from_others`), which puts every run at the build's median speed, and then put each estimator
back at the speed it picks out of a reference network's raw runs (:func:`speed_levels`).

Isolated timing: each record's module alone on its captured inputs, all of them in interleaved rounds, the
build's drift divided out by a network-sized reference timed in every round.

In-context timing: how long each segment takes inside the running network.

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

The CUDA timing protocol of a table's isolated records (``cuda_timing``): ``queued`` (device time behind already
queued kernels) or ``isolated`` (from an idle device, host launch included), chosen once per condition.
"""

from __future__ import annotations

import copy
import logging
import statistics
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import nn

from ..pruning.capture import Capture
from ..pruning.surgery import Segment, build_segment
from .cache import LatencyCache
from .device import synchronize, timing_context
from .measure import Bench, call_peak_memory, can_queue, measured_form, prepare, robust_summary, time_rounds
from .runtime import in_runtime, tensorrt_backend, tensorrt_int8_backend
from .settings import ESTIMATORS, TableSettings

ESTIMATOR_WINDOWS = {"median": (40.0, 60.0), "p10": (0.0, 20.0), "min": (0.0, 5.0)}


def estimator_runs(totals: Sequence[float], estimator: str) -> np.ndarray:
    """Indices of the runs whose total lies in the estimator's percentile window (p10: the fastest 20 %)."""
    t = np.asarray(totals, dtype=np.float64)
    lo, hi = np.percentile(t, ESTIMATOR_WINDOWS[estimator])
    chosen = np.flatnonzero((t >= lo) & (t <= hi))
    return chosen if chosen.size else np.array([int(np.argmin(np.abs(t - np.median(t))))])


def machine_speed(per_round: Sequence[float], span: int = 3) -> np.ndarray:
    """Per round, how slow the machine was: a time per round (a running median over ``2 * span + 1`` rounds, which
    keeps one slow run from counting as a slow machine) over its median."""
    per_round = np.asarray(per_round, dtype=np.float64)
    smooth = np.array([np.median(per_round[max(0, r - span):r + span + 1]) for r in range(per_round.size)])
    return smooth / np.median(smooth)


def speed_levels(reference_ms: Sequence[float], speed: np.ndarray) -> dict[str, float]:
    """Per estimator: where its runs of the reference sit raw, over where they sit once divided by the machine's speed
    (the mean over the estimator's window of runs, :func:`estimator_runs`).

    Dividing by :func:`machine_speed` puts every run at the build's median speed. A whole network measured end to
    end (a prediction check, ``prune.py``) reports the estimator of its raw runs, which on a drifting machine sits at
    the speed of its fast rounds (p10, min). Multiplying by this level puts the records at that same speed, so a table
    and a measurement report the same machine state (docs/latency.md). Only these statistics are levelled; a
    record's mean, IQR and MAD stay at the median speed.
    """
    raw = np.asarray(reference_ms, dtype=np.float64)
    normalised = raw / speed
    return {est: float(raw[estimator_runs(raw, est)].mean() / normalised[estimator_runs(normalised, est)].mean())
            for est in ESTIMATORS}


def speeds_from_others(times_ms: Sequence[Sequence[float]], runs_per_round: int) -> list[np.ndarray]:
    """Per bench, per run: the :func:`machine_speed` of that run's round as the *other* benches timed in the same
    rounds saw it (per round, the median over them of their time over their own median), repeated for each run
    of the round: what that bench's runs divide by.

    No bench is divided by its own times. A network whose own runs set the speed has part of its own noise divided
    out with the drift, so its fastest runs sit closer to its median than any other network's, and its records
    would come out slower than theirs (docs/latency.md, "Where the error sits"). With one bench, it is its own.
    """
    per_round = np.stack([np.asarray(t, dtype=np.float64).reshape(-1, runs_per_round).mean(axis=1)
                          for t in times_ms])
    relative = per_round / np.median(per_round, axis=1, keepdims=True)
    speeds = []
    for j in range(len(relative)):
        others = np.delete(relative, j, axis=0) if len(relative) > 1 else relative
        speeds.append(np.repeat(machine_speed(np.median(others, axis=0)), runs_per_round))
    return speeds




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
    (:func:`~zoo.latency.timing.measure_in_context`): the reference runs in every round (first, unless
    ``round_order`` shuffles it; timed even when it is cached), every record runs in every round until all have
    converged, and each record's runs of a round are divided by that round's :func:`~zoo.latency.timing.machine_speed`
    as the other records (the reference among them) saw it (:func:`~zoo.latency.timing.speeds_from_others`). Each
    estimator's statistic is then put back at the speed that statistic picks out of the reference's raw runs
    (:func:`~zoo.latency.timing.speed_levels`; p10: the machine's fast state, as a whole network measured end to end
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
    round's :func:`~zoo.latency.timing.machine_speed` as the other networks saw it
    (:func:`~zoo.latency.timing.speeds_from_others`), and each estimator's costs are put back at the speed that
    estimator picks out of the intact network's raw runs (:func:`~zoo.latency.timing.speed_levels`). For each
    estimator, a part's cost is its mean over the runs in the estimator's window of its network's totals
    (:func:`~zoo.latency.timing.estimator_runs`), so a network's parts add up to its estimated total; records met in
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




logger = logging.getLogger("zoo.latency")

DEVICE_BOUND = 0.8  # auto: queued when the device is busy for at least this share of the network's latency


def resolve_cuda_timing(model: nn.Module, example: Any, forward_kwargs: Mapping[str, Any], device: torch.device,
                        settings: TableSettings) -> tuple[str, dict[str, Any]]:
    """The timing protocol for ``cuda_timing="auto"``; call inside the table's timing context.

    The whole network is timed isolated (its latency) and queued (its device time); records are timed queued
    when the device is busy for at least 80 % of the latency, else isolated. A network whose call synchronises
    with the host (RetNet's token-id check does) defeats the queued timing of the whole call, so for it the host's
    launch time from an idle device decides: queued when it is at most 80 % of the latency.
    """
    benches = [Bench(model, (example,), forward_kwargs, device, settings.cuda_graph, queued=queued)
               for queued in (True, False)]
    benches[0].warmup(settings.warmup_s)
    time_rounds(benches, (10, 50), 1, 0.01, 10.0)
    device_ms, latency_ms = (b.summary()["median_ms"] for b in benches)
    host_ms, syncs = host_launch(benches[1])
    busy = host_ms <= DEVICE_BOUND * latency_ms if syncs else device_ms >= DEVICE_BOUND * latency_ms
    choice = "queued" if busy else "isolated"
    logger.info("latency table: latency %.3f ms, device time %.3f ms, host launch %.3f ms%s: entries are timed %s",
                latency_ms, device_ms, host_ms, " (the call synchronises)" if syncs else "", choice)
    return choice, {"device_ms": device_ms, "latency_ms": latency_ms, "host_ms": host_ms, "syncs": syncs}


def host_launch(bench: Bench, calls: int = 5) -> tuple[float, bool]:
    """Median host time (ms) to issue one call of `bench` from an idle device, and whether the call synchronises
    with a CUDA device (``torch.cuda.set_sync_debug_mode`` warns on every synchronising operation)."""
    cuda = bench.device.type == "cuda"
    times = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        previous = torch.cuda.get_sync_debug_mode() if cuda else 0
        if cuda:
            torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(calls):
                synchronize(bench.device)
                start = time.perf_counter()
                bench.call()
                times.append((time.perf_counter() - start) * 1e3)
        finally:
            if cuda:
                torch.cuda.set_sync_debug_mode(previous)
            synchronize(bench.device)
    syncs = any("synchronizing CUDA operation" in str(w.message) for w in caught)
    return statistics.median(times), syncs


def choose_cuda_timing(model: nn.Module, example: Any, forward_kwargs: Mapping[str, Any], device: torch.device,
                       dtype: torch.dtype, channels_last: bool, condition: Callable[[TableSettings], dict[str, Any]],
                       cache_dir: str | None, settings: TableSettings) -> tuple[TableSettings, dict[str, Any]]:
    """`settings` with a concrete CUDA protocol: the one of an existing cache file for this condition (so repeated
    builds neither probe again nor flip between protocols), else :func:`resolve_cuda_timing`'s; ``isolated``
    where PyTorch lacks the sleep kernel queued timing needs, and for onnxruntime sessions (their run returns once the
    device is done, so nothing can be queued ahead of it)."""
    ort_session = settings.runtime in ("onnxruntime", "onnxruntime_int8") \
        or (settings.runtime == "tensorrt" and tensorrt_backend() == "ort-tensorrt") \
        or (settings.runtime == "tensorrt_int8" and tensorrt_int8_backend() == "ort-tensorrt")
    if settings.cuda_timing == "isolated" or not can_queue() or ort_session:
        return replace(settings, cuda_timing="isolated"), {}
    if settings.cuda_timing == "queued":
        return settings, {}
    cached = [timing for timing in ("queued", "isolated")
              if LatencyCache(condition(replace(settings, cuda_timing=timing)), cache_dir).path.exists()]
    if len(cached) == 1:
        return replace(settings, cuda_timing=cached[0]), {}
    whole = prepare(measured_form(model, settings), device, channels_last)  # the form whole networks are timed in
    with timing_context(device, dtype, settings.threads):
        whole = in_runtime(whole, (example,), forward_kwargs, settings.runtime, device, settings.threads, dtype,
                           "the whole network")
        timing, probe = resolve_cuda_timing(whole, example, forward_kwargs, device, settings)
    return replace(settings, cuda_timing=timing), probe


__all__ = ["ContextBench", "DEVICE_BOUND", "ESTIMATOR_WINDOWS", "Pending", "choose_cuda_timing",
    "context_overhead_record", "estimator_runs", "hook_overhead_ms", "host_launch", "machine_speed",
    "measure_in_context", "measure_rounds", "probe_variants", "resolve_cuda_timing", "speed_levels",
    "speeds_from_others"]
