"""Latency lookup tables: one entry per (segment signature, variant), plus the parts never removed.

The prediction for a plan is ``fixed + sum over segments of cost(segment, variant chosen by the plan)``, where

* a segment (:func:`zoo.surgery.segments`) is measured in isolation for every variant it has
  (:meth:`~zoo.surgery.Segment.variants`, rebuilt with :func:`~zoo.surgery.build_segment`), on the very inputs it
  receives inside the network (captured with one hooked forward at the table's batch and input size), on the
  table's device, dtype and layout; removing the whole segment costs 0;
* ``cost = max(0, entry - call overhead)``: every isolated measurement also contains one module call and the
  timer, measured once as an ``nn.Identity`` call;
* ``fixed`` is the network with each segment replaced by a module that replays the segment's captured output:
  stem, head and all glue between segments, with real shapes; in a runtime other than eager (``runtime=compile``,
  ``onnxruntime``, ``tensorrt``: :mod:`zoo.latency.runtime`) each entry is compiled or exported on its own, timed
  chained after the previous segment (less that segment alone: the runtime's layout conversions at the edges cancel,
  :func:`chains_after_previous`), and the fixed part is the whole network, timed in the runtime, less its intact
  segments (a compiler folds a replay).

Identical segments (same architecture, inputs and variant) share one cache entry across models and runs; see
:mod:`zoo.latency.cache`. A calibration (:meth:`LatencyTable.calibrate`) may add a fitted correction
``scale * raw + offset`` that :meth:`~LatencyTable.predict` and :meth:`~LatencyTable.segment_costs` apply.

Other workloads: ``forward_kwargs`` and ``example_input`` change the network call the inputs are captured from,
and ``workload`` names it in the cache key. For a RetNet recurrent decode step, for instance::

    state = model.init_state(batch)  # or a state after a prompt
    build_table(model, batch_size=batch, input_size=(1,), workload="decode",
                forward_kwargs={"mode": "recurrent", "state": state})

measures every retention/FFN sub-layer on its one-token input with the recurrent state it gets in that call.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import statistics
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, ClassVar

import numpy as np
import torch
from filelock import Timeout
from torch import nn

from ..capture import Capture, Replay, capture_segments, describe, replay_model
from ..depth import module_signature
from ..errors import PlanError, ZooError
from ..surgery import Segment, build_segment, segments
from .cache import LatencyCache, LatencyCacheWarning, device_lock
from .context import ContextBench, hook_overhead_ms
from .device import device_name, dtype_name, host_allocator, resolve_device, resolve_dtype, synchronize, timing_context
from .measure import (
    CLOCKS,
    Bench,
    RoundSettings,
    can_queue,
    check_clock,
    measured_form,
    peak_memory,
    prepare,
    robust_summary,
    time_rounds,
)
from .runtime import RUNTIMES, check_runtime, in_runtime, runtime_version, tensorrt_backend

logger = logging.getLogger("zoo.latency")

FIXED = "fixed"
WHOLE = "whole"
OVERHEAD = "call-overhead"


ESTIMATORS = ("median", "p10", "min")
ENTRY_TIMINGS = ("auto", "context", "isolated")
CUDA_TIMINGS = ("auto", "queued", "isolated")
DEVICE_BOUND = 0.8  # auto: queued when the device is busy for at least this share of the network's latency


@dataclass(frozen=True)
class TableSettings(RoundSettings):
    """How a table is measured: the rounds of :class:`~zoo.latency.measure.RoundSettings` (each entry leaves the
    rounds once its median is precise enough), plus:

    runtime: the deploy runtime every entry (and every whole network in calibration and in ``prune.py``'s final
        timing) runs in (:mod:`zoo.latency.runtime`): ``eager``, ``compile`` (torch.compile, inductor),
        ``onnxruntime`` or ``tensorrt`` (CUDA). Outside eager every entry is compiled or exported on its own and
        timed isolated; the compile/export time is part of the build time (``runtime_build_s``).
    entries: ``context`` times every (segment, variant) inside running probe networks (hooks at the segment
        boundaries), so each entry starts from the cache state the network leaves it in; ``isolated`` times each
        entry alone on its captured inputs in interleaved rounds, the machine's drift divided out by the fixed
        part's network timed in every round; ``auto``: context on the CPU in eager, isolated elsewhere.
    entry_warmup_s: untimed calls of each entry (each probe network in context) before the rounds.
    min_rounds: 150 by default: fewer rounds leave a per-build shift in every predicted speed-up (docs/latency.md,
        "Where the error sits").
    estimator: the statistic of the runs the costs use: ``median``, ``p10`` (robust to a busy machine, whose
        interference only adds time) or ``min``. In context, a part's cost is its mean over the runs whose
        whole-network time is near that statistic of the totals, so the parts add up to it.
    threads, cuda_graph, clock: as :class:`~zoo.latency.measure.MeasureSettings`.
    probe_spacing: in context, every m-th segment of a probe network takes a changed variant (1: all of them, the
        fewest networks; m: each changed entry between intact neighbours, m times the networks).
    deploy: time every entry and network in its deploy form (:func:`zoo.fuse`), the form a pruned network is
        served in.
    cuda_timing: on CUDA, ``queued`` times each entry's device time behind already queued kernels (a device-bound
        network); ``isolated`` from an idle device, host launch time included (host-bound small batches);
        ``auto`` keeps an existing cache's protocol, else takes ``queued`` when the device is busy for at least
        80 % of the network's latency (:func:`resolve_cuda_timing`). Whole networks are always timed isolated.
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
    label: ClassVar[str] = "TableSettings (prune.lut)"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.threads < 1:
            raise ZooError(f"TableSettings (prune.lut): threads={self.threads} must be >= 1.")
        if self.probe_spacing < 1:
            raise ZooError(f"TableSettings (prune.lut): probe_spacing={self.probe_spacing} must be >= 1.")
        if self.entry_warmup_s < 0:
            raise ZooError(f"TableSettings (prune.lut): entry_warmup_s={self.entry_warmup_s} must be >= 0.")
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
        if self.cuda_graph and self.runtime in ("onnxruntime", "tensorrt"):
            raise ZooError(f"cuda_graph=true replays a captured PyTorch call; runtime={self.runtime!r} runs its own "
                           f"engine (it manages its own graphs): use cuda_graph=false, or runtime=eager / compile.")
        if self.cuda_timing not in CUDA_TIMINGS:
            raise ZooError(f"Unknown cuda_timing {self.cuda_timing!r}; allowed are {', '.join(CUDA_TIMINGS)}.")


