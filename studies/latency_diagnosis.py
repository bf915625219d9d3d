"""Where a latency table's error comes from: every segment timed isolated (the table) and in context, side by side.

One cold table build (fresh cache, the table protocol under test), then the original network and `--plans` random
pruned networks are timed end to end in interleaved rounds with hooks at every segment's boundaries
(:class:`zoo.latency.timing.ContextBench`). For every network the prediction error splits exactly into

* **segments**: the table's entry costs minus the same segments' times inside the network;
* **rest**: the table's fixed part minus the network's time outside the segments (stem, head, glue);
and, beside them, the **estimator** effect: the sum of the parts' own estimates (each part's 10th percentile, as an
isolated table takes them) minus the estimate of the total (a 10th percentile of a sum is not the sum of the 10th
percentiles). In-context parts are means over the runs whose totals sit at the estimator's statistic, so segments
and rest add up to the measured total exactly.

Per entry it lists the largest table - in-context gaps with the kind of module (intact, activations merged,
dense merged kernels), also anchored (the table scaled by the original's measured / predicted time, as the
benchmark's anchored error is), and per network the three segments with the largest anchored gaps. Afterwards the
isolated entries are timed once more (``--rebuild``) to show how much of the gap is drift between the build and the
networks' measurement rather than isolation.

    python -m studies.latency_diagnosis --model mobilenetv2_100 --batch-size 1 --plans 6 [--entries isolated]
    python -m studies.latency_diagnosis --model mobilenetv2_100 --drift 120   # the machine's own speed over time
    python -m studies.latency_diagnosis --model retnet_small --drift 120 --drift-window 5 --alternate-cpus
    python -m studies.latency_diagnosis --model mobilenetv2_100 --hooks 100   # the build's level vs a session's
    python -m studies.latency_diagnosis --model tresnet_m --sessions 2 --plans 12   # one table, K sessions
    python -m studies.latency_diagnosis --model mobilenetv2_100 --neighbours 6   # the previous network's effect
    python -m studies.latency_diagnosis --model mobilenetv2_100 --part-drift 36 [--memory-hog]  # drift per part
    python -m studies.latency_diagnosis --page-faults 2048,512 2048,2048 1024,512   # a conv with glibc's
                                                            # thresholds and with freed memory kept, side by side
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import select
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common import (
    SESSION_TIMING,
    CommandLine,
    count,
    exact_rounds,
    model_name,
    non_negative,
    positive,
    whole,
)
from zoo.errors import run_command
from zoo.files import write_json
from zoo.latency import NetworkTimingSettings, TableSettings, build_table, prediction_error, random_plans
from zoo.latency.accuracy import pruned_network
from zoo.latency.device import keep_freed_memory, timing_context
from zoo.latency.measure import ROUND_ORDERS, Bench, time_rounds
from zoo.latency.table import variant_label
from zoo.latency.timing import ContextBench, estimator_runs, hook_overhead_ms

RESULTS = Path(__file__).parent / "results"


def estimate(values: list[float], estimator: str) -> float:
    a = np.asarray(values)
    return float({"median": np.median, "p10": lambda v: np.percentile(v, 10), "min": np.min}[estimator](a))


def time_in_context(table: Any, plans: list[dict[str, Any]], calib: NetworkTimingSettings) -> list[ContextBench]:
    """The networks of `plans` timed in interleaved rounds with a hook pair on every segment."""
    device = next(iter(table.model.parameters())).device
    names = [seg.name for seg in table.segments]
    benches = []
    for plan in plans:
        net = pruned_network(table, plan)
        kept = [n for n, v in zip(names, table.variants_of(plan)) if n not in v]
        benches.append(ContextBench(net, kept, (table.example,), table.forward_kwargs, device, table.settings.clock))
    with timing_context(device, torch.float32, table.settings.threads):
        benches[0].warmup(calib.warmup_s)
        for bench in benches:
            bench.warmup(calib.net_warmup_s)
        time_rounds(benches, (calib.min_rounds, calib.max_rounds), 1, calib.rel_tol, calib.max_time_s,
                    warm_calls=calib.warm_calls)
    return benches


def kind_of(table: Any, index: int, variant: frozenset[str]) -> str:
    if not variant:
        return "intact"
    module = table.model.get_submodule(table.segments[index].name)
    groups = {getattr(m, "groups", 1) for m in module.modules() if isinstance(m, torch.nn.Conv2d)}
    return "merged" + (" (dense)" if groups == {1} else "")


def diagnose(model: str, batch_size: int, input_size: int | None, plans: int, seed: int, settings: TableSettings,
             calib: NetworkTimingSettings, rebuild: bool) -> dict[str, Any]:
    est = settings.estimator
    with tempfile.TemporaryDirectory() as cache_dir:
        kwargs = dict(batch_size=batch_size, input_size=input_size, device="cpu", cache_dir=cache_dir,
                      settings=settings)
        table = build_table(model, **kwargs)
        chosen = [{"remove": [], "merge": True}, *random_plans(table.segments, plans, seed=seed)]
        benches = time_in_context(table, chosen, calib)
        again = build_table(model, **{**kwargs, "cache_dir": tempfile.mkdtemp(dir=cache_dir)}) if rebuild else None
    hooks_ms = hook_overhead_ms(torch.device("cpu"), settings.clock)
    networks, entries = [], {}
    by_median = replace(table, settings=replace(table.settings, estimator="median"))
    for plan, bench in zip(chosen, benches):
        variants = table.variants_of(plan)
        runs = estimator_runs(bench.times_ms, est)  # the runs whose totals sit at the estimator's statistic

        def window(values: list[float], runs: np.ndarray = runs) -> float:
            return float(np.asarray(values)[runs].mean())

        seg_iso = seg_ctx = per_part = 0.0
        parts = []
        for i, (seg, variant) in enumerate(zip(table.segments, variants)):
            if seg.name in variant:
                continue
            iso, ctx = table.raw_cost(i, variant), window(bench.segment_ms[seg.name])
            per_part += estimate(bench.segment_ms[seg.name], est)
            seg_iso, seg_ctx = seg_iso + iso, seg_ctx + ctx
            parts.append((f"{seg.name} {variant_label(seg, variant)}", iso, ctx))
            row = entries.setdefault((seg.name, variant), {"segment": seg.name, "variant": variant_label(seg, variant),
                                                          "kind": kind_of(table, i, variant), "isolated_ms": iso,
                                                          "again_ms": again.raw_cost(i, variant) if again else None,
                                                          "context_ms": []})
            row["context_ms"].append(ctx)
        rest = window(bench.rest_ms) - hooks_ms * len(bench.names)
        total = window(bench.times_ms) - hooks_ms * len(bench.names)
        per_part += estimate(bench.rest_ms, est) - hooks_ms * len(bench.names)
        predicted = table.predict(plan, corrected=False)
        networks.append({
            "removed": len(plan["remove"]), "measured_ms": total, "predicted_ms": predicted,
            "error": predicted / total - 1, "segments_gap_ms": seg_iso - seg_ctx,
            "rest_gap_ms": table.fixed_raw_ms - rest,
            "estimator_gap_ms": per_part - total,
            "median_error": by_median.predict(plan, corrected=False) / (estimate(bench.times_ms, "median")
                                                                       - hooks_ms * len(bench.names)) - 1,
            "parts": parts,
        })
    anchor = networks[0]["measured_ms"] / networks[0]["predicted_ms"]
    for n in networks:
        n["anchored_error"] = n["predicted_ms"] * anchor / n["measured_ms"] - 1
        gaps = sorted(((name, iso * anchor - ctx) for name, iso, ctx in n.pop("parts")), key=lambda g: -abs(g[1]))
        n["segments_gap_anchored_ms"] = sum(gap for _, gap in gaps)
        n["rest_gap_anchored_ms"] = n["rest_gap_ms"] + table.fixed_raw_ms * (anchor - 1)
        n["largest_gaps_anchored_ms"] = gaps[:3]  # the segments that carry most of this network's anchored error
    for row in entries.values():
        row["context_ms"] = statistics.median(row["context_ms"])
        row["gap"] = row["isolated_ms"] / row["context_ms"] - 1 if row["context_ms"] > 0 else float("nan")
        row["gap_anchored_ms"] = row["isolated_ms"] * anchor - row["context_ms"]
    rows = sorted(entries.values(), key=lambda r: -abs(r["gap_anchored_ms"]))
    by_kind: dict[str, list[float]] = {}
    for row in rows:
        by_kind.setdefault(row["kind"], []).append(row["gap"])
    noise = abs(networks[0]["measured_ms"] - estimate(benches[0].times_ms[::2], est)) / networks[0]["measured_ms"]
    return {"model": model, "batch_size": batch_size, "input_size": table.condition["input_size"],
            "clock": settings.clock, "estimator": est, "anchor": anchor, "fixed_ms": table.fixed_raw_ms,
            "overhead_ms": table.overhead_ms, "hook_pair_ms": hooks_ms, "networks": networks,
            "gap_by_kind": {k: {"n": len(v), "median": statistics.median(v), "max_abs": max(map(abs, v))}
                            for k, v in by_kind.items()},
            "entries": rows, "half_sample_noise": noise, "table_s": table.build_s}


@contextlib.contextmanager
def affinity_restored() -> Any:
    """Whatever CPUs the body pins this process to, afterwards it may run where it could before."""
    allowed_cpus = os.sched_getaffinity(0)
    try:
        yield
    finally:
        os.sched_setaffinity(0, allowed_cpus)


def drift_trace(model: str, seconds: float, batch_size: int = 1, window_s: float = 10.0, clock: str = "wall",
                alternate_cpus: bool = False) -> list[dict[str, float]]:
    """The same network (deploy form, one thread) run back to back for `seconds`: per `window_s` window, the
    number of runs and their min, 10th percentile and median (ms): how far the machine's own speed moves. With
    `alternate_cpus` window k runs pinned to CPU k mod 2 (`cpu` in each row): whether the two CPUs differ."""
    from zoo.deploy.fuse import fuse
    from zoo.weights.create import create_model

    net = fuse(create_model(model)).eval()
    x = net.example_input(batch_size, tuple(net.default_cfg["input_size"]))
    read = time.thread_time if clock == "thread" else time.perf_counter
    rows = []
    with affinity_restored(), timing_context(torch.device("cpu"), torch.float32, 1):
        for k, w in enumerate(np.arange(0.0, seconds, window_s)):
            if alternate_cpus:
                os.sched_setaffinity(0, {k % 2})
                net(x)  # the first call on the new CPU
            ms = []
            end = time.perf_counter() + window_s
            while time.perf_counter() < end:
                t0 = read()
                net(x)
                ms.append((read() - t0) * 1e3)
            rows.append({"from_s": float(w), "runs": len(ms), "min_ms": float(np.min(ms)),
                         "p10_ms": estimate(ms, "p10"), "median_ms": estimate(ms, "median"),
                         **({"cpu": k % 2} if alternate_cpus else {})})
    return rows


def cold_table(model: str, batch_size: int, input_size: int | None, settings: TableSettings) -> Any:
    """A table built on the CPU into a fresh cache (every entry measured now)."""
    with tempfile.TemporaryDirectory() as cache_dir:
        return build_table(model, batch_size=batch_size, input_size=input_size, device="cpu", cache_dir=cache_dir,
                           settings=settings)


def hook_check(model: str, rounds: int, batch_size: int = 1, input_size: int | None = None,
               settings: TableSettings | None = None) -> dict[str, Any]:
    """A cold table, then its intact network timed plain and with the segment hooks (a copy), interleaved for
    `rounds` rounds: what the hooks cost, and how far the table's prediction of the original sits above the same
    hooked network timed outside the build (the build's own level: probe networks between its runs)."""
    settings = settings or TableSettings()
    table = cold_table(model, batch_size, input_size, settings)
    plain = pruned_network(table, {"remove": [], "merge": table.merge})
    hooked = pruned_network(table, {"remove": [], "merge": table.merge})
    device, names = torch.device("cpu"), [seg.name for seg in table.segments]
    with timing_context(device, torch.float32, settings.threads):
        benches = [Bench(plain, (table.example,), table.forward_kwargs, device, False, settings.clock),
                   ContextBench(hooked, names, (table.example,), table.forward_kwargs, device, settings.clock)]
        try:
            benches[0].warmup(settings.warmup_s)
            benches[1].warmup(settings.entry_warmup_s)
            time_rounds(benches, (rounds, rounds), 1, 0.0, float("inf"), together=True, warm_calls=settings.warm_calls)
        finally:
            benches[1].close()
    est = settings.estimator
    plain_ms, hooked_ms = (estimate(b.times_ms, est) for b in benches)
    table_ms = table.predict({"remove": [], "merge": table.merge}, corrected=False)
    subtracted_ms = hook_overhead_ms(device, settings.clock) * len(names)
    return {"model": model, "batch_size": batch_size, "estimator": est, "rounds": rounds, "segments": len(names),
            "table_ms": table_ms, "plain_ms": plain_ms, "hooked_ms": hooked_ms, "hooks_cost": hooked_ms / plain_ms - 1,
            "hooks_subtracted_ms": subtracted_ms, "table_over_plain": table_ms / plain_ms - 1,
            "table_over_hooked": (table_ms + subtracted_ms) / hooked_ms - 1, "table_s": table.build_s}


def session_check(model: str, sessions: int, plans: int, seed: int, batch_size: int = 1,
                  input_size: int | None = None, settings: TableSettings | None = None,
                  calib: NetworkTimingSettings | None = None) -> list[dict[str, Any]]:
    """One cold table, then the same `plans` random plans (``random_plans(seed)``; the benchmark's held-out plans
    are seed 2) measured in `sessions` evaluation sessions one after the other: per session and plan the measured ms
    and the anchored error. A plan whose own time moves between sessions bounds what any table can predict."""
    table = cold_table(model, batch_size, input_size, settings or TableSettings())
    chosen = random_plans(table.segments, plans, seed=seed)
    rows = []
    for session in range(sessions):
        evaluation = prediction_error(table, chosen, calib or SESSION_TIMING)
        rows += [{"session": session, "network": r.label, "removed": r.plan.get("remove", []),
                  "measured_ms": r.measured_ms, "anchored_error": r.anchored_error()} for r in evaluation.results]
    return rows


def neighbour_check(model: str, copies: int, rounds: int, sessions: int, batch_size: int = 1,
                    input_size: int | None = None, settings: TableSettings | None = None) -> list[dict[str, Any]]:
    """Does a network's time depend on the network that ran just before it? The original timed as `copies` copies
    per round, alone (back to back) and between `copies` random plans (seed 2): in a fixed order without and with one
    warm call per network and round, and in a new order every round (``round_order=shuffled``): per session, each
    copy's p10 over their mean (a pattern by position that repeats from session to session is the predecessor's
    effect) and the plans' p10s."""
    settings = settings or TableSettings()
    table = cold_table(model, batch_size, input_size, settings)
    original = pruned_network(table, {"remove": [], "merge": table.merge})
    plans = [pruned_network(table, plan) for plan in random_plans(table.segments, copies, seed=2)]
    device, rows = torch.device("cpu"), []
    with timing_context(device, torch.float32, settings.threads):
        for session in range(sessions):
            for mode, warm_calls, order in (("alone", 0, "fixed"), ("between plans", 0, "fixed"),
                                            ("between plans", 1, "fixed"), ("between plans", 0, "shuffled")):
                nets = [original] * copies if mode == "alone" else [n for pair in zip([original] * copies, plans)
                                                                     for n in pair]
                benches = [Bench(net, (table.example,), table.forward_kwargs, device, False, settings.clock)
                           for net in nets]
                benches[0].warmup(settings.warmup_s)
                time_rounds(benches, (rounds, rounds), 1, 0.0, float("inf"), together=True, warm_calls=warm_calls,
                            order=order)
                p10 = [estimate(b.times_ms, "p10") for b in benches]
                ours = np.asarray(p10 if mode == "alone" else p10[0::2])
                rows.append({"session": session, "mode": mode, "warm_calls": warm_calls, "round_order": order,
                             "copies_relative": (ours / ours.mean()).tolist(), "copies_sd": float(ours.std() /
                                                                                               ours.mean()),
                             "original_ms": float(ours.mean()), "plans_ms": [] if mode == "alone" else p10[1::2]})
    return rows


PART_KERNELS = {  # (in, out, size) of a 3x3 conv at batch 1
    "3x3 960->160 at 7x7 (merged blocks.5.1/5.2 bn2.act)": (960, 160, 7),  # 5.5 MB of weights
    "3x3 960->320 at 7x7 (merged blocks.6.0 bn2.act)": (960, 320, 7),  # 11 MB
    "3x3 32->32 at 112x112 (compute-bound stand-in)": (32, 32, 112),  # 37 KB
}
HOG = """import os, sys, time, numpy as np
parent, deadline = int(sys.argv[1]), time.monotonic() + float(sys.argv[2])
os.sched_setaffinity(0, {1})
a = np.ones(2**25); b = np.empty_like(a)  # 2 x 256 MiB, more than the L3
print("streaming", flush=True)
while os.getppid() == parent and time.monotonic() < deadline:
    np.copyto(b, a); np.copyto(a, b)
"""


PART_WINDOW_S, PART_SWEEP_MB = 4.0, 64


def part_drift_trace(model: str, windows: int, window_s: float = PART_WINDOW_S, memory_hog: bool = False,
                     sweep_mb: int = PART_SWEEP_MB, min_runs: int = 20) -> list[dict[str, Any]]:
    """Does the machine's drift move every part of a network alike? Per ``window_s`` window (at least ``min_runs``
    runs), interleaved call by call on one thread: the whole network (deploy form) and the convs of
    :data:`PART_KERNELS`, each after a read of ``sweep_mb`` MiB (more than the core's L2 holds), so that it does not
    start with its weights in the core's cache. Per window and part the 10th percentile (ms) and that of the even
    and of the odd calls (their gap measures the window's sampling noise). With ``memory_hog`` this process runs on
    CPU 0 and the odd windows run a process copying memory on CPU 1 (``hog_ran``: it streamed the whole window)."""
    from zoo.deploy.fuse import fuse
    from zoo.weights.create import create_model

    net = fuse(create_model(model)).eval()
    parts: dict[str, tuple[torch.nn.Module, torch.Tensor]] = {
        "network": (net, net.example_input(1, tuple(net.default_cfg["input_size"])))}
    for name, (c_in, c_out, size) in PART_KERNELS.items():
        parts[name] = (torch.nn.Conv2d(c_in, c_out, 3, padding=1).eval(), torch.randn(1, c_in, size, size))
    sweep = torch.ones(sweep_mb * 2**18)

    def run_window(seconds: float) -> dict[str, list[float]]:
        times: dict[str, list[float]] = {name: [] for name in parts}
        end = time.perf_counter() + seconds
        while time.perf_counter() < end or len(times["network"]) < min_runs:
            for name, (module, x) in parts.items():
                if name != "network":
                    sweep.sum()
                start = time.perf_counter()
                module(x)
                times[name].append((time.perf_counter() - start) * 1e3)
        return times

    rows = []
    with affinity_restored():
        if memory_hog:
            os.sched_setaffinity(0, {0})
        with timing_context(torch.device("cpu"), torch.float32, 1):
            run_window(1.0)  # warm-up
            for window in range(windows):
                with contextlib.ExitStack() as hog_stack:
                    hog = None
                    if memory_hog and window % 2:
                        hog = hog_stack.enter_context(start_hog(window_s * 3 + 10))
                    times = run_window(window_s)
                    hog_ran = hog is not None and hog.poll() is None
                rows.append({"window": window, "memory_hog": hog is not None, "hog_ran": hog_ran,
                             "runs": len(times["network"]),
                             **{name: {"p10_ms": estimate(t, "p10"), "halves_p10_ms": [estimate(t[0::2], "p10"),
                                                                                       estimate(t[1::2], "p10")]}
                                for name, t in times.items()}})
    return rows


@contextlib.contextmanager
def start_hog(lifetime_s: float, ready_timeout_s: float = 30.0) -> Any:
    """A process copying memory on CPU 1, once it says it streams; killed on exit (it also stops by itself after
    ``lifetime_s`` or when this process is gone)."""
    with subprocess.Popen([sys.executable, "-c", HOG, str(os.getpid()), str(lifetime_s)],
                          stdout=subprocess.PIPE, text=True) as hog:
        try:
            ready, _, _ = select.select([hog.stdout], [], [], ready_timeout_s)
            line = hog.stdout.readline().strip() if ready else ""
            if line != "streaming":
                raise RuntimeError(f"the memory hog did not start (exit status {hog.poll()}, said {line!r})")
            yield hog
        finally:
            hog.kill()


def part_drift_summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per part, over the windows without a hog: its 10th percentile's spread (sd / median), and the spread of its
    time relative to the whole network's in the same window, which is what one scale for the machine's speed (an
    anchor, a speed per round) leaves in that part. Beside each, the sampling noise of one window's estimate (from
    the gap between its halves: median |gap| / 1.349, the gap having twice the sd of the whole window's estimate).
    With hog windows: the median time with the hog over the median without, raw and relative to the network."""
    hogged = np.array([r["memory_hog"] for r in rows])
    network = np.array([r["network"]["p10_ms"] for r in rows])
    network_halves = np.array([r["network"]["halves_p10_ms"] for r in rows])
    parts = [name for name in rows[0] if isinstance(rows[0][name], dict)]
    summary = {}
    for name in parts:
        p10 = np.array([r[name]["p10_ms"] for r in rows])
        halves = np.array([r[name]["halves_p10_ms"] for r in rows])
        ratio, ratio_halves = p10 / network, halves / network_halves
        quiet = ~hogged
        summary[name] = {
            "median_ms": float(np.median(p10[quiet])),
            "sd": float(np.std(p10[quiet], ddof=1) / np.median(p10[quiet])),
            "noise": float(np.median(np.abs(halves[quiet, 0] - halves[quiet, 1]) / p10[quiet]) / 1.349),
            "sd_relative_to_network": float(np.std(ratio[quiet], ddof=1) / np.median(ratio[quiet])),
            "noise_relative_to_network": float(np.median(np.abs(ratio_halves[quiet, 0] - ratio_halves[quiet, 1])
                                                         / ratio[quiet]) / 1.349)}
        if hogged.any():
            summary[name]["with_hog_over_without"] = float(np.median(p10[hogged]) / np.median(p10[quiet]))
            summary[name]["with_hog_over_without_relative_to_network"] = float(
                np.median(ratio[hogged]) / np.median(ratio[quiet]))
    return summary


def page_fault_check(channels: list[tuple[int, int]], rounds: int = 20, size: int = 7) -> list[dict[str, Any]]:
    """Per (in, out) channel pair, a 3x3 conv at batch 1 and ``size`` x ``size`` (TResNet-M's `layer4` at 224 px)
    timed with glibc's settled thresholds (a default process that has freed a 32 MiB buffer: mmap above 32 MiB) and
    inside :func:`keep_freed_memory`, alternating call by call in one process: per allocator the 10th percentile and
    median (ms, wall clock, one thread) and the page faults per call."""
    rows = []
    for c_in, c_out in channels:
        conv = torch.nn.Conv2d(c_in, c_out, 3, padding=1).eval()
        x = torch.randn(1, c_in, size, size)
        times: dict[str, list[float]] = {"glibc": [], "keep-freed": []}
        faults: dict[str, list[int]] = {"glibc": [], "keep-freed": []}
        with torch.inference_mode():
            torch.set_num_threads(1)
            conv(x)
            for _ in range(rounds):
                for mode in times:
                    with keep_freed_memory() if mode == "keep-freed" else contextlib.nullcontext():
                        conv(x)  # the first call in the mode may fault memory the heap never had
                        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                        start = time.perf_counter()
                        conv(x)
                        times[mode].append((time.perf_counter() - start) * 1e3)
                        faults[mode].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        weight_mib = c_in * c_out * 9 * 4 / 2**20
        rows += [{"in": c_in, "out": c_out, "weight_mib": weight_mib, "allocator": mode,
                  "p10_ms": estimate(times[mode], "p10"), "median_ms": estimate(times[mode], "median"),
                  "faults_per_call": statistics.median(faults[mode])} for mode in times]
    return rows


def report(result: dict[str, Any], top: int = 12) -> str:
    lines = [f"## {result['model']}, batch {result['batch_size']}, {result['clock']} clock, {result['estimator']}",
             f"fixed part {result['fixed_ms']:.3f} ms, call overhead {result['overhead_ms'] * 1e3:.1f} us, hook pair "
             f"{result['hook_pair_ms'] * 1e3:.2f} us, table built in {result['table_s']:.0f} s", "",
             "| network | removed | measured ms | error | anchored error | segments gap ms | rest gap ms "
             "| estimator effect ms | error, all medians | largest anchored gaps ms |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for i, n in enumerate(result["networks"]):
        largest = ", ".join(f"{name} {gap:+.3f}" for name, gap in n["largest_gaps_anchored_ms"])
        lines.append(f"| {'original' if i == 0 else f'plan {i}'} | {n['removed']} | {n['measured_ms']:.3f} | "
                     f"{n['error']:+.1%} | {n['anchored_error']:+.1%} | {n['segments_gap_ms']:+.3f} | "
                     f"{n['rest_gap_ms']:+.3f} | "
                     f"{n['estimator_gap_ms']:+.3f} | {n['median_error']:+.1%} | {largest} |")
    lines += ["", "| kind | entries | median isolated/context - 1 | max abs |", "|---|---|---|---|"]
    lines += [f"| {k} | {v['n']} | {v['median']:+.1%} | {v['max_abs']:.1%} |" for k, v in result["gap_by_kind"].items()]
    lines += ["", "| segment | variant | kind | table ms | rebuilt ms | in context ms | gap | anchored gap ms |",
              "|---|---|---|---|---|---|---|---|"]
    for r in result["entries"][:top]:
        again = f"{r['again_ms']:.3f}" if r["again_ms"] is not None else "-"
        lines.append(f"| {r['segment']} | {r['variant']} | {r['kind']} | {r['isolated_ms']:.3f} | {again} | "
                     f"{r['context_ms']:.3f} | {r['gap']:+.1%} | {r['gap_anchored_ms']:+.3f} |")
    return "\n".join(lines)


def command_line() -> CommandLine:
    parser = CommandLine("studies.latency_diagnosis", __doc__, check=argument_problem)
    parser.add_argument("--model", type=model_name, default="mobilenetv2_100")
    parser.add_argument("--batch-size", type=count, default=1)
    parser.add_argument("--input-size", type=count, default=None)
    parser.add_argument("--plans", type=count, default=6)
    parser.add_argument("--seed", type=whole, default=2)
    parser.add_argument("--clock", choices=("wall", "thread"), default="wall")
    parser.add_argument("--estimator", choices=("median", "p10", "min"), default="p10")
    parser.add_argument("--entries", choices=("auto", "context", "isolated"), default=None,
                        help="TableSettings.entries")
    parser.add_argument("--probe-spacing", type=count, default=None, help="TableSettings.probe_spacing")
    parser.add_argument("--warm-calls", type=whole, default=0,
                        help="TableSettings.warm_calls, also for the networks timed after the build")
    parser.add_argument("--round-order", choices=ROUND_ORDERS, default="fixed",
                        help="TableSettings.round_order, also for the networks timed after the build")
    parser.add_argument("--session-rounds", type=whole, default=0, metavar="ROUNDS",
                        help="every measured network exactly this many rounds (per session with --sessions; default: "
                             "20-60 rounds, each network until its median converged)")
    parser.add_argument("--rebuild", action="store_true", help="time the isolated entries once more afterwards")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--drift", type=non_negative, default=0.0, metavar="SECONDS",
                        help="instead: run the network back to back this long and print its speed per 10-s window")
    parser.add_argument("--drift-window", type=positive, default=10.0, metavar="SECONDS",
                        help="with --drift: the window's length")
    parser.add_argument("--alternate-cpus", action="store_true",
                        help="with --drift: window k pinned to CPU k mod 2, and the p10 per CPU")
    parser.add_argument("--hooks", type=whole, default=0, metavar="ROUNDS",
                        help="instead: a cold table, then its intact network plain and hooked for this many rounds")
    parser.add_argument("--neighbours", type=whole, default=0, metavar="COPIES",
                        help="instead: the original as COPIES copies per round, alone and between plans, 3 sessions")
    parser.add_argument("--page-faults", nargs="+", type=channel_pair, default=None, metavar="IN,OUT",
                        help="instead: 3x3 convs of these channels, glibc's thresholds and freed memory kept")
    parser.add_argument("--part-drift", type=whole, default=0, metavar="WINDOWS",
                        help="instead: the network and three convs, call by call, per 4-s window: does drift move "
                             "every part alike")
    parser.add_argument("--memory-hog", action="store_true",
                        help="with --part-drift: stream memory on CPU 1 in every other window")
    parser.add_argument("--sessions", type=whole, default=0,
                        help="instead: one cold table, then the same --plans (--seed) in this many sessions")
    return parser


def channel_pair(text: str) -> tuple[int, int]:
    """``IN,OUT``: two channel counts, 1 or more."""
    parts = text.split(",")
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"{text!r} is not IN,OUT; give two channel counts, e.g. 64,64")
    return count(parts[0]), count(parts[1])


def argument_problem(args: argparse.Namespace) -> str | None:
    """What the arguments ask for together that this study cannot do (None: nothing)."""
    if args.part_drift == 1 or args.memory_hog and args.part_drift < 3:
        return "--part-drift takes 2 or more windows (3 or more with --memory-hog, whose hog runs in every other one)"
    if args.alternate_cpus and not args.drift:
        return "--alternate-cpus goes with --drift SECONDS"
    if (args.memory_hog or args.alternate_cpus) and not {0, 1} <= os.sched_getaffinity(0):
        return (f"--memory-hog and --alternate-cpus use CPUs 0 and 1; this process may only run on CPUs "
                f"{sorted(os.sched_getaffinity(0))}")
    return None


def main(argv: list[str] | None = None) -> None:
    args = command_line().parse_args(argv)
    settings = TableSettings(clock=args.clock, estimator=args.estimator, warm_calls=args.warm_calls,
                             round_order=args.round_order)
    if args.probe_spacing is not None:
        settings = replace(settings, probe_spacing=args.probe_spacing)
    if args.entries:
        settings = replace(settings, entries=args.entries)
    if args.page_faults:
        rows = page_fault_check(args.page_faults)
        write_json(RESULTS / "latency_page_faults.json", rows)
        print("| conv in -> out | weights MiB | allocator | p10 ms | median ms | page faults per call |\n"
              "|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['in']} -> {r['out']} | {r['weight_mib']:.1f} | {r['allocator']} | {r['p10_ms']:.2f} | "
                  f"{r['median_ms']:.2f} | {r['faults_per_call']:.0f} |")
        return
    if args.part_drift > 0:
        rows = part_drift_trace(args.model, args.part_drift, memory_hog=args.memory_hog)
        summary = part_drift_summary(rows)
        suffix = "_memory_hog" if args.memory_hog else ""
        write_json(RESULTS / f"latency_part_drift_{args.model}{suffix}.json",
                   {"window_s": PART_WINDOW_S, "sweep_mb": PART_SWEEP_MB, "kernels": PART_KERNELS, "rows": rows,
                    "summary": summary})
        quiet = sum(not r["memory_hog"] for r in rows)
        hog_columns = " with hog / without | the same, relative to the network |" if args.memory_hog else ""
        print(f"| part | median p10 ms | sd over {quiet} windows | noise | sd relative to the network | noise |"
              f"{hog_columns}\n|---|---|---|---|---|---|" + ("---|---|" if args.memory_hog else ""))
        for name, r in summary.items():
            hog_cells = (f" {r['with_hog_over_without']:.3f} | {r['with_hog_over_without_relative_to_network']:.3f} |"
                         if args.memory_hog else "")
            print(f"| {name} | {r['median_ms']:.3f} | {r['sd']:.1%} | {r['noise']:.1%} | "
                  f"{r['sd_relative_to_network']:.1%} | {r['noise_relative_to_network']:.1%} |{hog_cells}")
        return
    if args.neighbours > 0:
        rows = neighbour_check(args.model, args.neighbours, 80, 3, args.batch_size, args.input_size, settings)
        write_json(RESULTS / f"latency_neighbours_{args.model}_b{args.batch_size}.json", rows)
        print("| session | timed | warm calls | order | copies' p10 / their mean, by position | sd | plans' p10 ms |\n"
              "|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['session']} | {r['mode']} | {r['warm_calls']} | {r['round_order']} | "
                  f"{' '.join(f'{v:.3f}' for v in r['copies_relative'])} | {r['copies_sd']:.2%} | "
                  f"{' '.join(f'{v:.2f}' for v in r['plans_ms'])} |")
        return
    if args.sessions > 0:
        calib = replace(SESSION_TIMING, warm_calls=args.warm_calls, round_order=args.round_order)
        if args.session_rounds:
            calib = exact_rounds(calib, args.session_rounds)
        rows = session_check(args.model, args.sessions, args.plans, args.seed, args.batch_size, args.input_size,
                             settings, calib)
        name = f"latency_sessions_{args.model}_b{args.batch_size}"
        name += f"_{args.round_order}_{args.session_rounds}rounds" if args.session_rounds else ""
        write_json(RESULTS / f"{name}.json", rows)
        print("| session | network | removed | measured ms | anchored error |\n|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['session']} | {r['network']} | {len(r['removed'])} | {r['measured_ms']:.2f} "
                  f"| {r['anchored_error']:+.1%} |")
        return
    if args.hooks > 0:
        result = hook_check(args.model, args.hooks, args.batch_size, args.input_size,
                            replace(settings, entries="context"))
        write_json(RESULTS / f"latency_hooks_{args.model}_b{args.batch_size}.json", result)
        print("\n".join(f"{k}: {v:.4f}" if isinstance(v, float) else f"{k}: {v}" for k, v in result.items()))
        return
    if args.drift > 0:
        rows = drift_trace(args.model, args.drift, args.batch_size, args.drift_window, args.clock, args.alternate_cpus)
        suffix = "_alternate_cpus" if args.alternate_cpus else ""
        write_json(RESULTS / f"latency_drift_{args.model}_b{args.batch_size}{suffix}.json",
                   {"window_s": args.drift_window, "rows": rows})
        print("| from s | runs | min ms | p10 ms | median ms |" + (" cpu |" if args.alternate_cpus else "")
              + "\n|---|---|---|---|---|" + ("---|" if args.alternate_cpus else ""))
        for r in rows:
            print(f"| {r['from_s']:.0f} | {r['runs']} | {r['min_ms']:.3f} | {r['p10_ms']:.3f} | {r['median_ms']:.3f} |"
                  + (f" {r['cpu']} |" if args.alternate_cpus else ""))
        if args.alternate_cpus:
            p10 = {cpu: statistics.median(r["p10_ms"] for r in rows if r["cpu"] == cpu) for cpu in (0, 1)
                   if any(r["cpu"] == cpu for r in rows)}
            print("median p10 per CPU: " + ", ".join(f"CPU {cpu} {ms:.3f} ms" for cpu, ms in p10.items()))
        return
    calib = replace(SESSION_TIMING, max_time_s=180.0, warm_calls=args.warm_calls)
    if args.session_rounds:
        calib = exact_rounds(calib, args.session_rounds)
    if args.quick:
        settings = replace(settings, warmup_s=0.3, min_rounds=3, max_rounds=5)
        calib = NetworkTimingSettings(warmup_s=0.2, min_rounds=3, max_rounds=5, warm_calls=args.warm_calls)
    start = time.perf_counter()
    result = diagnose(args.model, args.batch_size, args.input_size, args.plans, args.seed, settings, calib,
                      args.rebuild)
    result["total_s"] = time.perf_counter() - start
    warm = f"_warm{args.warm_calls}" if args.warm_calls else ""
    spacing = "" if args.entries == "isolated" else f"_spaced{settings.probe_spacing}"
    out = RESULTS / (f"latency_diagnosis_{args.model}_b{args.batch_size}_{args.clock}_{args.entries or 'auto'}"
                     f"{spacing}{warm}.json")
    write_json(out, result)
    print(report(result))


if __name__ == "__main__":
    raise SystemExit(run_command(main))
