"""The GPU check: one prepared script for a GPU machine (PyTorch, timm and numpy only; no network), < 8 minutes.

``python benchmarks/gpu_check.py`` (CUDA) or ``python benchmarks/gpu_check.py --device cpu`` (a dry run of every
step that does not need CUDA, on tiny sizes; part of the tests). Steps, each recorded even if another fails, and
skipped (recorded as such) once the time budget (``--budget-s``) is spent:

1. ``measurement``: the timing modes on one network (eager, CUDA graph, AMP bf16, channels_last): CUDA events
   against a synchronised wall clock in each mode, and the outputs of each mode against eager fp32.
2. ``lut``: latency tables of MobileNetV2-1.4 and TResNet-M at batch 128 (fp32; MobileNetV2-1.4 also in bf16
   channels_last) and their prediction error over random plans, beside the noise floor.
3. ``prune_search``: DP search at targets 1.5 and 2.0 on synthetic inputs (label-free importance), plans applied
   and measured side by side with the unpruned network: measured vs target speed-up.
4. ``retnet_decode``: RetNet per-token decode latency vs context length (and the parameter-matched KV-cache
   Transformer's): the CUDA-graph step ``generate`` uses, the same step eager, the reference step; targets at
   batch 1: <= the Transformer at context 128, >= 3x faster at 8192, >= 5x faster than the reference step.
5. ``fla``: flash-linear-attention's fused retention vs our PyTorch path, when ``fla`` is importable.
6. ``train_memory``: activation memory with and without gradient checkpointing.
7. ``runtimes``: latency tables built in the deploy runtimes (onnxruntime's CUDA EP, TensorRT; onnxruntime's CPU EP
   in the dry run) and their raw prediction error over random plans: mean <= 5 %, max <= 10 % (or 1.5x the noise
   floor). A runtime this machine lacks is recorded as skipped with the reason (not passed).

Results: ``$OUT/gpu_check.json`` when ``$OUT`` is set, else ``benchmarks/results/gpu_check.json``; a digest of
the numbers is printed at the end. Every step's ``status`` is computed from its ``verdicts``, each a recorded number
against a stated target (:func:`verdicts`): ``passed`` only when every check ran and met its target; ``failed``,
``error``, ``skipped`` and ``incomplete`` otherwise. Exit status 0 means every step passed, 1 that one failed or
raised, 3 that work was skipped. ``--verdicts REPORT.json`` recomputes the verdicts of a recorded report.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import zoo  # noqa: E402
from benchmarks.common import results_dir  # noqa: E402
from zoo.importance import score_variants  # noqa: E402
from zoo.latency import CalibrationSettings, TableSettings, build_table, calibrate, measure  # noqa: E402
from zoo.latency.calibrate import time_networks  # noqa: E402
from zoo.latency.device import resolve_dtype, synchronize, timing_context  # noqa: E402
from zoo.latency.measure import Bench, LatencyStats, move_inputs, prepare  # noqa: E402
from zoo.search import BudgetError, Choice, dp_search  # noqa: E402
from zoo.surgery import apply_plan  # noqa: E402

STEPS = ("measurement", "lut", "prune_search", "retnet_decode", "fla", "train_memory", "runtimes")
CACHE_DIR = str(Path(os.environ.get("TMPDIR", "/tmp")) / "gpu_check")
TABLE_ERROR_TARGET = 0.05  # the issue's target for the table's prediction error


@dataclass(frozen=True)
class Condition:
    """One network under one measurement condition (CUDA timing protocol: see ``TableSettings.cuda_timing``)."""

    model: str
    batch: int
    dtype: str = "float32"
    channels_last: bool = False
    cuda_timing: str = "auto"
    cuda_graph: bool = False
    runtime: str = "eager"

    @property
    def label(self) -> str:
        layout = "channels_last" if self.channels_last else "contiguous"
        return (f"{self.model}/{self.dtype}/{layout}/b{self.batch}/{self.cuda_timing}"
                f"{'+graph' if self.cuda_graph else ''}{'' if self.runtime == 'eager' else '/' + self.runtime}")


@dataclass(frozen=True)
class Config:
    batch: int  # of the measurement step
    size: int
    measure_model: str
    lut: tuple[Condition, ...]
    plans: int
    prune: tuple[Condition, ...]
    calib_batch: int
    decode_batches: tuple[int, ...]
    table: TableSettings
    timing: CalibrationSettings
    min_step_s: float  # a step (or one condition of a step) starts only with this much of the budget left
    memory: tuple[tuple[str, int, tuple[int, int]], ...] = ()  # train_memory: (model, input size, two batches)
    runtimes: tuple[Condition, ...] = ()  # tables in deploy runtimes (the runtimes step)


MBV2_BF16_CL = Condition("mobilenetv2_140", 128, "bfloat16", True)
GPU = Config(batch=128, size=224, measure_model="mobilenetv2_140",
             lut=(Condition("mobilenetv2_140", 128), Condition("tresnet_m", 128), MBV2_BF16_CL,
                  replace(MBV2_BF16_CL, cuda_timing="isolated"), replace(MBV2_BF16_CL, cuda_graph=True),
                  *(Condition("mobilenetv2_140", 1, cuda_timing=t) for t in ("isolated", "auto"))),
             plans=8, prune=(Condition("mobilenetv2_140", 128), MBV2_BF16_CL),
             calib_batch=32, decode_batches=(1, 16), table=TableSettings(max_time_s=60.0),
             timing=CalibrationSettings(max_time_s=30.0), min_step_s=60.0,
             memory=(("tresnet_m", 224, (16, 32)), ("resnetv2_50x1_bit", 224, (16, 32))),
             runtimes=(Condition("mobilenetv2_100", 32, runtime="onnxruntime"),
                       Condition("mobilenetv2_100", 32, runtime="tensorrt")))
DRY = Config(batch=2, size=64, measure_model="mobilenetv2_035", lut=(Condition("mobilenetv2_035", 2),), plans=2,
             prune=(Condition("mobilenetv2_035", 2),), calib_batch=4, decode_batches=(1,),
             table=TableSettings(warmup_s=0.2, entry_warmup_s=0.01, min_rounds=3, max_rounds=5),
             timing=CalibrationSettings(warmup_s=0.2, net_warmup_s=0.02, min_rounds=3, max_rounds=5), min_step_s=0.0,
             memory=(("tresnet_m", 64, (1, 2)),), runtimes=(Condition("mobilenetv2_035", 2, runtime="onnxruntime"),))


class Budget:
    """Seconds left of the run's time budget."""

    def __init__(self, seconds: float):
        self.end = time.perf_counter() + seconds

    def left(self) -> float:
        return self.end - time.perf_counter()


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|, in fp32."""
    a, b = a.detach().float(), b.detach().float()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


# -- 1. measurement -------------------------------------------------------------------------------------------


def measure_modes(device: str) -> dict[str, dict[str, Any]]:
    """The timing modes checked: keyword arguments of :func:`zoo.latency.measure` for each."""
    modes: dict[str, dict[str, Any]] = {"eager_fp32": {}}
    if device == "cuda":
        modes.update(graph_fp32={"cuda_graph": True}, eager_bf16={"dtype": "bfloat16"},
                     eager_bf16_cl={"dtype": "bfloat16", "channels_last": True},
                     graph_bf16_cl={"dtype": "bfloat16", "channels_last": True, "cuda_graph": True})
    return modes


def check_measurement(device: str, cfg: Config, budget: Budget) -> dict[str, Any]:
    """Each timing mode on one network: its stats, events vs a synchronised wall clock, outputs vs eager fp32."""
    model = zoo.create_model(cfg.measure_model).eval()
    x = torch.randn(cfg.batch, 3, cfg.size, cfg.size)
    quick = {"warmup_s": 1.0 if device == "cuda" else 0.2, "max_time_s": 5.0, "rel_tol": 0.02}
    out: dict[str, Any] = {"model": cfg.measure_model, "batch": cfg.batch, "size": cfg.size}
    for name, kwargs in measure_modes(device).items():
        stats = measure(model, x, device, **kwargs, **quick)
        out[name] = {**stats.to_dict(), "wall_vs_events": wall_clock_ratio(model, x, device, stats, **kwargs)}
    out["outputs"] = output_agreement(model, x, device)
    return out


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
    """Max relative difference of each mode's logits from eager fp32 (and whether it is within tolerance)."""
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
    # fp32 on CUDA may use TF32 convolutions (cuDNN's default), hence 1e-2 where layouts pick other kernels
    tolerance = {"channels_last": 1e-2, "fused": 1e-2, "autocast_bf16": 1e-1, "graph_replay": 1e-5,
                 "graph_replay_new_input": 1e-2}
    return {name: {"max_rel_diff": d, "tolerance": tolerance[name]} for name, d in diffs.items()}