def _plain_attributes(module: nn.Module) -> str:
    """Public scalar attributes of every submodule (e.g. head counts that ``repr`` does not show)."""
    simple = (bool, int, float, str, tuple, list)

    def public(m: nn.Module) -> list[tuple[str, str]]:
        return sorted((k, describe(v)) for k, v in vars(m).items() if not k.startswith("_") and isinstance(v, simple))

    return ";".join(f"{name}:{public(m)}" for name, m in module.named_modules())


def entry_key(kind: str, module: nn.Module, variant: Sequence[str], capture: Capture) -> str:
    """The cache key of one measurement: architecture signature, variant (relative names) and inputs."""
    first = next((a for a in capture.args if torch.is_tensor(a)), None)
    in_shape = tuple(first.shape[1:]) if first is not None else ()
    text = "|".join([kind, module_signature(module, in_shape), repr(sorted(variant)), describe(capture.args),
                     describe(capture.kwargs), _plain_attributes(module)])
    return hashlib.sha1(text.encode()).hexdigest()[:20]


def variant_label(segment: Segment, variant: frozenset[str]) -> str:
    if not variant:
        return "-"
    if segment.name in variant:
        return "removed"
    return "+".join(sorted(name[len(segment.name) + 1:] for name in variant))


def normalise_input_size(model: nn.Module, input_size: int | Sequence[int] | None) -> tuple[int, ...]:
    """Per-sample input size: an int sets the spatial size (CNNs: C x n x n) or the sequence length."""
    default = tuple(model.default_cfg["input_size"])
    if input_size is None:
        return default
    allowed = ("an int (the image side or sequence length) or a per-sample size such as [3, 224, 224] / [128]; "
               "every value >= 1")
    try:
        values = [input_size] if isinstance(input_size, int) else [int(v) for v in input_size]
    except (TypeError, ValueError):
        raise ZooError(f"input_size={input_size!r} is not a size; give {allowed}.") from None
    if isinstance(input_size, bool) or not values or min(values) < 1 or len(values) > len(default):
        raise ZooError(f"input_size={input_size!r} does not fit {getattr(model, 'zoo_name', 'this model')} "
                       f"(default {list(default)}); give {allowed}.")
    image = getattr(model, "task", "classification") != "language_model"
    if isinstance(input_size, int):
        return (default[0], input_size, input_size) if image else (input_size,)
    size = tuple(values)
    return (default[0], *size) if image and len(size) == 2 else size


@dataclass
class Pending:
    """An entry still to be measured: its module, inputs and a description for the cache file."""

    key: str
    module: nn.Module
    capture: Capture
    what: str


