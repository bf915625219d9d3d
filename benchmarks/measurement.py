"""Timing modes on one network: eager, CUDA graph, autocast bf16 and channels_last, each timed by
:func:`zoo.latency.measure` (CUDA events) and against a synchronised wall clock, and each mode's outputs against eager
fp32 (within a stated tolerance per mode: the suite's targets).

    python -m benchmarks run measurement --device cuda     # MobileNetV2-1.4, batch 128 (part of the GPU check)
    python -m benchmarks run measurement --device cpu --quick   # eager and the layouts only, tiny sizes
"""

from __future__ import annotations

import copy
import time
from typing import Any

import torch

import zoo
from benchmarks.common import Check, rel_diff, smoke_model, write_result
from benchmarks.latency_table import gpu_member
from zoo.latency import measure
from zoo.latency.device import resolve_dtype, synchronize, timing_context
from zoo.latency.measure import Bench, LatencyStats, move_inputs, prepare

# fp32 on CUDA may use TF32 convolutions (cuDNN's default), hence 1e-2 where layouts pick other kernels
TOLERANCE = {"channels_last": 1e-2, "fused": 1e-2, "autocast_bf16": 1e-1, "graph_replay": 1e-5,
             "graph_replay_new_input": 1e-2}


def modes(device: str) -> dict[str, dict[str, Any]]:
    """The timing modes checked: keyword arguments of :func:`zoo.latency.measure` for each."""
    found: dict[str, dict[str, Any]] = {"eager_fp32": {}}
    if device == "cuda":
        found.update(graph_fp32={"cuda_graph": True}, eager_bf16={"dtype": "bfloat16"},
                     eager_bf16_cl={"dtype": "bfloat16", "channels_last": True},
                     graph_bf16_cl={"dtype": "bfloat16", "channels_last": True, "cuda_graph": True})
    return found


def run(quick: bool = False, device: str = "cuda", out: str | None = None) -> dict[str, Any]:
    """Each timing mode on one network: its stats, events vs a synchronised wall clock, outputs vs eager fp32."""
    device = "cuda" if device == "auto" and torch.cuda.is_available() else "cpu" if device == "auto" else device
    name, batch, size = (gpu_member("mobilenetv2"), 128, 224) if device == "cuda" and not quick else (
        smoke_model(), 2, 64)
    model = zoo.create_model(name).eval()
    x = torch.randn(batch, 3, size, size)
    settings = {"warmup_s": 1.0 if device == "cuda" else 0.2, "max_time_s": 5.0, "rel_tol": 0.02}
    result: dict[str, Any] = {"suite": "measurement", "model": name, "batch": batch, "size": size}
    for mode, kwargs in modes(device).items():
        stats = measure(model, x, device, **kwargs, **settings)
        result[mode] = {**stats.to_dict(), "wall_vs_events": wall_clock_ratio(model, x, device, stats, **kwargs)}
    result["outputs"] = output_agreement(model, x, device)
    write_result("measurement", result, out)
    return result


def wall_clock_ratio(model: torch.nn.Module, x: torch.Tensor, device: str, stats: LatencyStats, calls: int = 50,
                     dtype: str = "float32", channels_last: bool = False, cuda_graph: bool = False
                     ) -> dict[str, float]:
    """Synchronised wall time per call over `calls` back-to-back calls in the same mode, vs the measured median.

    Back-to-back calls overlap the host's launch work with the device's, so a ratio a little under 1 is expected
    where the host is the bottleneck; far from 1 means the timer is wrong.
    """
    dev = torch.device(device)
    net = prepare(copy.deepcopy(model), dev, channels_last)
    bench = Bench(net, (move_inputs(x, dev, channels_last),), {}, dev, cuda_graph)
    with timing_context(dev, resolve_dtype(dtype, dev), threads=1):
        bench.warmup(0.2)
        start = time.perf_counter()
        for _ in range(calls):
            bench.call()
        synchronize(dev)
        wall_ms = (time.perf_counter() - start) / calls * 1e3
    return {"wall_ms": wall_ms, "measured_median_ms": stats.median_ms, "ratio": wall_ms / stats.median_ms}


@torch.inference_mode()
def output_agreement(model: torch.nn.Module, x: torch.Tensor, device: str) -> dict[str, Any]:
    """Max relative difference of each mode's logits from eager fp32, with the mode's tolerance."""
    dev = torch.device(device)
    net = copy.deepcopy(model).to(dev).eval()
    x = x.to(dev)
    ref = net(x)
    diffs = {"channels_last": rel_diff(prepare(copy.deepcopy(net), dev, True)(
        x.contiguous(memory_format=torch.channels_last)), ref), "fused": rel_diff(zoo.fuse(net)(x), ref)}
    if dev.type == "cuda":
        with torch.autocast("cuda", dtype=torch.bfloat16):
            diffs["autocast_bf16"] = rel_diff(net(x), ref)
        bench = Bench(net, (x,), {}, dev, cuda_graph=True)
        bench.call()
        diffs["graph_replay"] = rel_diff(bench.graph_output, ref)
        fresh = torch.randn_like(x)
        x.copy_(fresh)  # new data in the captured input: a replay must follow it
        bench.call()
        diffs["graph_replay_new_input"] = rel_diff(bench.graph_output, net(fresh))
    return {mode: {"max_rel_diff": d, "tolerance": TOLERANCE[mode]} for mode, d in diffs.items()}


def checks(result: dict[str, Any]) -> list[Check]:
    """Every mode's outputs within its tolerance of eager fp32 (the tolerance stated here, not the stored one)."""
    return [Check(f"output {mode} within {TOLERANCE.get(mode, o['tolerance']):g}", o.get("max_rel_diff"), "<=",
                  TOLERANCE.get(mode, o["tolerance"])) for mode, o in result.get("outputs", {}).items()]


def markdown(result: dict[str, Any]) -> str:
    lines = [f"{result['model']}, batch {result['batch']}, {result['size']} px", "",
             "| mode | median ms | IQR ms | runs | wall/events |", "|---|---:|---:|---:|---:|"]
    for mode in modes("cuda"):
        if mode in result:
            m = result[mode]
            lines.append(f"| {mode} | {m['median_ms']:.3f} | {m['iqr_ms']:.3f} | {m['n_runs']} | "
                         f"{m['wall_vs_events']['ratio']:.3f} |")
    lines += ["", "Outputs against eager fp32: " + "; ".join(
        f"{mode} {o['max_rel_diff']:.1e} (tolerance {o['tolerance']:g})" for mode, o in result["outputs"].items())]
    return "\n".join(lines)
