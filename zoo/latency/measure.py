"""Latency measurement: warm-up by time, per-run timing, adaptive repetition, robust statistics.

CPU: ``time.perf_counter`` around each call, inside :func:`~zoo.latency.device.timing_context` (inference mode,
fixed thread count, flushed denormals, GC paused). CUDA: an event pair recorded around each call (or around one
CUDA-graph replay), synchronised after the end event so no host work sits inside the timed region; every run
starts from an idle device, so this is latency, not pipelined throughput.

A *queued* CUDA bench (latency-table records) first enqueues a GPU sleep longer than the host needs to launch the
call, then records the start event: the call's kernels are all queued when the device reaches them, as they are
for a segment deep inside a device-bound network (the host runs ahead). The time is then the device's alone; an
isolated run would add the host's Python and launch time before the first kernel to every segment.

:class:`Bench` holds one callable and its samples; :func:`measure` warms it up and repeats until the median's
relative uncertainty is under a tolerance or a run/time cap is hit. Table builds and whole-network timing drive many
benches in interleaved rounds with the same class, so CPU and CUDA share every line but the timer.
"""

from __future__ import annotations

import copy
import functools
import math
import random
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from ..deploy.fuse import fuse
from .cache import device_lock
from .device import device_name, dtype_name, resolve_device, resolve_dtype, synchronize, timing_context

# sqrt(pi/2) * 1.4826: asymptotic standard error of a median, in units of MAD / sqrt(n), for normal noise.
MEDIAN_SE_PER_MAD = 1.8582


@dataclass(frozen=True)
class MeasureSettings:
    """How long and how precisely to time one callable.

    warmup_s: untimed calls before timing, by wall time (CPU timings keep falling for seconds).
    rel_tol: stop once the median's relative standard error (MAD-based) is at most this.
    min_runs / max_runs / max_time_s: bounds on the timed runs; hitting a cap first sets ``cap_hit``.
    threads: CPU threads (1 is the most stable on a shared machine).
    cuda_graph: on CUDA, time replays of a captured CUDA graph instead of eager calls.
    clock: CPU only: ``wall`` (``time.perf_counter``) or ``thread`` (CPU time of the calling thread,
        ``time.thread_time_ns``: time the OS gave to other processes is not counted, which makes a busy shared
        machine usable; valid with threads=1 only, where every op runs in the calling thread).
    """

    warmup_s: float = 1.0
    rel_tol: float = 0.01
    min_runs: int = 10
    max_runs: int = 100_000
    max_time_s: float = 10.0
    threads: int = 1
    cuda_graph: bool = False
    clock: str = "wall"


CLOCKS = ("wall", "thread")
ROUND_ORDERS = ("fixed", "shuffled")


@dataclass(frozen=True)
class RoundSettings:
    """Interleaved rounds, the protocol shared by tables (:class:`~zoo.latency.settings.TableSettings`) and
    whole-network timing (:class:`~zoo.latency.settings.NetworkTimingSettings`).

    warmup_s: untimed running before the first round (CPU speed settles over seconds).
    runs_per_round: timed calls of each network (record) per round.
    warm_calls: untimed calls of each network right before its timed ones in every round (0: the previous network
        in the round leaves the caches as a real predecessor would).
    round_order: ``fixed`` (the same order every round) or ``shuffled`` (a new seeded order each round).
    min_rounds / max_rounds / rel_tol / max_time_s: at least `min_rounds`; then until every median's relative
        standard error is at most `rel_tol`, or `max_rounds` / `max_time_s` is reached.
    """

    warmup_s: float = 2.0
    runs_per_round: int = 1
    warm_calls: int = 0
    round_order: str = "fixed"
    min_rounds: int = 20
    max_rounds: int = 100
    rel_tol: float = 0.005
    max_time_s: float = 120.0
    label: ClassVar[str] = "RoundSettings"  # how errors name these settings (with their config key)

    def __post_init__(self) -> None:
        check_rounds(self, self.label)


