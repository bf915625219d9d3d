"""In-context timing: how long each segment takes inside the running network.

:class:`ContextBench` times a whole network like :class:`~zoo.latency.measure.Bench` and, on every timed call,
also the time between a forward pre-hook and a forward hook on each named submodule (the segment's boundaries).
On the CPU the hooks read the bench's clock; on CUDA they record events on the current stream, so a segment's
time is the device's time between its boundaries, with the kernels queued as the network queues them.

A segment timed in context starts from the cache state the network leaves it (its input just written by the
layer before, its weights evicted by the layers since its last call), with the CPU in the state the whole
network keeps it in. Per timed call the bench also keeps the rest of the network's time (the total minus the
segments'): the stem, head and glue, with the hook calls themselves, which :func:`hook_overhead_ms` measures.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from .measure import Bench


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


__all__ = ["ContextBench", "hook_overhead_ms"]