# -- 2. latency tables ----------------------------------------------------------------------------------------


def table_for(cond: Condition, cfg: Config, device: str):
    model = zoo.create_model(cond.model).eval()
    settings = replace(cfg.table, cuda_timing=cond.cuda_timing, cuda_graph=cond.cuda_graph)
    return build_table(model, batch_size=cond.batch, input_size=cfg.size, device=device, dtype=cond.dtype,
                       channels_last=cond.channels_last, settings=settings, cache_dir=CACHE_DIR, runtime=cond.runtime)


def within_budget(items: Sequence[Any], label: Callable[[Any], str], run: Callable[[Any], dict[str, Any]],
                  cfg: Config, budget: Budget) -> dict[str, Any]:
    """``{label(item): run(item)}``, with the items that would start too late recorded as skipped."""
    out: dict[str, Any] = {}
    for item in items:
        too_late = budget.left() < cfg.min_step_s
        out[label(item)] = {"skipped": f"time budget ({budget.left():.0f} s left)"} if too_late else run(item)
    return out


def check_lut(device: str, cfg: Config, budget: Budget) -> dict[str, Any]:
    """Build each table (cold), calibrate on random plans, report errors beside the noise floor."""
    return within_budget(cfg.lut, lambda cond: cond.label, lambda cond: lut_one(device, cfg, cond), cfg, budget)