def check_rounds(settings: Any, name: str) -> None:
    """The round and time settings of a timing protocol (``TableSettings``, ``NetworkTimingSettings``) in range."""
    from ..errors import ZooError

    problems = [f"{key}={getattr(settings, key)} must be {rule}" for key, ok, rule in (
        ("min_rounds", settings.min_rounds >= 1, ">= 1"), ("runs_per_round", settings.runs_per_round >= 1, ">= 1"),
        ("max_rounds", settings.max_rounds >= settings.min_rounds, ">= min_rounds"),
        ("rel_tol", settings.rel_tol >= 0, ">= 0"), ("max_time_s", settings.max_time_s > 0, "> 0"),
        ("warmup_s", settings.warmup_s >= 0, ">= 0"), ("warm_calls", settings.warm_calls >= 0, ">= 0")) if not ok]
    if settings.round_order not in ROUND_ORDERS:
        problems.append(f"round_order={settings.round_order!r} must be one of {', '.join(ROUND_ORDERS)}")
    if problems:
        raise ZooError(f"{name}: {'; '.join(problems)}.")


def check_clock(clock: str, device: torch.device, threads: int) -> None:
    """The thread clock needs the CPU and one thread; raise a clear error otherwise."""
    from .device import LatencyDeviceError

    if clock not in CLOCKS:
        raise LatencyDeviceError(f"Unknown clock {clock!r}; allowed are 'wall' and 'thread' (CPU, 1 thread).")
    if clock == "thread" and (device.type != "cpu" or threads != 1):
        raise LatencyDeviceError(
            f"clock='thread' counts the CPU time of the calling thread, so it needs device='cpu' and threads=1 "
            f"(got device {device.type}, threads {threads}). Use clock='wall' there."
        )


@dataclass
class LatencyStats:
    """Robust statistics of one measured callable, with the conditions they hold for."""

    median_ms: float
    iqr_ms: float
    mad_ms: float
    mean_ms: float
    min_ms: float
    p10_ms: float
    rel_uncertainty: float
    n_runs: int
    time_s: float
    cap_hit: bool
    device: str
    device_name: str
    dtype: str
    batch_size: int | None
    threads: int
    torch_version: str
    channels_last: bool = False
    cuda_graph: bool = False
    clock: str = "wall"
    peak_mem_bytes: int | None = None
    mem_estimated: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        cap = ", cap hit" if self.cap_hit else ""
        return (f"{self.median_ms:.4f} ms (IQR {self.iqr_ms:.4f}, MAD {self.mad_ms:.4f}, n={self.n_runs}{cap}) "
                f"on {self.device_name} [{self.dtype}, batch {self.batch_size}, {self.threads} thread(s)]")


def robust_summary(times_ms: Sequence[float] | np.ndarray) -> dict[str, float]:
    """Median, IQR, MAD, mean, min, 10th percentile and the median's relative standard error of a sample."""
    t = np.asarray(times_ms, dtype=np.float64)
    if t.size == 0:
        return {"median_ms": math.nan, "iqr_ms": math.nan, "mad_ms": math.nan, "mean_ms": math.nan,
                "min_ms": math.nan, "p10_ms": math.nan, "rel_uncertainty": math.inf}
    median = float(np.median(t))
    p10, q1, q3 = np.percentile(t, [10, 25, 75])
    mad = float(np.median(np.abs(t - median)))
    se = MEDIAN_SE_PER_MAD * mad / math.sqrt(t.size)
    return {"median_ms": median, "iqr_ms": float(q3 - q1), "mad_ms": mad, "mean_ms": float(t.mean()),
            "min_ms": float(t.min()), "p10_ms": float(p10), "rel_uncertainty": se / median if median > 0 else math.inf}


def tensor_bytes(value: Any) -> int:
    """Bytes of every tensor inside a (nested) tuple/list/dict."""
    if torch.is_tensor(value):
        return value.numel() * value.element_size()
    if isinstance(value, (tuple, list)):
        return sum(tensor_bytes(v) for v in value)
    if isinstance(value, Mapping):
        return sum(tensor_bytes(v) for v in value.values())
    return sum(tensor_bytes(v) for v in vars(value).values()) if hasattr(value, "__dataclass_fields__") else 0