def measure_rounds(pending: Sequence[Pending], device: torch.device, settings: TableSettings,
                   reference: Pending | None = None) -> dict[str, dict[str, Any]]:
    """Time every pending entry in interleaved rounds; returns cache records keyed by entry key.

    With a `reference` (the network-sized entry behind the fixed part: the replay network in eager, the whole
    network elsewhere), drift inside the build is divided out as in context (:func:`measure_in_context`): the
    reference runs in every round (first, unless ``round_order`` shuffles it; timed even when it is cached), every
    entry runs in every round until all have converged, and each entry's runs of a round are divided by that round's
    :func:`machine_speed` as the other entries (the reference among them) saw it (:func:`speeds_from_others`). Each
    estimator's statistic is then put back at the speed that statistic picks out of the reference's raw runs
    (:func:`speed_levels`; p10: the machine's fast state, as a whole network measured end to end reports it), so
    the fixed part (whole less intact segments) and the entries timed in one call describe one machine state
    (entries reused from the cache keep the level of the build that timed them).
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
        mem, estimated = peak_memory(p.module, p.capture.args, p.capture.kwargs, device)
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


def probe_variants(keys: Sequence[Mapping[frozenset[str], str | None]], spacing: int = 1
                   ) -> list[list[frozenset[str]]]:
    """Variant choices for the probe networks of in-context timing: together they use every measured variant of
    every segment.

    ``spacing=1``: segment i takes its variant ``(k + i) mod n_i`` in network k, so every segment changes and
    neighbours vary. ``spacing=m``: network k changes only the segments with ``(i + k) mod m == 0`` (to their
    ``k // m``-th changed variant, cycling) and keeps the others intact, so each changed entry runs between intact
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
    end (calibration, ``prune.py``) reports the estimator of its raw runs, which on a drifting machine sits at the
    speed of its fast rounds (p10, min). Multiplying by this level puts the entries at that same speed, so a table
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
    out with the drift, so its fastest runs sit closer to its median than any other network's, and its entries
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


def measure_in_context(model: nn.Module, segs: Sequence[Segment], keys: Sequence[Mapping[frozenset[str], str | None]],
                       fixed_key: str, example: Any, forward_kwargs: Mapping[str, Any], device: torch.device,
                       channels_last: bool, merge: bool, settings: TableSettings) -> dict[str, dict[str, Any]]:
    """Time every (segment, variant) and the fixed part inside running networks; cache records by key.

    The intact network and the probe networks (:func:`probe_variants`) run in interleaved rounds, every network
    once per round (``runs_per_round`` times), with a hook pair at every segment boundary
    (:class:`~zoo.latency.context.ContextBench`). The machine's speed drifts over seconds (docs/latency.md), so each
    network's runs of a round are divided by that round's :func:`machine_speed` as the other networks saw it
    (:func:`speeds_from_others`), and each estimator's costs are put back at the speed that estimator picks out of
    the intact network's raw runs
    (:func:`speed_levels`). For each estimator, a part's cost is its mean over the runs in the
    estimator's window of its network's totals (:func:`estimator_runs`), so a network's parts add up to its
    estimated total; entries met in several networks (or segments) average their per-network costs. The fixed
    part is the time outside the segments, less the hooks' own cost (:func:`~zoo.latency.context.hook_overhead_ms`).
    """
    names = [seg.name for seg in segs]
    choices = [[frozenset()] * len(segs), *probe_variants(keys, settings.probe_spacing)]
    benches = []
    for variants in choices:
        net = copy.deepcopy(model)
        for seg, variant in zip(segs, variants):  # the very modules the isolated entries time
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
    """In context there is no call of an entry on its own to subtract: the call-overhead entry is 0."""
    return {**{f"{name}_ms": 0.0 for name in ("median", "iqr", "mad", "mean", "min", "p10")}, "rel_uncertainty": 0.0,
            "n_runs": 0, "cap_hit": False, "time_s": 0.0, "peak_mem_bytes": 0, "mem_estimated": True,
            "what": "no call overhead: entries are timed inside the network",
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")}


@dataclass(frozen=True)
class Correction:
    """``corrected = scale * raw + offset_ms`` for a whole-network prediction (kind: none, scale or offset)."""

    kind: str = "none"
    scale: float = 1.0
    offset_ms: float = 0.0

    def apply(self, raw_ms: float) -> float:
        return self.scale * raw_ms + self.offset_ms


@dataclass
class LatencyTable:
    """A built table: per-segment variant costs and the fixed part, for one model and condition.

    ``segments`` is aligned with :func:`zoo.surgery.segments` of the model; ``keys[i][variant]`` is the cache
    key of segment i's variant (None for the removed segment, which costs 0); ``records`` holds the stats.
    """

    model_name: str
    condition: dict[str, Any]
    segments: list[Segment]
    keys: list[dict[frozenset[str], str | None]]
    records: dict[str, dict[str, Any]]
    fixed_key: str
    overhead_key: str
    n_measured: int
    n_cached: int
    build_s: float
    sources: dict[str, str] = field(default_factory=dict)
    correction: Correction = field(default_factory=Correction)
    calibration: Any = None
    model: nn.Module | None = field(default=None, repr=False)
    example: Any = field(default=None, repr=False)
    forward_kwargs: dict[str, Any] = field(default_factory=dict, repr=False)
    merge: bool = True
    settings: TableSettings = field(default_factory=TableSettings)
    timing_probe: dict[str, Any] = field(default_factory=dict)  # cuda_timing="auto": what decided the protocol
    prefix_keys: list[str | None] = field(default_factory=list)  # per segment: the prefix its entries are timed after

    # -- costs -----------------------------------------------------------------------------------------------

    def value(self, key: str) -> float:
        """The entry's time (ms) under the table's estimator (``settings.estimator``)."""
        return self.records[key][f"{self.settings.estimator}_ms"]

    @property
    def runtime_build_s(self) -> float:
        """What compiling or exporting the entries measured for this table cost (0 in eager), in seconds."""
        return sum(self.records[k].get("runtime_build_s", 0.0) for k in {*self.records} if self.sources.get(k)
                   == "measured")

    @property
    def overhead_ms(self) -> float:
        return self.value(self.overhead_key)

    @property
    def fixed_raw_ms(self) -> float:
        return self.value(self.fixed_key)

    @property
    def n_entries(self) -> int:
        """Distinct measured entries this table uses (shared segments count once), fixed part and overhead included."""
        return len({k for keys in self.keys for k in keys.values() if k is not None}
                   | {k for k in self.prefix_keys if k is not None} | {self.fixed_key, self.overhead_key})

    def raw_cost(self, index: int, variant: frozenset[str]) -> float:
        """Uncorrected cost (ms) of segment `index` in `variant`: entry minus call overhead (a chained entry: minus its
        prefix alone), 0 when removed."""
        key = self.keys[index][variant]
        if key is None:
            return 0.0
        prefix = self.prefix_keys[index] if self.prefix_keys else None
        return max(0.0, self.value(key) - (self.value(prefix) if prefix else self.overhead_ms))

    def fixed_cost(self, corrected: bool = True) -> float:
        """The part of every prediction that no plan changes (the correction's offset included)."""
        return self.correction.apply(self.fixed_raw_ms) if corrected else self.fixed_raw_ms

    def segment_costs(self, corrected: bool = True) -> list[list[tuple[frozenset[str], float]]]:
        """Per segment (aligned with ``segments``), every variant with its cost in ms.

        ``predict(plan) == fixed_cost() + sum of the chosen variants' costs``; with `corrected` the costs are
        scaled by the fitted correction (its offset lives in :meth:`fixed_cost`).
        """
        scale = self.correction.scale if corrected else 1.0
        return [[(variant, scale * self.raw_cost(i, variant)) for variant in seg.variants()]
                for i, seg in enumerate(self.segments)]

    def variants_of(self, plan: Mapping[str, Any]) -> list[frozenset[str]]:
        """The variant each segment takes under `plan` (a plain-data plan, see :mod:`zoo.surgery`)."""
        if not isinstance(plan, Mapping):
            raise PlanError(f"A plan is a mapping {{'remove': [unit names], 'merge': bool}}; got {plan!r}.")
        removed = set(plan.get("remove", []))
        if bool(plan.get("merge", True)) != self.merge:
            raise PlanError(f"This table was built for merge={self.merge}; the plan has merge={plan.get('merge')}.")
        known = {name for seg in self.segments for name in (seg.name, *seg.acts)}
        unknown = sorted(removed - known)
        if unknown:
            raise PlanError(f"Unit(s) {unknown[:5]} are not removable units of {self.model_name}'s segments; "
                            f"known units are segment names and their mergeable activations.")
        variants = []
        for seg in self.segments:
            if seg.name in removed:
                if not seg.removable:
                    raise PlanError(f"Segment {seg.name!r} cannot be removed (its shortcut changes shapes).")
                variants.append(frozenset({seg.name}))
            else:
                variants.append(frozenset(a for a in seg.acts if a in removed))
        return variants

    def predict(self, plan: Mapping[str, Any] | None = None, corrected: bool = True) -> float:
        """Predicted end-to-end latency (ms) of the network after `plan` (None or {} = the original)."""
        variants = self.variants_of(plan or {})
        raw = self.fixed_raw_ms + sum(self.raw_cost(i, v) for i, v in enumerate(variants))
        return self.correction.apply(raw) if corrected else raw

    def predict_memory(self, plan: Mapping[str, Any] | None = None) -> int | None:
        """Predicted peak activation memory (bytes): the largest of the fixed part's and the chosen entries'."""
        keys = [self.fixed_key] + [self.keys[i][v] for i, v in enumerate(self.variants_of(plan or {}))]
        values = [self.records[k].get("peak_mem_bytes") for k in keys if k is not None]
        return max((v for v in values if v is not None), default=None)

    # -- calibration and reporting ------------------------------------------------------------------------

    def rows(self) -> list[dict[str, Any]]:
        """One row per (segment, variant): label, cost, entry median, IQR, runs and where it came from."""
        rows = []
        for i, seg in enumerate(self.segments):
            intact = self.raw_cost(i, frozenset())
            for variant in seg.variants():
                key = self.keys[i][variant]
                rec = self.records.get(key, {}) if key else {}
                cost = self.raw_cost(i, variant)
                rows.append({"segment": seg.name, "variant": variant_label(seg, variant), "cost_ms": cost,
                             "median_ms": rec.get("median_ms", 0.0), "iqr_ms": rec.get("iqr_ms", 0.0),
                             "n_runs": rec.get("n_runs", 0), "cap_hit": rec.get("cap_hit", False),
                             "slower": bool(variant) and cost > intact,
                             "source": self.sources.get(key, "structural") if key else "structural"})
        return rows

    def summary(self) -> dict[str, Any]:
        return {"model": self.model_name, **self.condition, "entries": self.n_entries,
                "measured_now": self.n_measured, "from_cache": self.n_cached, "build_s": self.build_s,
                "fixed_ms": self.fixed_raw_ms, "overhead_ms": self.overhead_ms,
                "predicted_original_ms": self.predict(corrected=False), "correction": asdict(self.correction),
                "timing_probe": self.timing_probe, "runtime_build_s": self.runtime_build_s}

    def describe_condition(self) -> str:
        c = self.condition
        size = "x".join(map(str, c["input_size"]))
        return (f"{c['device_name']} [{c['dtype']}, batch {c['batch_size']}, input {size}, {c['layout']}, "
                f"{c['threads']} thread(s), torch {c['torch']}, runtime {c.get('runtime', 'eager')}]")

    def format(self) -> str:
        """The table as aligned text: one line per (segment, variant), then the fixed part and totals."""
        lines = [f"{'segment':<24} {'variant':<24} {'cost ms':>9} {'median ms':>10} {'IQR ms':>8} {'runs':>6}  source",
                 "-" * 96]
        rows = self.rows()
        for r in rows:
            cap = " (cap)" if r["cap_hit"] else ""
            lines.append(f"{r['segment']:<24} {r['variant']:<24} {r['cost_ms']:>9.4f} {r['median_ms']:>10.4f} "
                         f"{r['iqr_ms']:>8.4f} {r['n_runs']:>6}  {r['source']}{cap}{' *' if r['slower'] else ''}")
        fixed, corr = self.records[self.fixed_key], self.correction
        if any(r["slower"] for r in rows):
            lines.append("* costs more than the intact block: merging convs makes one larger kernel (k1 + k2 - 1 wide, "
                         "and dense unless every part was depthwise), which can be slower than the chain it replaces; "
                         "the search takes such a variant only where it pays.")
        lines += ["-" * 96,
                  f"fixed part (stem, head, glue): {self.fixed_raw_ms:.4f} ms (IQR {fixed['iqr_ms']:.4f}); "
                  + ("entries timed inside the running network; " if self.settings.entries == "context" else
                     f"entries timed alone, call overhead subtracted per entry: {self.overhead_ms * 1e3:.1f} us; ")
                  + f"costs use the {self.settings.estimator} of {self.settings.clock}-clock runs",
                  f"predicted original: {self.predict(corrected=False):.3f} ms raw, {self.predict():.3f} ms "
                  f"corrected ({corr.kind}: scale {corr.scale:.4f}, offset {corr.offset_ms:.4f} ms)",
                  f"{self.model_name} on {self.describe_condition()}: {self.n_entries} entries, {self.n_measured} "
                  f"measured now, {self.n_cached} from cache, built in {self.build_s:.1f} s"]
        return "\n".join(lines)


def protocol_name(device: torch.device, settings: TableSettings) -> str:
    """How the entries of a cache file were timed (part of its condition)."""
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


def chains_after_previous(segs: Sequence[Segment], captures: Sequence[Capture], runtime: str) -> list[bool]:
    """Per segment, whether its entries are timed chained after the previous segment (outside eager): the previous
    segment's output is exactly this one's only input, and neither takes keyword arguments."""
    def plain(cap: Capture) -> bool:
        return not cap.kwargs and len(cap.args) == 1 and torch.is_tensor(cap.args[0])

    return [runtime != "eager" and i > 0 and plain(cap) and plain(captures[i - 1])
            and torch.is_tensor(captures[i - 1].output) and captures[i - 1].output.shape == cap.args[0].shape
            and bool(torch.equal(captures[i - 1].output, cap.args[0])) for i, cap in enumerate(captures)]


def _variant_entries(model: nn.Module, segs: Sequence[Segment], captures: Sequence[Capture], device: torch.device,
                     channels_last: bool, merge: bool, settings: TableSettings
                     ) -> tuple[list[dict[frozenset[str], str | None]], list[Pending], list[str | None]]:
    """The cache key of every (segment, variant), the built module behind each distinct key, and per segment the key
    of the prefix its entries are measured after (None: measured alone).

    Outside eager a runtime converts tensors into its own layout at the edges of what it runs (channels-last or
    blocked convolution layouts), work the whole network does once but an entry timed alone does at its every edge.
    So there a segment's variant is timed chained after the previous segment, intact (``prev -> variant``), and its
    cost is that chain's time less the previous segment's alone: the edge costs cancel.
    """
    def build(seg: Segment, variant: frozenset[str]) -> nn.Module:
        return prepare(measured_form(build_segment(model, seg, variant, merge), settings), device, channels_last)

    chained = chains_after_previous(segs, captures, settings.runtime)
    keys: list[dict[frozenset[str], str | None]] = []
    prefixes: list[str | None] = []
    built: dict[str, Pending] = {}
    for i, (seg, cap) in enumerate(zip(segs, captures)):
        seg_keys: dict[frozenset[str], str | None] = {}
        for variant in seg.variants():
            if seg.name in variant:
                seg_keys[variant] = None
                continue
            module = build(seg, variant)
            relative = [name[len(seg.name) + 1:] for name in variant]
            label = f"{seg.name} [{variant_label(seg, variant)}] {type(module).__name__}"
            if not chained[i]:
                key = entry_key("segment", module, relative, cap)
                built.setdefault(key, Pending(key, module, cap, f"{label} {describe(cap.args)}"))
            else:
                chain = nn.Sequential(build(segs[i - 1], frozenset()), module)
                key = entry_key("chain", chain, relative, captures[i - 1])
                built.setdefault(key, Pending(key, chain, captures[i - 1], f"{label} after {segs[i - 1].name} "
                                                                             f"{describe(captures[i - 1].args)}"))
            seg_keys[variant] = key
        keys.append(seg_keys)
        prefixes.append(None)
    for i in range(1, len(segs)):  # a chained segment's prefix: the previous segment's intact entry alone
        if chained[i]:
            prev, alone = segs[i - 1], build(segs[i - 1], frozenset())
            prefixes[i] = entry_key("segment", alone, [], captures[i - 1])
            built.setdefault(prefixes[i], Pending(prefixes[i], alone, captures[i - 1],
                                                  f"{prev.name} [-] alone {describe(captures[i - 1].args)}"))
    return keys, list(built.values()), prefixes


def _fixed_pending(model: nn.Module, segs: Sequence[Segment], captures: Sequence[Capture], example: Any,
                   call_kwargs: Mapping[str, Any], device: torch.device, channels_last: bool, settings: TableSettings
                   ) -> Pending:
    """The entry behind the fixed part. Eager: the network with its segments replayed. Other runtimes compile across
    segment boundaries and fold a replayed constant (and drop the stem that feeds it), so a replay network would
    time something else: there the entry is the whole intact network, and the fixed part is derived from it
    (:func:`fixed_from_whole`)."""
    name = getattr(model, "zoo_name", type(model).__name__)
    capture = Capture((example,), call_kwargs)
    if settings.runtime == "eager":
        module = prepare(measured_form(replay_model(model, segs, captures), settings), device, channels_last)
        return Pending(entry_key(FIXED, module, [], capture), module, capture, f"{name} fixed part (segments replayed)")
    module = prepare(measured_form(copy.deepcopy(model), settings), device, channels_last)
    return Pending(entry_key(WHOLE, module, [], capture), module, capture, f"{name} whole network")


STATS = ("median_ms", "mean_ms", "min_ms", "p10_ms")


def entry_cost(record: Mapping[str, Any], base: Mapping[str, Any], stat: str) -> float:
    """An entry's cost under one statistic: its time less its base (the call overhead, or a chained entry's prefix)."""
    return max(0.0, record[stat] - base[stat])


def fixed_from_whole(whole: Mapping[str, Any], intact: Sequence[Mapping[str, float]]) -> dict[str, Any]:
    """The fixed part of a table outside eager: the whole network's time less every intact segment's cost (`intact`:
    per segment, its cost under each statistic), so the table predicts the intact network as measured and a plan by
    the costs of what it changes."""
    derived = dict(whole)
    for stat in STATS:
        derived[stat] = whole[stat] - sum(costs[stat] for costs in intact)
    derived["what"] = f"{whole.get('what', 'whole network')} less its intact segments"
    derived["peak_mem_bytes"] = None  # the stem and head alone were not run: memory predictions use the entries
    return derived


def _table_records(pending: Sequence[Pending], known: Mapping[str, dict[str, Any]],
                   keys: Sequence[Mapping[frozenset[str], str | None]], prefixes: Sequence[str | None], fixed_key: str,
                   settings: TableSettings) -> dict[str, dict[str, Any]]:
    """The table's records from the cache's; outside eager the fixed part is derived (never cached itself)."""
    records = {p.key: known[p.key] for p in pending}
    if settings.runtime != "eager":
        overhead = records[pending[-1].key]
        intact = [{stat: entry_cost(records[k[frozenset()]], records[prefix] if prefix else overhead, stat)
                   for stat in STATS} for k, prefix in zip(keys, prefixes)]
        records[fixed_key] = fixed_from_whole(records[fixed_key], intact)
    return records


def _overhead_pending(device: torch.device) -> Pending:
    capture = Capture((torch.zeros(1, device=device),), {})
    return Pending(entry_key(OVERHEAD, nn.Identity(), [], capture), nn.Identity(), capture, "nn.Identity call")


def resolve_cuda_timing(model: nn.Module, example: Any, forward_kwargs: Mapping[str, Any], device: torch.device,
                        settings: TableSettings) -> tuple[str, dict[str, Any]]:
    """The timing protocol for ``cuda_timing="auto"``; call inside the table's timing context.

    The whole network is timed isolated (its latency) and queued (its device time); entries are timed queued
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
    ort_session = settings.runtime == "onnxruntime" or (settings.runtime == "tensorrt"
                                                          and tensorrt_backend() != "torch_tensorrt")
    if settings.cuda_timing == "isolated" or not can_queue() or ort_session:
        return replace(settings, cuda_timing="isolated"), {}
    if settings.cuda_timing == "queued":
        return settings, {}
    cached = [timing for timing in ("queued", "isolated")
              if LatencyCache(condition(replace(settings, cuda_timing=timing)), cache_dir).path.exists()]
    if len(cached) == 1:
        return replace(settings, cuda_timing=cached[0]), {}
    whole = prepare(measured_form(model, settings), device, channels_last)  # the form calibration times
    with timing_context(device, dtype, settings.threads):
        whole = in_runtime(whole, (example,), forward_kwargs, settings.runtime, device, settings.threads, dtype,
                           "the whole network")
        timing, probe = resolve_cuda_timing(whole, example, forward_kwargs, device, settings)
    return replace(settings, cuda_timing=timing), probe


def _store(cache: LatencyCache, records: dict[str, dict[str, Any]], known: dict[str, dict[str, Any]]
           ) -> dict[str, dict[str, Any]]:
    """Merge new records into the cache file; on a write failure warn and keep them in memory."""
    if not records:
        return known
    try:
        return cache.merge_write(records)
    except (OSError, Timeout) as exc:
        warnings.warn(f"Could not write latency cache {cache.path} ({exc}); the table is kept in memory only.",
                      LatencyCacheWarning, stacklevel=3)
        return {**known, **records}


def build_table(
    model: nn.Module | str,
    batch_size: int = 1,
    input_size: int | Sequence[int] | None = None,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "float32",
    channels_last: bool = False,
    threads: int | None = None,
    cache_dir: str | None = None,
    settings: TableSettings | None = None,
    merge: bool = True,
    workload: str = "forward",
    forward_kwargs: Mapping[str, Any] | None = None,
    example_input: Any = None,
    runtime: str | None = None,
) -> LatencyTable:
    """Build (or load from the cache) the latency table of `model` (a zoo model or a registered name).

    The model is copied, moved to `device` and put in eval mode; entries missing from the cache are measured
    now in interleaved rounds and merged into the cache file. See the module docstring for the prediction
    model and for the `workload` / `forward_kwargs` / `example_input` hooks. `runtime` (default
    ``settings.runtime``, eager): the deploy runtime the entries are timed in (:mod:`zoo.latency.runtime`); one that
    is missing here is refused before any work.
    """
    start = time.perf_counter()
    settings = settings or TableSettings()
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ZooError(f"batch_size={batch_size!r} must be an integer >= 1.")
    if threads is not None:
        settings = replace(settings, threads=threads)
    if runtime is not None:
        settings = replace(settings, runtime=runtime)
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    check_clock(settings.clock, dev, settings.threads)
    check_runtime(settings.runtime, dev, torch_dtype)
    if isinstance(model, str):
        from ..factory import create_model

        model = create_model(model)
    else:
        model = copy.deepcopy(model)
    model = prepare(model, dev, channels_last)
    size = normalise_input_size(model, input_size)
    example = example_input if example_input is not None else model.example_input(batch_size, size)
    example = example.to(dev)
    if channels_last and example.dim() == 4:
        example = example.contiguous(memory_format=torch.channels_last)
    call_kwargs = dict(forward_kwargs or {})
    segs = segments(model)
    probe: dict[str, Any] = {}
    if settings.entries == "auto":
        in_context = dev.type == "cpu" and settings.runtime == "eager"
        settings = replace(settings, entries="context" if in_context else "isolated")
    if dev.type == "cuda":
        def condition_of(s: TableSettings) -> dict[str, Any]:
            return condition_key(dev, torch_dtype, batch_size, size, channels_last, workload, s)

        with device_lock(dev):
            settings, probe = choose_cuda_timing(model, example, call_kwargs, dev, torch_dtype, channels_last,
                                                 condition_of, cache_dir, settings)
    condition = condition_key(dev, torch_dtype, batch_size, size, channels_last, workload, settings)
    cache = LatencyCache(condition, cache_dir)
    with timing_context(dev, torch_dtype, settings.threads):
        captures = capture_segments(model, segs, example, call_kwargs)
        keys, pending, prefixes = _variant_entries(model, segs, captures, dev, channels_last, merge, settings)
        fixed = _fixed_pending(model, segs, captures, example, call_kwargs, dev, channels_last, settings)
        pending += [fixed, _overhead_pending(dev)]
        known = cache.load()
        missing = [p for p in pending if p.key not in known]
        if missing:
            with device_lock(dev), warnings.catch_warnings():  # another process may have measured them meanwhile
                warnings.simplefilter("ignore", LatencyCacheWarning)  # a damaged file was reported by the first read
                known = cache.load()
                missing = [p for p in pending if p.key not in known]
                if missing:
                    logger.info("latency table: measuring %d of %d entries on %s", len(missing), len(pending),
                                condition["device_name"])
                    Bench(model, (example,), call_kwargs, dev, settings.cuda_graph, settings.clock).warmup(
                        settings.warmup_s)
                    if settings.entries == "context":
                        records = measure_in_context(model, segs, keys, fixed.key, example, call_kwargs, dev,
                                                     channels_last, merge, settings)
                        for p in pending:  # peak memory of each entry alone (an estimate on the CPU)
                            if p.key in records:
                                mem = peak_memory(p.module, p.capture.args, p.capture.kwargs, dev)
                                what = p.what if p is not fixed else p.what.replace("segments replayed",
                                                                                    "time outside the segments")
                                records[p.key].update(peak_mem_bytes=mem[0], mem_estimated=mem[1], what=what)
                        records[pending[-1].key] = context_overhead_record()
                        wanted = {p.key for p in missing}
                        records = {k: v for k, v in records.items() if k in wanted}
                    else:
                        records = measure_rounds(missing, dev, settings, reference=fixed)
                    known = _store(cache, records, known)
    measured = {p.key for p in missing}
    sources = {p.key: "measured" if p.key in measured else "cached" for p in pending}
    return LatencyTable(
        model_name=getattr(model, "zoo_name", type(model).__name__), condition=condition, segments=segs, keys=keys,
        records=_table_records(pending, known, keys, prefixes, fixed.key, settings), fixed_key=fixed.key,
        prefix_keys=prefixes,
        overhead_key=pending[-1].key,
        n_measured=len(missing), n_cached=len(pending) - len(missing), build_s=time.perf_counter() - start,
        sources=sources, model=model, example=example, forward_kwargs=call_kwargs, merge=merge, settings=settings,
        timing_probe=probe,
    )


__all__ = ["LatencyTable", "Replay", "TableSettings", "build_table", "capture_segments",
           "condition_key", "entry_key", "replay_model"]