def lut_one(device: str, cfg: Config, cond: Condition) -> dict[str, Any]:
    table = table_for(cond, cfg, device)
    evaluation = calibrate(table, cfg.plans, settings=cfg.timing)
    capped = sum(bool(table.records[k].get("cap_hit")) for k in table.records)
    return {"entries": table.n_entries, "measured": table.n_measured, "build_s": table.build_s,
            "entries_capped": capped, "condition": table.condition, "summary": table.summary(),
            "protocol": table.condition["protocol"], **evaluation.summary(),
            "table": evaluation.format()}


def check_runtimes(device: str, cfg: Config, budget: Budget) -> dict[str, Any]:
    """Each deploy runtime's table (cold) and its raw error over random plans; a runtime missing here is skipped."""
    from zoo.latency.runtime import RuntimeFailure, check_runtime

    def one(cond: Condition) -> dict[str, Any]:
        try:
            check_runtime(cond.runtime, torch.device(device), resolve_dtype(cond.dtype, torch.device(device)))
        except RuntimeFailure as exc:
            return {"skipped": f"unavailable here: {exc}"}
        return lut_one(device, cfg, cond)

    return within_budget(cfg.runtimes, lambda cond: cond.label, one, cfg, budget)


# -- 3. pruning search ----------------------------------------------------------------------------------------


