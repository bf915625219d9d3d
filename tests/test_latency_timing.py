"""How latency-table entries are timed: the CUDA timing protocols (on a GPU machine; skipped elsewhere), entries timed
in context inside probe networks, the error components, drift across rounds and sessions (CPU, tiny sizes)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import zoo
from zoo.latency import (
    TableSettings,
    build_table,
    random_plans,
)

from .helpers import FAST_TABLE as FAST
from .helpers import ROOT, small_table
from .helpers import TABLE_MODEL as MODEL
from .helpers import TABLE_SIZE as SIZE


def _build(cache_dir: Path, **kwargs) -> zoo.latency.LatencyTable:
    return small_table(cache_dir, **kwargs)


# -- CUDA timing protocols (run on a GPU machine; skipped elsewhere) -------------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _tiny_kernels(x: torch.Tensor, count: int = 200) -> torch.Tensor:
    """`count` tiny kernels: launching them takes the host far longer than the device takes to run them."""
    for _ in range(count):
        x = x + 1
    return x


@needs_cuda
@pytest.mark.parametrize("cuda_graph", [False, True])
def test_cuda_queued_bench_times_the_device_not_the_host_launch(cuda_graph: bool) -> None:
    from zoo.latency.device import timing_context
    from zoo.latency.measure import Bench

    dev = torch.device("cuda")
    x = torch.zeros(16, device=dev)
    benches = {queued: Bench(_tiny_kernels, (x,), {}, dev, cuda_graph=cuda_graph, queued=queued)
               for queued in (False, True)}
    with timing_context(dev, torch.float32, threads=1):
        for _ in range(3):  # interleaved, so clock changes hit both alike
            for bench in benches.values():
                bench.warmup(0.05)
                bench.run(seconds=0.2, min_runs=5)
    isolated, queued = (benches[q].summary()["median_ms"] for q in (False, True))
    assert 0 < queued <= 1.05 * isolated  # with graphs the two differ only by one graph launch
    if not cuda_graph:  # eager: 200 launches of ~5 us on the host vs ~2 us kernels on the device
        assert queued < 0.8 * isolated, (queued, isolated)


@needs_cuda
def test_cuda_table_records_its_timing_protocol(tmp_path: Path) -> None:
    def build(timing: str) -> zoo.latency.LatencyTable:
        return build_table(MODEL, input_size=SIZE, device="cuda", cache_dir=str(tmp_path),
                           settings=replace(FAST, cuda_timing=timing))

    queued, isolated, auto = build("queued"), build("isolated"), build("auto")
    assert queued.condition["protocol"].endswith("-queued") and isolated.condition["protocol"].endswith("-isolated")
    assert queued.n_measured > 0 and isolated.n_measured > 0  # one cache file per protocol
    assert queued.overhead_ms < isolated.overhead_ms  # an empty call costs the device ~nothing when queued
    # with both protocols' caches present, auto probes the network and reuses the chosen protocol's entries
    probe = auto.timing_probe
    ratio = probe["host_ms"] <= 0.8 * probe["latency_ms"] if probe["syncs"] else probe["device_ms"] >= 0.8 * probe[
        "latency_ms"]
    assert auto.condition["protocol"].endswith("-queued" if ratio else "-isolated") and auto.n_measured == 0


@needs_cuda
def test_cuda_auto_timing_keeps_the_protocol_of_an_existing_cache(tmp_path: Path) -> None:
    settings = replace(FAST, cuda_timing="isolated")
    build_table(MODEL, input_size=SIZE, device="cuda", cache_dir=str(tmp_path), settings=settings)
    auto = build_table(MODEL, input_size=SIZE, device="cuda", cache_dir=str(tmp_path), settings=FAST)
    assert auto.timing_probe == {} and auto.condition["protocol"].endswith("-isolated") and auto.n_measured == 0


@needs_cuda
def test_cuda_probe_sees_a_call_that_synchronises() -> None:
    from zoo.latency.measure import Bench
    from zoo.latency.protocol import host_launch

    x = torch.zeros(4, device="cuda")
    assert host_launch(Bench(lambda: (x + 1).sum().item(), device=torch.device("cuda")))[1] is True
    assert host_launch(Bench(lambda: (x + 1).sum(), device=torch.device("cuda")))[1] is False


def test_auto_timing_probe_compares_device_time_with_latency() -> None:
    from zoo.latency.device import timing_context
    from zoo.latency.protocol import resolve_cuda_timing

    # on the CPU both probes are plain isolated timings of the same call, so the "device" is busy ~100 % of it
    model, cpu = zoo.create_model(MODEL).eval(), torch.device("cpu")
    with timing_context(cpu, torch.float32, threads=1):
        choice, probe = resolve_cuda_timing(model, model.example_input(1, (3, SIZE, SIZE)), {}, cpu, FAST)
    assert set(probe) == {"device_ms", "latency_ms", "host_ms", "syncs"} and probe["syncs"] is False
    assert min(probe["device_ms"], probe["latency_ms"], probe["host_ms"]) > 0
    assert choice == ("queued" if probe["device_ms"] >= 0.8 * probe["latency_ms"] else "isolated")


def test_cpu_tables_ignore_the_cuda_timing_protocol(tmp_path: Path) -> None:
    auto = build_table(MODEL, input_size=SIZE, device="cpu", cache_dir=str(tmp_path), settings=FAST)
    queued = build_table(MODEL, input_size=SIZE, device="cpu", cache_dir=str(tmp_path),
                         settings=replace(FAST, cuda_timing="queued"))
    assert auto.timing_probe == {} and auto.condition == queued.condition and queued.n_measured == 0


def test_unknown_cuda_timing_is_refused() -> None:
    with pytest.raises(ValueError, match="cuda_timing"):
        TableSettings(cuda_timing="fast")


# -- in-context entry timing ------------------------------------------------------------------------------------
class _Sleep(torch.nn.Module):
    def __init__(self, ms: float):
        super().__init__()
        self.ms = ms

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.ms / 1e3)
        return x


def test_context_bench_attributes_time_to_the_segment_it_was_spent_in() -> None:
    from zoo.latency.context import ContextBench

    net = torch.nn.Sequential(_Sleep(2.0), _Sleep(12.0), _Sleep(4.0), _Sleep(6.0))
    bench = ContextBench(net, ["1", "3"], (torch.zeros(1),))
    bench.run(min_runs=8)
    bench.close()
    median = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
    assert 12.0 <= median(bench.segment_ms["1"]) < 13.5 and 6.0 <= median(bench.segment_ms["3"]) < 7.5
    assert 6.0 <= median(bench.rest_ms) < 8.0  # the 2 ms and 4 ms outside the segments
    assert all(abs(t - (a + b + r)) < 1e-9 for t, a, b, r in
               zip(bench.times_ms, bench.segment_ms["1"], bench.segment_ms["3"], bench.rest_ms))
    assert not net[1]._forward_hooks and not net[1]._forward_pre_hooks  # close() removed the hooks


def test_probe_networks_use_every_variant_and_estimator_windows_add_up(table) -> None:
    import numpy as np

    from zoo.latency.context import probe_variants
    from zoo.latency.drift import estimator_runs

    assert probe_variants(table.keys, 2) != probe_variants(table.keys, 1)
    for spacing in (1, 2, 3):
        choices = probe_variants(table.keys, spacing)
        for i, seg_keys in enumerate(table.keys):
            measured = {v for v, key in seg_keys.items() if key is not None}
            seen = {choice[i] for choice in choices}
            # every measured variant is in some probe network (spacing > 1: the intact one is the intact network's)
            assert (seen if spacing == 1 else seen | {frozenset()}) == measured
        if spacing > 1:  # changed segments sit `spacing` apart, intact in between
            for choice in choices:
                changed = [i for i, variant in enumerate(choice) if variant]
                assert changed and all(b - a >= spacing for a, b in zip(changed, changed[1:]))
            assert len(choices) == len({tuple(c) for c in choices})
    intact, a, b, gone = frozenset(), frozenset({"a"}), frozenset({"b"}), frozenset({"s"})
    keys = [{intact: "k0", a: "k1", b: "k2", gone: None}, {intact: "k3"}, {intact: "k4", a: "k5"}]
    assert probe_variants(keys, 2) == [[a, intact, a], [b, intact, a]]  # no probe repeats one, none is intact
    assert probe_variants([{intact: "k"}] * 3, 2) == []  # nothing to change: the intact network alone
    assert probe_variants([], 2) == probe_variants([], 1) == []
    rng = np.random.default_rng(0)
    parts = rng.gamma(4.0, 1.0, size=(3, 200))  # three parts of a network, 200 runs
    totals = parts.sum(axis=0)
    for estimator, statistic in (("p10", 10), ("median", 50)):
        runs = estimator_runs(totals, estimator)
        assert sum(parts[j, runs].mean() for j in range(3)) == pytest.approx(totals[runs].mean())
        assert totals[runs].mean() == pytest.approx(np.percentile(totals, statistic), rel=0.05)


def test_cpu_tables_time_entries_in_context_by_default_and_isolated_on_request(table, tmp_path: Path) -> None:
    assert table.condition["protocol"] == "context-peers-1" and table.settings.entries == "context"
    probes = zoo.latency.context.probe_variants(table.keys, table.settings.probe_spacing)
    assert table.records[table.fixed_key]["networks"] == 1 + len(probes)  # the intact network and each probe one
    assert table.overhead_ms == 0.0 and table.fixed_raw_ms > 0
    isolated = build_table(MODEL, input_size=SIZE, device="cpu", cache_dir=str(tmp_path),
                           settings=replace(FAST, entries="isolated"))
    assert isolated.condition["protocol"] == "round-robin-peers-1" and isolated.overhead_ms > 0
    assert len(list(tmp_path.glob("*.json"))) == 1  # one cache file per protocol: the context one is elsewhere
    with pytest.raises(ValueError, match="entries timing"):
        TableSettings(entries="sometimes")
    with pytest.raises(ValueError, match="probe_spacing=0 must be >= 1"):
        TableSettings(probe_spacing=0)
    with pytest.raises(ValueError, match="warm_calls=-1 must be >= 0"):
        TableSettings(warm_calls=-1)
    with pytest.raises(ValueError, match="round_order='random' must be one of fixed, shuffled"):
        TableSettings(round_order="random")
    with pytest.raises(ValueError, match="round_order='random'"):
        zoo.latency.NetworkTimingSettings(round_order="random")
    keys = {TableSettings(entries="context", **kw): None for kw in ({}, {"probe_spacing": 2}, {"warm_calls": 1},
                                                                    {"round_order": "shuffled"})}
    assert len({zoo.latency.keys.protocol_name(torch.device("cpu"), s) for s in keys}) == 4  # no cache mixes them
    isolated = [TableSettings(entries="isolated", round_order=order) for order in ("fixed", "shuffled")]
    assert len({zoo.latency.keys.protocol_name(torch.device("cpu"), s) for s in isolated}) == 2


def test_warm_calls_keep_the_previous_network_in_the_round_out_of_the_timing() -> None:
    """A deterministic synthetic predecessor effect: a callable costs 20 ms more (well above a loaded machine's
    stalls) when another one ran just before it. Interleaved rounds time every run at +20 ms; one warm call per
    round times none of them there."""
    from zoo.latency.measure import Bench, time_rounds

    last: list[str] = [""]

    def network(name: str):
        def call() -> None:
            if last[0] != name:
                time.sleep(0.020)
            last[0] = name
        return call

    for warm_calls, slow in ((0, True), (1, False)):
        benches = [Bench(network(name)) for name in "ab"]
        time_rounds(benches, (6, 6), 1, 0.0, 60.0, together=True, warm_calls=warm_calls)
        for bench in benches:
            assert len(bench.times_ms) == 6
            assert all((ms >= 20.0) == slow for ms in bench.times_ms), (warm_calls, bench.times_ms)


def test_error_components_split_a_shift_per_build_a_bias_per_plan_and_the_rest() -> None:
    """Synthetic errors with known parts: build b shifts every plan by common[b], plan p is off by bias[p] in every
    build, and a small rest. The split recovers each part's spread (and the shift's mean); None for one build."""
    from benchmarks.latency_table import error_components

    rng = np.random.default_rng(0)
    common, bias = rng.normal(-0.02, 0.015, 40), rng.normal(0.0, 0.01, 30)
    bias -= bias.mean()  # a plan bias with a mean would be part of every build's shift
    rest = rng.normal(0.0, 0.002, (40, 30))
    builds = [{"plans": [{"error_anchored": common[b] + bias[p] + rest[b, p]} for p in range(30)]} for b in range(40)]
    parts = error_components(builds)
    assert parts["common_mean"] == pytest.approx(common.mean(), abs=0.001)
    assert parts["common_sd"] == pytest.approx(common.std(ddof=1), rel=0.05)
    assert parts["plan_sd"] == pytest.approx(bias.std(ddof=1), rel=0.05)
    assert parts["rest_sd"] == pytest.approx(0.002, rel=0.1)
    assert error_components(builds[:1]) is None


def test_shuffled_rounds_spread_the_previous_networks_effect_over_every_network() -> None:
    """A deterministic synthetic predecessor effect: `b` costs 20 ms more right after `a`. In a fixed order
    (a b c a b c ...) every run of `b` pays it and no other bench does; shuffled, each bench follows every other one
    in turn, `b` pays it in a share of its runs only, and the seeded order repeats from session to session."""
    from zoo.latency.measure import Bench, time_rounds

    def session(order: str) -> tuple[list[Bench], list[str]]:
        calls: list[str] = [""]

        def network(name: str):
            def call() -> None:
                if name == "b" and calls[-1] == "a":
                    time.sleep(0.020)
                calls.append(name)
            return call

        benches = [Bench(network(name)) for name in "abc"]
        time_rounds(benches, (30, 30), 1, 0.0, 60.0, together=True, order=order)
        return benches, calls

    def slow_share(bench: Bench) -> float:
        return float(np.mean(np.asarray(bench.times_ms) >= 20.0))

    fixed, _ = session("fixed")
    assert [slow_share(b) for b in fixed] == [0.0, 1.0, 0.0]
    shuffled, calls = session("shuffled")
    assert all(len(b.times_ms) == 30 for b in shuffled)
    assert 0.1 < slow_share(shuffled[1]) < 0.7 and slow_share(shuffled[0]) == slow_share(shuffled[2]) == 0.0
    assert session("shuffled")[1] == calls  # seeded: the same orders again
    assert len({tuple(calls[i:i + 3]) for i in range(1, len(calls), 3)}) > 1  # a new order in some rounds
    with pytest.raises(ValueError, match="round order"):
        time_rounds(shuffled, (1, 1), 1, 0.0, 1.0, order="random")


def test_evaluation_anchors_predictions_to_the_original_measured_in_the_same_session(table) -> None:
    from zoo.latency import NetworkTimingSettings, prediction_error

    evaluation = prediction_error(table, random_plans(table.segments, 3, seed=11),
                                  NetworkTimingSettings(warmup_s=0.05, net_warmup_s=0.0, min_rounds=3, max_rounds=3))
    original = evaluation.results[0]
    assert original.anchored_error() == pytest.approx(0.0)  # the anchor itself
    assert evaluation.drift == pytest.approx(original.predicted_raw_ms / original.measured_ms - 1)
    for r in evaluation.results[1:]:  # the error of the predicted speed-up over the original
        predicted_speedup = original.predicted_raw_ms / r.predicted_raw_ms
        measured_speedup = original.measured_ms / r.measured_ms
        assert r.anchored_error() == pytest.approx(measured_speedup / predicted_speedup - 1)
    summary = evaluation.summary()
    assert summary["max_abs_error_anchored"] == pytest.approx(max(abs(r.anchored_error())
                                                                  for r in evaluation.results[1:]))
    assert "anchored to the original measured now" in evaluation.format()


def test_diagnosis_splits_each_networks_error_into_segments_and_rest() -> None:
    from benchmarks.latency_diagnosis import diagnose, drift_trace, hook_check, neighbour_check, report, session_check

    quick = replace(FAST, entries="isolated")
    calib = zoo.latency.NetworkTimingSettings(warmup_s=0.05, net_warmup_s=0.0, min_rounds=5, max_rounds=5)
    result = diagnose(MODEL, 1, SIZE, 2, 0, quick, calib, rebuild=False)
    assert len(result["networks"]) == 3 and result["entries"]
    for n in result["networks"]:  # in-context parts add up to the measured total, so the split is exact
        assert n["predicted_ms"] - n["measured_ms"] == pytest.approx(n["segments_gap_ms"] + n["rest_gap_ms"], abs=1e-9)
        assert n["error"] == pytest.approx(n["predicted_ms"] / n["measured_ms"] - 1)
        anchored_gap = n["predicted_ms"] * result["anchor"] - n["measured_ms"]  # exact, anchored too
        assert anchored_gap == pytest.approx(n["segments_gap_anchored_ms"] + n["rest_gap_anchored_ms"], abs=1e-9)
        assert n["anchored_error"] == pytest.approx(anchored_gap / n["measured_ms"])
        largest = [abs(gap) for _, gap in n["largest_gaps_anchored_ms"]]
        assert len(largest) == 3 and largest == sorted(largest, reverse=True)
    assert result["networks"][0]["anchored_error"] == pytest.approx(0.0)
    assert "| original |" in report(result)
    check = hook_check(MODEL, 5, 1, SIZE, replace(FAST, entries="context"))
    assert check["segments"] > 0 and 0 < check["table_ms"]
    assert check["hooked_ms"] > 0 and check["plain_ms"] > 0  # their ratio is a measurement (the diagnosis), not a test
    sessions = session_check(MODEL, 2, 2, 0, 1, SIZE, replace(FAST, entries="context"), calib)
    assert [(r["session"], r["network"]) for r in sessions] == [
        (s, n) for s in (0, 1) for n in ("original", "plan 0", "plan 1")]
    assert all(r["removed"] for r in sessions if r["network"] != "original")  # pruned plans, measured twice
    assert sessions[1]["measured_ms"] != sessions[4]["measured_ms"]  # two sessions, two measurements
    rows = drift_trace(MODEL, 1.0, window_s=0.5)
    assert rows and all(r["min_ms"] <= r["p10_ms"] <= r["median_ms"] for r in rows)
    rows = neighbour_check(MODEL, 2, 3, 1, 1, SIZE, replace(FAST, entries="context"))
    assert [(r["mode"], r["warm_calls"], r["round_order"]) for r in rows] == [
        ("alone", 0, "fixed"), ("between plans", 0, "fixed"), ("between plans", 1, "fixed"),
        ("between plans", 0, "shuffled")]
    for r in rows:
        assert len(r["copies_relative"]) == 2 and r["copies_sd"] == pytest.approx(float(np.std(r["copies_relative"])))
        assert len(r["plans_ms"]) == (0 if r["mode"] == "alone" else 2)
        assert 0.5 < r["original_ms"] / rows[0]["original_ms"] < 2  # the copies are the original in every mode


def test_part_drift_separates_a_part_that_drifts_with_the_network_from_one_that_drifts_alone() -> None:
    """Synthetic windows: the network's speed moves +-20 %, part A is always 10 % of the network, part B also moves
    on its own (+-15 %). Relative to the network A does not spread and B does; the hog windows make B 30 % slower
    and leave A's share alone. Then real traces, with and without the hog, a drift trace alternating CPUs, and the
    command line's bad input."""
    from benchmarks.latency_diagnosis import PART_KERNELS, drift_trace, part_drift_summary, part_drift_trace

    def part(ms: float) -> dict[str, Any]:
        return {"p10_ms": ms, "halves_p10_ms": [ms * 0.99, ms * 1.01]}

    speed = [1.0, 1.2, 0.8, 1.1, 0.9, 1.0, 1.2, 0.8]
    own = [1.0, 1.0, 1.15, 1.0, 0.85, 1.0, 1.1, 1.0]
    rows = [{"window": i, "memory_hog": bool(i % 2), "network": part(20 * s), "A": part(2 * s),
             "B": part(3 * s * o * (1.3 if i % 2 else 1.0))} for i, (s, o) in enumerate(zip(speed, own))]
    summary = part_drift_summary(rows)
    quiet_speed = np.array(speed[0::2])
    assert summary["network"]["sd"] == pytest.approx(np.std(quiet_speed, ddof=1) / np.median(quiet_speed))
    assert summary["A"]["sd"] == pytest.approx(summary["network"]["sd"])  # it drifts with the machine
    assert summary["A"]["sd_relative_to_network"] == pytest.approx(0.0, abs=1e-12)  # one scale takes it out
    quiet_own = np.array(own[0::2])  # one scale leaves B's own movement in, and only that
    assert summary["B"]["sd_relative_to_network"] == pytest.approx(np.std(quiet_own, ddof=1) / np.median(quiet_own))
    assert summary["A"]["noise"] == pytest.approx(0.02 / 1.349, rel=1e-6)
    assert summary["A"]["with_hog_over_without_relative_to_network"] == pytest.approx(1.0)
    assert summary["B"]["with_hog_over_without_relative_to_network"] == pytest.approx(1.3 / np.median(quiet_own))

    rows = part_drift_trace(MODEL, 2, window_s=0.2, sweep_mb=8, min_runs=4)
    assert [r["window"] for r in rows] == [0, 1] and not any(r["memory_hog"] or r["hog_ran"] for r in rows)
    for r in rows:
        assert r["runs"] >= 4 and set(r) >= {"network", *PART_KERNELS}
        assert all(r[name]["p10_ms"] > 0 and len(r[name]["halves_p10_ms"]) == 2 for name in ("network", *PART_KERNELS))
    cpus = os.sched_getaffinity(0)
    if {0, 1} <= cpus:  # the hog streams through the second window; afterwards this process runs where it could
        hogged = part_drift_trace(MODEL, 3, window_s=0.2, memory_hog=True, sweep_mb=8, min_runs=4)
        assert [(r["memory_hog"], r["hog_ran"]) for r in hogged] == [(False, False), (True, True), (False, False)]
        assert os.sched_getaffinity(0) == cpus
        alternating = drift_trace(MODEL, 1.0, window_s=0.25, alternate_cpus=True)
        assert [r["cpu"] for r in alternating] == [0, 1, 0, 1] and os.sched_getaffinity(0) == cpus
    bad = subprocess.run([sys.executable, "-m", "benchmarks.latency_diagnosis", "--part-drift", "1"],
                         capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "--part-drift takes 2 or more windows" in bad.stderr


class _Slowed(torch.nn.Module):
    """Sleeps `ms`, twice as long once the shared machine turned slow (a stand-in for a co-tenant's slowdown)."""

    def __init__(self, ms: float, machine: dict, gauge: bool = False):
        super().__init__()
        self.ms, self.machine, self.gauge = ms, machine, gauge

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gauge:
            self.machine["calls"] += 1
        time.sleep(self.ms * (2 if self.machine["calls"] > self.machine["slow_after"] else 1) / 1e3)
        return x


def test_isolated_rounds_divide_the_machines_drift_out_by_the_reference_network():
    """A machine twice as slow in the last 60 % of the rounds: an entry of 10 ms (20 ms when slow). Divided by the
    reference's speed, its runs lose the drift (a small IQR, where the raw runs' is 10 ms), and each statistic is
    put back at the speed that statistic picks from the reference's raw runs: p10 at the fast state (as the entry
    timed alone on a machine that stays fast reports it), the median at the slow one (timed alone, always slow).
    Comparing with those two runs keeps each sleep's overshoot on a loaded machine out of the verdict."""
    from zoo.capture import Capture
    from zoo.latency.device import timing_context
    from zoo.latency.rounds import Pending, measure_rounds

    x = torch.zeros(1)
    settings = TableSettings(min_rounds=20, max_rounds=20, entry_warmup_s=0.0, rel_tol=0.0)

    def records(with_reference: bool, slow_after: int = 2 + 8) -> dict:  # 2 warm-up calls, then 8 fast rounds
        machine = {"calls": 0, "slow_after": slow_after}  # the reference's calls turn the machine slow
        gauge = Pending("ref", _Slowed(25.0, machine, gauge=True), Capture((x,), {}), "reference")
        entry = Pending("entry", _Slowed(10.0, machine), Capture((x,), {}), "entry")
        with timing_context(torch.device("cpu"), torch.float32, 1):
            return measure_rounds([entry], torch.device("cpu"), settings, gauge if with_reference else None)

    fast_alone = records(False, slow_after=10**6)["entry"]
    slow_alone = records(False, slow_after=-1)["entry"]
    assert "speed_range" not in fast_alone  # nothing to divide by without the reference
    assert slow_alone["median_ms"] == pytest.approx(2 * fast_alone["median_ms"], rel=0.15)  # the stand-in works
    divided = records(True)
    steady = divided["entry"]
    assert set(steady) >= {"p10_ms", "median_ms"} and "ref" not in divided
    assert steady["p10_ms"] == pytest.approx(fast_alone["p10_ms"], rel=0.08)
    assert steady["median_ms"] == pytest.approx(slow_alone["median_ms"], rel=0.08)
    assert steady["iqr_ms"] < 2.0 and steady["speed_range"][0] == pytest.approx(0.5, rel=0.15)


def test_each_bench_is_divided_by_the_speed_the_other_benches_saw():
    """Four networks on a machine that turns 20 % slower halfway; network A also turns 10 % slower on its own after
    a quarter. Every network loses the machine's step once divided by its speed, and A keeps its own step: its own
    runs do not set its speed (divided by itself, its step would vanish and its costs drift toward its median)."""
    from zoo.latency.drift import speeds_from_others

    rounds = np.arange(100)
    machine = np.where(rounds < 50, 1.0, 1.2)
    own = np.where(rounds < 25, 1.0, 1.1)
    times = [10.0 * machine * own, 5.0 * machine, 7.0 * machine, 3.0 * machine]
    speeds = speeds_from_others(times, 1)
    assert len(speeds) == 4 and all(s.shape == (100,) for s in speeds)
    for t, speed in zip(times[1:], speeds[1:]):  # one network's own change does not move the others' speed
        assert np.ptp(t / speed) == pytest.approx(0.0, abs=1e-9)
    a = times[0] / speeds[0]
    assert a[25:].mean() / a[:25].mean() == pytest.approx(1.1) and np.ptp(a[25:]) == pytest.approx(0.0, abs=1e-9)
    paired = speeds_from_others([np.r_[machine, machine], np.r_[machine, machine]], 2)  # 2 runs per round
    assert paired[0].shape == (200,) and np.ptp(np.r_[machine, machine] / paired[0]) == pytest.approx(0.0, abs=1e-9)


def test_speed_levels_put_each_estimator_back_where_the_raw_reference_has_it():
    """A reference at 10 ms for 30 rounds, then 20 % slower for 70: divided by its speed every run is at the median
    (slow) state; the levels bring p10 and min back to the fast state and leave the median where it is."""
    from zoo.latency.drift import machine_speed, speed_levels

    raw = np.r_[np.full(30, 10.0), np.full(70, 12.0)] + np.random.default_rng(0).uniform(0, 0.01, 100)
    levels = speed_levels(raw, machine_speed(raw))
    assert levels["p10"] == pytest.approx(10 / 12, rel=0.01) and levels["min"] == pytest.approx(10 / 12, rel=0.01)
    assert levels["median"] == pytest.approx(1.0, rel=0.01)


def test_timed_runs_reuse_freed_memory_instead_of_page_faulting_every_call():
    """A 40 MB buffer (above glibc's largest mmap threshold, like a merged dense conv's re-laid-out weights) is a
    fresh mmap on every call in a fresh process: ~10k page faults per call. Inside the timing context freed memory
    is kept, so repeated calls fault no page; on exit glibc mmaps such buffers again. In a fresh interpreter: in a
    process with a history the buffer may come from a hole an earlier allocation left in the heap (and not fault),
    which is why a default process's time for such kernels depends on what ran before."""
    from zoo.latency.device import host_allocator

    if host_allocator() != "glibc-keep-freed":
        pytest.skip("needs glibc (Linux): other C libraries keep their own allocator")
    script = textwrap.dedent("""
        import resource, torch
        from zoo.latency.device import timing_context

        def faults_per_call():
            counts = []
            for _ in range(4):
                before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                torch.ones(10_000_000).sum()  # 40 MB, written and freed
                counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
            return min(counts[1:])  # the first call may fault in memory the heap never had

        before = faults_per_call()
        with timing_context(torch.device("cpu"), torch.float32, 1):
            inside = faults_per_call()
        print(before, inside, faults_per_call())
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=ROOT)
    before, inside, after = map(int, out.stdout.split())
    assert before > 5000  # the default: mmap'd afresh every call
    assert inside < 100
    assert after > 5000  # glibc's thresholds back, 40 MB is above the mmap threshold
