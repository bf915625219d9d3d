"""The CUDA timing protocol of a table's isolated records (``cuda_timing``): ``queued`` (device time behind already
queued kernels) or ``isolated`` (from an idle device, host launch included), chosen once per condition."""

from __future__ import annotations

import logging
import statistics
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from .cache import LatencyCache
from .device import synchronize, timing_context
from .measure import Bench, can_queue, measured_form, prepare, time_rounds
from .runtime import in_runtime, tensorrt_backend, tensorrt_int8_backend
from .settings import TableSettings

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



__all__ = ["DEVICE_BOUND", "choose_cuda_timing", "host_launch", "resolve_cuda_timing"]