def check_prune_search(device: str, cfg: Config, budget: Budget) -> dict[str, Any]:
    return within_budget(cfg.prune, lambda cond: cond.label, lambda cond: prune_one(device, cfg, cond), cfg, budget)


def prune_one(device: str, cfg: Config, cond: Condition, targets: tuple[float, ...] = (1.5, 2.0)) -> dict[str, Any]:
    """DP plans at each target on synthetic data; measured speed-up of the merged, fused networks."""
    torch.manual_seed(0)
    table = table_for(cond, cfg, device)
    dev = next(table.model.parameters()).device
    inputs = torch.randn(cfg.calib_batch, 3, cfg.size, cfg.size, device=dev)
    batches = [(inputs, torch.zeros(cfg.calib_batch, dtype=torch.long, device=dev))]  # labels unused
    damages = score_variants(table.model, table.segments, batches, score="similarity")
    options = [[Choice(v, cost, max(0.0, damage[v])) for v, cost in costs]
               for costs, damage in zip(table.segment_costs(), damages)]
    baseline_pred = table.predict({"remove": []})
    out: dict[str, Any] = {"model": cond.model, "condition": table.condition, "baseline_predicted_ms": baseline_pred}
    nets, labels = [zoo.fuse(table.model)], ["baseline"]
    for target in targets:
        try:
            result = dp_search(options, baseline_pred / target - table.fixed_cost())
        except BudgetError as exc:
            out[f"target_{target}"] = {"error": str(exc)}
            continue
        plan = {"remove": result.removed(options), "merge": True}
        nets.append(zoo.fuse(apply_plan(table.model, plan, inplace=False)))
        labels.append(f"target_{target}")
        out[f"target_{target}"] = {"removed": len(plan["remove"]), "predicted_ms": table.predict(plan),
                                   "plan": plan}
    prepared = [prepare(net, dev, cond.channels_last) for net in nets]
    benches = time_networks(prepared, table.example, {}, table, cfg.timing)
    estimate = f"{table.settings.estimator}_ms"
    base_ms = benches[0].summary()[estimate]
    out["baseline_ms"] = base_ms
    for label, bench in zip(labels[1:], benches[1:]):
        ms = bench.summary()[estimate]
        target = float(label.split("_")[1])
        entry = out[label]
        entry.update({"measured_ms": ms, "measured_speedup": base_ms / ms,
                      "prediction_error": entry["predicted_ms"] / ms - 1.0})
    return out


# -- 4. RetNet decode -----------------------------------------------------------------------------------------


def check_retnet_decode(device: str, cfg: Config, budget: Budget) -> dict[str, Any]:
    """Per-token decode latency vs context at each batch (training scaling at the first batch only)."""
    from benchmarks import retnet_decode

    def decode_at(batch: int) -> dict[str, Any]:
        result = retnet_decode.run(quick=device != "cuda", device=device, batch=batch,
                                   train=batch == cfg.decode_batches[0], model_kwargs={"use_fla": False})
        kept = ("device", "latency_ratio_longest_to_shortest", "decode", "paired_ratios", "parallel", "train",
                "generate", "operators_per_step", "step_agreement")
        return {**{k: result[k] for k in kept}, "markdown": retnet_decode.markdown(result)}

    return {"path": "PyTorch (use_fla=False; the fla step compares the fused kernels)",
            **within_budget(cfg.decode_batches, lambda batch: f"batch_{batch}", decode_at, cfg, budget)}


# -- 5. flash-linear-attention --------------------------------------------------------------------------------


