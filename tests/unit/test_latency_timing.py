"""How latency-table entries are timed: the CUDA timing protocols (on a GPU machine; skipped elsewhere), entries timed
in context inside probe networks, the error components, drift across rounds and sessions (CPU, tiny sizes)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

import zoo
from zoo.latency import (
    TableSettings,
    build_table,
    random_plans,
)

from ..helpers import FAST_TABLE as FAST
from ..helpers import TABLE_MODEL as MODEL
from ..helpers import TABLE_SIZE as SIZE

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
    from zoo.latency.timing import host_launch

    x = torch.zeros(4, device="cuda")
    assert host_launch(Bench(lambda: (x + 1).sum().item(), device=torch.device("cuda")))[1] is True
    assert host_launch(Bench(lambda: (x + 1).sum(), device=torch.device("cuda")))[1] is False


def test_auto_timing_probe_compares_device_time_with_latency() -> None:
    from zoo.latency.device import timing_context
    from zoo.latency.timing import resolve_cuda_timing

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
    from zoo.latency.timing import ContextBench

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

    from zoo.latency.timing import estimator_runs, probe_variants

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
    probes = zoo.latency.timing.probe_variants(table.keys, table.settings.probe_spacing)
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
    assert len({zoo.latency.settings.protocol_name(torch.device("cpu"), s) for s in keys}) == 4  # no cache mixes them
    isolated = [TableSettings(entries="isolated", round_order=order) for order in ("fixed", "shuffled")]
    assert len({zoo.latency.settings.protocol_name(torch.device("cpu"), s) for s in isolated}) == 2


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
    from studies.table_error_parts import error_components

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


def test_table_error_parts_reads_a_latency_table_run_and_refuses_anything_else(tmp_path, capsys) -> None:
    """The study reads a latency_table result's builds: the plan off with one sign in every build comes first; a file
    of another shape is one line and exit status 2."""
    import json

    from studies.table_error_parts import main
    from zoo.errors import run_command

    errors = {"a": (-0.05, -0.04), "b": (0.01, -0.01), "c": (0.0, 0.02)}
    builds = [{"plans": [{"label": name, "remove": ["x"], "error_anchored": e[b]} for name, e in errors.items()]}
              for b in range(2)]
    good, bad = tmp_path / "run.json", tmp_path / "other.json"
    good.write_text(json.dumps({"benchmark": "latency_table", "rows": [{"model": "m", "batch_size": 1,
                                                                      "builds": builds}]}))
    bad.write_text(json.dumps({"suite": "latency_table", "form": "conditions", "conditions": {}}))
    assert run_command(lambda: main([str(good), "--out", str(tmp_path / "parts.json")])) == 0
    printed = capsys.readouterr().out
    worst = printed.split("plans with")[1].split(";")[0]
    assert "a (1 removed) -4.5%, range -5.0% to -4.0%, same sign in 100%" in worst
    assert json.loads((tmp_path / "parts.json").read_text())["results"][str(good)][0]["components"]["plan_sd"] > 0
    assert run_command(lambda: main([str(bad)])) == 2
    assert "not a latency_table result" in capsys.readouterr().err
    bad.write_text(json.dumps({"form": "conditions", "rows": []}))  # the GPU check's form: no builds
    assert run_command(lambda: main([str(bad)])) == 2 and "not a latency_table result" in capsys.readouterr().err
    bad.write_text(json.dumps({"benchmark": "latency_table",
                               "rows": [{"model": "m", "batch_size": 1, "builds": [{"plans": [{"label": "a"}]}] * 2}]}))
    assert run_command(lambda: main([str(bad)])) == 2 and "keeps no per-plan error_anchored" in capsys.readouterr().err


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
    from zoo.latency.device import timing_context
    from zoo.latency.timing import Pending, measure_rounds
    from zoo.pruning.capture import Capture

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
    from zoo.latency.timing import speeds_from_others

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
    from zoo.latency.timing import machine_speed, speed_levels

    raw = np.r_[np.full(30, 10.0), np.full(70, 12.0)] + np.random.default_rng(0).uniform(0, 0.01, 100)
    levels = speed_levels(raw, machine_speed(raw))
    assert levels["p10"] == pytest.approx(10 / 12, rel=0.01) and levels["min"] == pytest.approx(10 / 12, rel=0.01)
    assert levels["median"] == pytest.approx(1.0, rel=0.01)