class Bench:
    """One callable ``fn(*args, **kwargs)`` on a device, and the run times (ms) collected so far.

    Call :meth:`warmup` and :meth:`run` inside :func:`~zoo.latency.device.timing_context`.
    """

    def __init__(self, fn: Callable[..., Any], args: tuple = (), kwargs: Mapping[str, Any] | None = None,
                 device: torch.device | None = None, cuda_graph: bool = False, clock: str = "wall",
                 queued: bool = False):
        self.fn, self.args, self.kwargs = fn, tuple(args), dict(kwargs or {})
        self.device = device if device is not None else torch.device("cpu")
        self.clock = clock
        self.cuda_graph = cuda_graph and self.device.type == "cuda"
        self.queued = queued and self.device.type == "cuda" and can_queue()
        self._sleep_cycles = 0
        self.times_ms: list[float] = []
        self.time_s = 0.0
        self._call: Callable[[], Any] = self._eager
        self._events: tuple[Any, Any] | None = None
        self._graph: Any = None
        self.graph_output: Any = None  # with cuda_graph: the output tensors each replay writes into

    def _eager(self) -> Any:
        return self.fn(*self.args, **self.kwargs)

    def _prepare(self) -> None:
        """Once, on CUDA: create the event pair and, if asked, capture the call into a CUDA graph."""
        if self.device.type != "cuda" or self._events is not None:
            return
        self._events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        if self.cuda_graph:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(3):
                    self._eager()
            torch.cuda.current_stream(self.device).wait_stream(side)
            self._graph = torch.cuda.CUDAGraph()
            with warnings.catch_warnings():  # a call without kernels (the call-overhead record) captures nothing
                warnings.filterwarnings("ignore", message="The CUDA Graph is empty")
                with torch.cuda.graph(self._graph):
                    self.graph_output = self._eager()
            self._call = self._graph.replay

    def call(self) -> Any:
        """One untimed call the way the bench times it (eager, or a graph replay that refreshes `graph_output`)."""
        self._prepare()
        return self._call()

    def _queue_ahead(self) -> None:
        """Queued mode: enqueue a GPU sleep that outlasts the host's launch of one call (sized once, from the
        slowest of three untimed calls' host time, doubled, plus 20 us)."""
        if not self._sleep_cycles:
            host_s = 0.0
            for _ in range(3):
                t0 = time.perf_counter()
                self._call()
                host_s = max(host_s, time.perf_counter() - t0)
            synchronize(self.device)
            self._sleep_cycles = max(1, int(sleep_cycles_per_us(self.device) * (2e6 * host_s + 20.0)))
        torch.cuda._sleep(self._sleep_cycles)

    def _time_once(self) -> float:
        """One timed call, in ms. The host only records events / reads the clock inside the timed region."""
        if self._events is not None:
            start, end = self._events
            if self.queued:
                self._queue_ahead()
            start.record()
            self._call()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        if self.clock == "thread":
            c0 = time.thread_time_ns()
            self._call()
            c1 = time.thread_time_ns()
            return (c1 - c0) * 1e-6
        t0 = time.perf_counter()
        self._call()
        t1 = time.perf_counter()
        return (t1 - t0) * 1e3

    def warmup(self, seconds: float, min_calls: int = 2) -> None:
        """Untimed calls for at least `seconds` of wall time (and `min_calls` calls)."""
        self._prepare()
        start, calls = time.perf_counter(), 0
        while calls < min_calls or time.perf_counter() - start < seconds:
            self._call()
            calls += 1
        synchronize(self.device)

    def run(self, seconds: float = 0.0, min_runs: int = 1, max_runs: int | None = None, discard: int = 0) -> None:
        """Time runs for about `seconds` (at least `min_runs`, at most `max_runs`) after `discard` untimed calls."""
        self._prepare()
        for _ in range(discard):
            self._call()
        synchronize(self.device)
        start = time.perf_counter()
        runs = 0
        while runs < min_runs or (time.perf_counter() - start < seconds and (max_runs is None or runs < max_runs)):
            self.times_ms.append(self._time_once())
            runs += 1
        self.time_s += time.perf_counter() - start

    def summary(self) -> dict[str, float]:
        return robust_summary(self.times_ms)

    def converged(self, rel_tol: float, min_runs: int) -> bool:
        return len(self.times_ms) >= min_runs and self.summary()["rel_uncertainty"] <= rel_tol