@torch.inference_mode()
def check_fla(device: str, cfg: Config, budget: Budget) -> dict[str, Any]:
    """Fused retention kernels vs the PyTorch path: outputs and latency of the chunkwise forward (model level) and
    of the recurrent kernel on one token and on 64 tokens (op level); TF32 as the likely source of differences."""
    from zoo.models.retention import fla_kernels, retention_fla, retention_recurrent

    if device != "cuda":
        return {"skipped": "flash-linear-attention needs CUDA"}
    if fla_kernels() is None:
        return {"skipped": "flash-linear-attention is not installed"}
    import fla

    torch.manual_seed(0)
    ours = zoo.create_model("retnet_small", use_fla=False).cuda().eval()
    fused = zoo.create_model("retnet_small", use_fla=True).cuda().eval()
    fused.load_state_dict(ours.state_dict())
    ids = torch.randint(0, ours.vocab_size, (4, 2048), device="cuda")
    (a, state_a), (b, state_b) = (m(ids, mode="chunkwise", return_state=True) for m in (ours, fused))
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        a_tf32 = ours(ids, mode="chunkwise")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    quick = {"warmup_s": 1.0, "max_time_s": 5.0, "rel_tol": 0.02, "memory": False}
    out: dict[str, Any] = {
        "fla_version": getattr(fla, "__version__", "?"), "batch": 4, "length": 2048,
        "chunkwise_logits_rel_diff": rel_diff(b, a), "torch_tf32_vs_fp32_logits_rel_diff": rel_diff(a_tf32, a),
        "chunkwise_state_rel_diff": rel_diff(torch.stack(state_b.layers), torch.stack(state_a.layers)),
        "chunkwise_torch_ms": measure(lambda: ours(ids, mode="chunkwise"), (), "cuda", **quick).median_ms,
        "chunkwise_fla_ms": measure(lambda: fused(ids, mode="chunkwise"), (), "cuda", **quick).median_ms}
    out["chunkwise_speedup"] = out["chunkwise_torch_ms"] / out["chunkwise_fla_ms"]
    layer = ours.blocks[0].retention
    log_gamma = layer.constant("log_gamma", torch.device("cuda"), torch.float32)
    state = torch.randn(4, layer.heads, layer.key_dim, layer.value_dim, device="cuda")
    for tokens in (1, 64):
        q, k = (torch.randn(4, layer.heads, tokens, layer.key_dim, device="cuda") for _ in range(2))
        v = torch.randn(4, layer.heads, tokens, layer.value_dim, device="cuda")
        ref, fast = retention_recurrent(q, k, v, log_gamma, state), retention_fla(q, k, v, log_gamma, state, True)
        torch_ms = measure(lambda q=q, k=k, v=v: retention_recurrent(q, k, v, log_gamma, state), (), "cuda",
                           **quick).median_ms
        fla_ms = measure(lambda q=q, k=k, v=v: retention_fla(q, k, v, log_gamma, state, True), (), "cuda",
                         **quick).median_ms
        out[f"recurrent_{tokens}_tokens"] = {"out_rel_diff": rel_diff(fast[0], ref[0]),
                                             "state_rel_diff": rel_diff(fast[1], ref[1]), "torch_ms": torch_ms,
                                             "fla_ms": fla_ms, "speedup": torch_ms / fla_ms}
    return out


# -- 6. training memory ---------------------------------------------------------------------------------------


def check_train_memory(device: str, cfg: Config, budget: Budget) -> dict[str, Any]:
    """Activation memory (and CUDA peak allocated memory) of a training step with and without gradient
    checkpointing and bf16, the largest batch in 80 GB, and checkpointing's step-time cost (benchmarks.train_memory)."""
    from benchmarks import train_memory
    from zoo.latency import resolve_device

    def one(item: tuple[str, int, tuple[int, int]]) -> dict[str, Any]:
        name, size, batches = item
        return train_memory.measure(name, size, batches, 80.0, resolve_device(device), time_it=True,
                                    quick=device != "cuda")

    return within_budget(cfg.memory, lambda item: item[0], one, cfg, budget)


# -- verdicts -------------------------------------------------------------------------------------------------
# Every pass/fail is derived here from the recorded numbers and a stated target; a step passes only when every one
# of its verdicts holds. Work that was skipped (time budget, no fla) is recorded as None: skipped is not passed.

DECODE_FLATNESS_TARGET = 1.2  # RetNet per-token latency at the longest context / at the shortest
SPEEDUP_FRACTION = 0.9  # a pruned network reaches its target speed-up at >= 0.9 x target
RUNTIME_MEAN_TARGET, RUNTIME_MAX_TARGET = 0.05, 0.10  # a deploy runtime's table error (issue: runtimes)


def verdicts(name: str, step: dict[str, Any]) -> dict[str, bool | None]:
    """Each check of a step and whether it met its target (None: not run). Works on a fresh step and on a stored
    one, whose own ``verdicts`` (written by this function before) are not results and are recomputed."""
    if "skipped" in step:
        return {name: None}
    step = {k: v for k, v in step.items() if k != "verdicts"}
    out: dict[str, bool | None] = {}
    if name == "measurement":
        for mode, o in step.get("outputs", {}).items():
            out[f"output {mode} within {o['tolerance']:g}"] = o["max_rel_diff"] <= o["tolerance"]
    elif name == "lut":
        for label, t in step.items():
            if isinstance(t, dict):
                out[f"{label} max error <= {TABLE_ERROR_TARGET:.0%}"] = (
                    None if "skipped" in t else t["max_abs_error_raw"] <= TABLE_ERROR_TARGET)
    elif name == "prune_search":
        for label, p in step.items():
            if not isinstance(p, dict):
                continue
            if "skipped" in p:
                out[label] = None
                continue
            for key, r in p.items():
                if key.startswith("target_"):
                    target = float(key.removeprefix("target_"))
                    out[f"{label} {key} >= {SPEEDUP_FRACTION} x target"] = (
                        "measured_speedup" in r and r["measured_speedup"] >= SPEEDUP_FRACTION * target)
    elif name == "retnet_decode":
        for key, r in step.items():
            if isinstance(r, dict):
                out[f"{key} RetNet latency ratio <= {DECODE_FLATNESS_TARGET}"] = (
                    None if "skipped" in r else
                    r["latency_ratio_longest_to_shortest"]["retnet"] <= DECODE_FLATNESS_TARGET)
                if key == "batch_1":  # the decode targets, stated at batch 1, recomputed (None: not measured)
                    from benchmarks.retnet_decode import verdicts as decode_verdicts

                    if "paired_ratios" in r and "step_agreement" in r:
                        out.update({f"{key} {target}": v for target, v in decode_verdicts(r).items()})
                    else:
                        out[f"{key} decode targets of benchmarks.retnet_decode (not measured)"] = None
    elif name == "fla":
        out["chunkwise forward faster than the PyTorch path"] = step["chunkwise_speedup"] > 1.0
    elif name == "runtimes":
        for label, t in step.items():
            if isinstance(t, dict):
                noise = 1.5 * t.get("noise_floor", 0.0)
                limits = (max(RUNTIME_MEAN_TARGET, noise), max(RUNTIME_MAX_TARGET, noise))
                out[f"{label} raw error mean <= {RUNTIME_MEAN_TARGET:.0%} and max <= {RUNTIME_MAX_TARGET:.0%} (or 1.5x "
                    "noise)"] = (None if "skipped" in t else t["mean_abs_error_raw"] <= limits[0]
                                 and t["max_abs_error_raw"] <= limits[1])
    elif name == "train_memory":
        from benchmarks.train_memory import TARGET_COST, TARGET_REDUCTION
        from benchmarks.train_memory import verdicts as memory_verdicts

        rows = [r for r in step.values() if isinstance(r, dict) and "model" in r]
        for model, v in memory_verdicts(rows).items():
            out[f"{model} checkpointing saves >= {TARGET_REDUCTION:.0%} at <= {TARGET_COST:.0%} cost"] = v["passed"]
        for label, r in step.items():
            if isinstance(r, dict) and "skipped" in r:
                out[label] = None
    return out