@functools.cache
def can_queue() -> bool:
    """Whether this PyTorch has the GPU sleep kernel queued timing needs (else benches time isolated calls); the
    warning that it lacks one is given once."""
    if hasattr(torch.cuda, "_sleep"):
        return True
    warnings.warn("torch.cuda._sleep is missing in this PyTorch, so CUDA latency-table entries are timed as "
                  "isolated calls (host launch time included).", RuntimeWarning, stacklevel=3)
    return False


@functools.cache
def sleep_cycles_per_us(device: torch.device) -> float:
    """GPU clock cycles per microsecond of ``torch.cuda._sleep`` on `device`, timed once with events."""
    with torch.cuda.device(device):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(100_000)  # let the clock rise
        start.record()
        torch.cuda._sleep(2_000_000)
        end.record()
        end.synchronize()
        return 2_000_000 / (start.elapsed_time(end) * 1e3)


def call_peak_memory(fn: Callable[..., Any], args: tuple, kwargs: Mapping[str, Any], device: torch.device
                     ) -> tuple[int, bool]:
    """(bytes, estimated) of one call's peak memory above what was allocated before it.

    CUDA: the caching allocator's peak (``max_memory_allocated`` after a reset) minus the allocation before the
    call, i.e. activations and workspaces. CPU (an estimate, flagged True): the largest input + output bytes of
    any leaf module's call, or of the whole call for a plain function.
    """
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn(*args, **kwargs)
        synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before, False
    largest = [0]

    def hook(module: nn.Module, inputs: Any, output: Any) -> None:
        largest[0] = max(largest[0], tensor_bytes(inputs) + tensor_bytes(output))

    leaves = [m for m in fn.modules() if not list(m.children())] if isinstance(fn, nn.Module) else []
    handles = [m.register_forward_hook(hook) for m in leaves]
    try:
        output = fn(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    if not leaves:
        largest[0] = tensor_bytes(args) + tensor_bytes(kwargs) + tensor_bytes(output)
    return largest[0], True


def move_inputs(value: Any, device: torch.device, channels_last: bool) -> Any:
    """Tensors inside `value` moved to `device` (4-D float ones in channels_last memory format if asked)."""
    if torch.is_tensor(value):
        value = value.to(device)
        if channels_last and value.dim() == 4 and value.is_floating_point():
            value = value.contiguous(memory_format=torch.channels_last)
        return value
    if isinstance(value, (tuple, list)):
        return type(value)(move_inputs(v, device, channels_last) for v in value)
    if isinstance(value, Mapping):
        return {k: move_inputs(v, device, channels_last) for k, v in value.items()}
    return value


def batch_size_of(args: Sequence[Any], kwargs: Mapping[str, Any]) -> int | None:
    for value in (*args, *kwargs.values()):
        if torch.is_tensor(value) and value.dim() > 0:
            return int(value.shape[0])
    return None


def make_stats(bench: Bench, cap_hit: bool, dtype: torch.dtype, threads: int, channels_last: bool,
               memory: tuple[int | None, bool] = (None, True), extra: dict[str, Any] | None = None) -> LatencyStats:
    """The :class:`LatencyStats` of a bench's samples and the conditions they were taken in."""
    return LatencyStats(
        **bench.summary(), n_runs=len(bench.times_ms), time_s=bench.time_s, cap_hit=cap_hit,
        device=str(bench.device), device_name=device_name(bench.device), dtype=dtype_name(dtype),
        batch_size=batch_size_of(bench.args, bench.kwargs), threads=threads, torch_version=torch.__version__,
        channels_last=channels_last, cuda_graph=bench.cuda_graph, clock=bench.clock, peak_mem_bytes=memory[0],
        mem_estimated=memory[1],
        extra=dict(extra or {}),
    )


def repeat_until_converged(bench: Bench, settings: MeasureSettings, chunk_s: float = 0.1) -> bool:
    """Time `bench` in chunks until converged or a cap is hit; True when a cap stopped it first."""
    while True:
        bench.run(seconds=chunk_s, min_runs=1, max_runs=settings.max_runs - len(bench.times_ms))
        if bench.converged(settings.rel_tol, settings.min_runs):
            return False
        if len(bench.times_ms) >= settings.max_runs or bench.time_s >= settings.max_time_s:
            return True


def measure(
    fn_or_module: Callable[..., Any] | nn.Module,
    inputs: Any = (),
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "float32",
    channels_last: bool = False,
    settings: MeasureSettings | None = None,
    kwargs: Mapping[str, Any] | None = None,
    memory: bool = True,
    **overrides: Any,
) -> LatencyStats:
    """Latency statistics of ``fn_or_module(*inputs, **kwargs)`` on `device`.

    inputs: a tensor or a tuple/list of positional arguments; tensors are moved to the device. A module is
    measured in eval mode on a copy moved to the device (channels_last if asked); reduced dtypes run as autocast.
    settings / overrides: :class:`MeasureSettings` fields, e.g. ``warmup_s=0.5, rel_tol=0.02, threads=1``.
    """
    settings = MeasureSettings(**{**asdict(settings or MeasureSettings()), **overrides})
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    check_clock(settings.clock, dev, settings.threads)
    args = (inputs,) if torch.is_tensor(inputs) else tuple(inputs)
    args, call_kwargs = move_inputs(args, dev, channels_last), move_inputs(dict(kwargs or {}), dev, channels_last)
    fn = fn_or_module
    if isinstance(fn_or_module, nn.Module):
        fn = copy.deepcopy(fn_or_module).to(dev).eval()
        if channels_last:
            fn = fn.to(memory_format=torch.channels_last)
    bench = Bench(fn, args, call_kwargs, dev, settings.cuda_graph, settings.clock)
    with device_lock(dev), timing_context(dev, torch_dtype, settings.threads):
        mem = call_peak_memory(fn, args, call_kwargs, dev) if memory else (None, True)
        bench.warmup(settings.warmup_s)
        cap_hit = repeat_until_converged(bench, settings)
    return make_stats(bench, cap_hit, torch_dtype, settings.threads, channels_last, mem)


def time_rounds(benches: Sequence[Bench], rounds: tuple[int, int], runs_per_round: int, rel_tol: float,
                max_time_s: float, together: bool = False, warm_calls: int = 0, order: str = "fixed") -> list[bool]:
    """Time benches in interleaved rounds until each converged (after the minimum rounds) or a cap hit.

    ``together``: every bench runs in every round until all have converged (runs line up round by round).
    ``warm_calls``: untimed calls of each bench right before its timed runs in every round, so a run starts from
    the state its own call leaves (as when a network serves request after request), not from the state the
    previous bench in the round left (docs/latency.md, "Neighbours": one network timed after different networks
    sat up to 1.8 % either side of its mean by its predecessor alone).
    ``order``: ``fixed`` runs the benches in the same order every round (A B C A B C ...), so each one follows the
    same predecessor in every round; ``shuffled`` draws a new random order for every round (seeded, so a session's
    orders repeat), so a bench's predecessor changes from round to round instead of adding the same bias to every
    one of its runs.
    Returns per bench whether a cap (max rounds or time) stopped it before its median converged.
    """
    if order not in ROUND_ORDERS:
        raise ValueError(f"Unknown round order {order!r}; allowed are {', '.join(ROUND_ORDERS)}.")
    min_rounds, max_rounds = rounds
    active = list(range(len(benches)))
    shuffler = random.Random(0)
    start = time.perf_counter()
    for round_index in range(max_rounds):
        for i in (shuffler.sample(active, len(active)) if order == "shuffled" else active):
            benches[i].run(min_runs=runs_per_round, discard=warm_calls)
        if round_index + 1 >= min_rounds:
            pending = [i for i in active if not benches[i].converged(rel_tol, min_rounds * runs_per_round)]
            active = (active if pending else []) if together else pending
        if not active or time.perf_counter() - start > max_time_s:
            break
    return [i in active for i in range(len(benches))]


def measured_form(module: nn.Module, settings: Any) -> nn.Module:
    """The form a module is timed in: its deploy form (a fused copy) unless ``settings.deploy`` is off."""
    return fuse(module) if settings.deploy else module


def prepare(module: nn.Module, device: torch.device, channels_last: bool) -> nn.Module:
    module = module.to(device).eval()
    return module.to(memory_format=torch.channels_last) if channels_last else module