def status(step: dict[str, Any], checks: dict[str, bool | None]) -> str:
    """``error`` (raised), ``failed`` (a verdict is false), ``skipped`` (nothing ran), ``incomplete`` (some
    checks skipped) or ``passed`` (every check ran and met its target)."""
    if "error" in step:
        return "error"
    results = list(checks.values())
    if any(r is False for r in results):
        return "failed"
    if not results:
        return "incomplete"  # the step ran but checked nothing: not a pass
    if all(r is None for r in results):
        return "skipped"
    return "incomplete" if any(r is None for r in results) else "passed"


def judge(report: dict[str, Any]) -> dict[str, Any]:
    """Add ``verdicts`` and ``status`` to every step of a report (a fresh one or a recorded JSON) and return it."""
    for name, step in report["steps"].items():
        if "error" not in step:
            step["verdicts"] = verdicts(name, step)
        step["status"] = status(step, step.get("verdicts", {}))
        step.pop("ok", None)
    return report


def exit_code(report: dict[str, Any]) -> int:
    """0: every step passed; 1: a step failed or raised; 3: nothing failed but some work was skipped."""
    statuses = {step["status"] for step in report["steps"].values()}
    if statuses & {"failed", "error"}:
        return 1
    return 0 if statuses == {"passed"} else 3


# -- the run --------------------------------------------------------------------------------------------------


def environment(device: str) -> dict[str, Any]:
    """Versions and the settings that change GPU timings."""
    import numpy
    import timm

    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__, "timm": timm.__version__,
                           "numpy": numpy.__version__, "cuda": torch.version.cuda}
    try:
        import fla

        env["fla"] = getattr(fla, "__version__", "?")
    except ImportError:
        env["fla"] = None
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update(device=props.name, capability=f"{props.major}.{props.minor}", sms=props.multi_processor_count,
                   memory_gib=round(props.total_memory / 2**30, 1), cudnn=torch.backends.cudnn.version(),
                   cudnn_benchmark=torch.backends.cudnn.benchmark, tf32_cudnn=torch.backends.cudnn.allow_tf32,
                   tf32_matmul=torch.backends.cuda.matmul.allow_tf32)
    else:
        env["device"] = "cpu (dry run)"
    return env


def digest(report: dict[str, Any]) -> str:
    """The headline numbers of a report, one line each."""
    lines = [f"device {report['environment'].get('device')}, torch {report['environment']['torch']}"]
    steps = report["steps"]
    for name, step in steps.items():
        state = step["status"] + (f": {step['error']}" if "error" in step else "")
        failed = [check for check, ok in step.get("verdicts", {}).items() if ok is False]
        lines.append(f"{name}: {state} ({step.get('seconds')} s)" + (f"; not met: {'; '.join(failed)}" if failed
                                                                      else ""))
    meas = steps.get("measurement", {})
    for mode in measure_modes("cuda"):
        if mode in meas:
            m = meas[mode]
            lines.append(f"  {mode}: {m['median_ms']:.3f} ms (IQR {m['iqr_ms']:.3f}, n={m['n_runs']}), "
                         f"wall/events {m['wall_vs_events']['ratio']:.3f}")
    for name, o in meas.get("outputs", {}).items():
        within = o["max_rel_diff"] <= o["tolerance"]
        lines.append(f"  output {name}: rel diff {o['max_rel_diff']:.2e} ({'within' if within else 'OUT OF'} "
                     f"tolerance {o['tolerance']:g})")
    for step_name in ("lut", "runtimes"):
        for label, t in steps.get(step_name, {}).items():
            if isinstance(t, dict) and "mean_abs_error_raw" in t:
                lines.append(f"  {step_name} {label}: {t['entries']} entries in {t['build_s']:.0f} s, error mean "
                             f"{t['mean_abs_error_raw']:.1%} max {t['max_abs_error_raw']:.1%} "
                             f"(noise {t['noise_floor']:.1%})")
            elif isinstance(t, dict) and "skipped" in t:
                lines.append(f"  {step_name} {label}: skipped, {t['skipped']}")
    for label, p in steps.get("prune_search", {}).items():
        if not isinstance(p, dict) or "baseline_ms" not in p:
            continue
        for target in ("1.5", "2.0"):
            r = p.get(f"target_{target}", {})
            text = (f"measured {r['measured_speedup']:.2f}x ({r['removed']} removed, {p['baseline_ms']:.2f} -> "
                    f"{r['measured_ms']:.2f} ms, prediction error {r['prediction_error']:+.1%})"
                    if "measured_speedup" in r else r.get("error", "not run"))
            lines.append(f"  prune {label} target {target}: {text}")
    for key, r in steps.get("retnet_decode", {}).items():
        if isinstance(r, dict) and "latency_ratio_longest_to_shortest" in r:
            ratio = r["latency_ratio_longest_to_shortest"]
            lines.append(f"  retnet decode {key}: latency ratio longest/shortest context, RetNet "
                         f"{ratio['retnet']:.2f}, Transformer {ratio['transformer']:.2f}")
    fla_step = steps.get("fla", {})
    if "chunkwise_speedup" in fla_step:
        lines.append(f"  fla chunkwise: {fla_step['chunkwise_speedup']:.2f}x, logits rel diff "
                     f"{fla_step['chunkwise_logits_rel_diff']:.1e} (torch TF32 vs fp32: "
                     f"{fla_step['torch_tf32_vs_fp32_logits_rel_diff']:.1e})")
        for tokens in (1, 64):
            r = fla_step.get(f"recurrent_{tokens}_tokens", {})
            if r:
                lines.append(f"  fla recurrent {tokens} token(s): {r['speedup']:.2f}x, out rel diff "
                             f"{r['out_rel_diff']:.1e}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--steps", nargs="+", default=list(STEPS), choices=STEPS)
    parser.add_argument("--budget-s", type=float, default=360.0, help="stop starting new work after this long")
    parser.add_argument("--out", default=None)
    parser.add_argument("--verdicts", metavar="REPORT", help="recompute the verdicts of a recorded gpu_check.json")
    args = parser.parse_args(argv)
    if args.verdicts:
        return main_verdicts(args.verdicts)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device; run with --device cpu for the dry run", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    cfg = GPU if args.device == "cuda" else DRY
    budget = Budget(args.budget_s)
    out_dir = results_dir(args.out)
    report: dict[str, Any] = {"environment": environment(args.device), "budget_s": args.budget_s, "steps": {}}
    steps = {"measurement": check_measurement, "lut": check_lut, "prune_search": check_prune_search,
             "retnet_decode": check_retnet_decode, "fla": check_fla, "train_memory": check_train_memory,
             "runtimes": check_runtimes}
    for name in args.steps:
        start = time.perf_counter()
        if budget.left() < cfg.min_step_s:
            report["steps"][name] = {"skipped": f"time budget ({budget.left():.0f} s left)"}
        else:
            try:
                report["steps"][name] = steps[name](args.device, cfg, budget)
            except Exception as exc:  # noqa: BLE001 - a failing step is recorded and the others still run
                report["steps"][name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
                print(report["steps"][name]["traceback"], file=sys.stderr, flush=True)
        report["steps"][name]["seconds"] = round(time.perf_counter() - start, 1)
        judge({"steps": {name: report["steps"][name]}})
        print(f"[gpu_check] {name}: {report['steps'][name]['status']} ({report['steps'][name]['seconds']} s)",
              flush=True)
        (out_dir / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))
    print(digest(report), flush=True)
    return exit_code(report)


def main_verdicts(path: str) -> int:
    """``--verdicts REPORT.json``: recompute the verdicts of a recorded report and print its digest."""
    report = judge(json.loads(Path(path).read_text()))
    print(digest(report))
    return exit_code(report)


if __name__ == "__main__":
    raise SystemExit(main())
