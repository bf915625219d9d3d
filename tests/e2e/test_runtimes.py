"""Deploy runtimes (zoo.latency.runtime): latency tables, their correction and prune runs in torch.compile and
onnxruntime, the fixed part derived from the whole network there, refusals before any work, and failures that name
the record."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

from zoo.latency import LatencyCache, NetworkTimingSettings, TableSettings, build_table, correct

from ..helpers import TINY_PRUNE as TINY
from ..helpers import run_prune

ROOT = Path(__file__).resolve().parents[2]
FAST = TableSettings(warmup_s=0.1, entry_warmup_s=0.0, min_rounds=3, max_rounds=4)
QUICK_TIMING = NetworkTimingSettings(warmup_s=0.1, net_warmup_s=0.0, min_rounds=3, max_rounds=4)


def test_an_onnxruntime_table_is_its_own_condition_predicts_the_whole_network_and_is_corrected(tmp_path):
    kwargs = dict(input_size=16, device="cpu", cache_dir=str(tmp_path), settings=replace(FAST, runtime="onnxruntime"))
    table = build_table("mobilenetv2_035", **kwargs)
    assert table.condition["runtime"] == "onnxruntime" and table.condition["runtime_version"].startswith("onnxruntime")
    assert table.settings.entries == "isolated"  # nothing to time in context inside a session
    measured = [k for k, src in table.sources.items() if src == "measured"]
    assert all(table.records[k]["runtime_build_s"] > 0 for k in measured if k != table.fixed_key)
    assert table.runtime_build_s > 0 and "runtime onnxruntime" in table.describe_condition()
    # the original's prediction is the whole network's own measurement (the fixed part is derived from it)
    again = build_table("mobilenetv2_035", **kwargs)
    assert again.n_measured == 0
    cached = LatencyCache(table.condition, str(tmp_path)).load()
    assert "whole network" in cached[table.fixed_key]["what"]
    assert table.predict(corrected=False) == pytest.approx(cached[table.fixed_key]["p10_ms"])
    # records are timed chained after the previous segment; their cost is the chain less that segment alone
    chained = [i for i, prefix in enumerate(table.prefix_keys) if prefix]
    assert chained and table.prefix_keys[0] is None
    i = chained[0]
    assert table.raw_cost(i, frozenset()) == pytest.approx(max(0.0, cached[table.keys[i][frozenset()]]["p10_ms"]
                                                               - cached[table.prefix_keys[i]]["p10_ms"]))
    eager = build_table("mobilenetv2_035", **{**kwargs, "settings": FAST})  # same folder, another condition: measured
    assert eager.n_measured == eager.n_records and eager.condition["runtime"] == "eager"
    evaluation = correct(table, 2, settings=QUICK_TIMING)
    assert len(evaluation.results) == 3 and all(r.measured_ms > 0 for r in evaluation.results)


def test_a_compiled_table_builds_caches_and_is_corrected(tmp_path):
    kwargs = dict(input_size=16, device="cpu", cache_dir=str(tmp_path), settings=replace(FAST, runtime="compile"))
    table = build_table("mobilenetv2_035", **kwargs)
    assert table.condition["runtime"] == "compile" and table.n_measured == table.n_records
    assert table.runtime_build_s > 0
    assert build_table("mobilenetv2_035", **kwargs).n_measured == 0
    evaluation = correct(table, 2, settings=QUICK_TIMING)
    assert all(r.measured_ms > 0 for r in evaluation.results)


def test_prune_chooses_in_onnxruntime_and_reports_the_plan_in_eager_too(tmp_path):
    out = run_prune(*TINY, "prune.device=cpu", "prune.runtime=onnxruntime", "prune.runtime_report=[eager]",
                    "prune.target_speedup=1.05", base=tmp_path, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["condition"]["runtime"] == "onnxruntime"
    rows = results["runtimes"]
    assert list(rows) == ["onnxruntime", "eager"] and rows["onnxruntime"]["chosen_here"]
    assert not rows["eager"]["chosen_here"]
    for row in rows.values():
        assert row["measured_speedup"] == pytest.approx(row["baseline_ms"] / row["pruned_ms"])
        assert row["predicted_speedup"] == pytest.approx(row["predicted_baseline_ms"] / row["predicted_pruned_ms"])
    assert rows["onnxruntime"]["baseline_ms"] == results["baseline"]["latency_ms"]
    assert "<- the plan was chosen here" in out.stdout


def test_the_compile_int8_runtime_runs_inductors_int8_program():
    """compile_int8: torchao's PT2E quantisation compiled by inductor; its outputs are the quantised program's
    (eager, the same rounding), close to the float module's but not equal."""
    pytest.importorskip("torchao")
    from zoo.deploy.quantization import quantize_pt2e
    from zoo.latency.device import timing_context
    from zoo.latency.runtime import RuntimeFailure, check_runtime, in_runtime

    from ..unit.test_runtimes import CPU

    torch.manual_seed(0)
    conv = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 1)).eval()
    x = torch.randn(2, 4, 12, 12)
    with timing_context(CPU, torch.float32, 1):
        call = in_runtime(conv, (x,), {}, "compile_int8", CPU, what="the test block")
        got = call(x)[0]
        want = conv(x)
        rounded = quantize_pt2e(conv, (x,), [(x,)])(x)
    assert not torch.equal(got, want)  # quantised ...
    torch.testing.assert_close(got, want, rtol=0.05, atol=0.05 * want.abs().max().item())  # ... close to float
    # the program's numbers: nearer to them than to float by far (inductor's int8 kernels requantise in integers, so
    # an intermediate may round one step away from eager's: a few elements differ by that step)
    assert (got - rounded).norm() < 0.2 * (got - want).norm()
    close = torch.isclose(got, rounded, rtol=1e-3, atol=1e-3 * want.abs().max().item())
    assert close.float().mean() > 0.98
    with pytest.raises(RuntimeFailure, match="compile_int8 times INT8 models that inductor builds for the CPU"):
        check_runtime("compile_int8", torch.device("cuda"))


@pytest.mark.parametrize("check", ["runs", "refuses"])
def test_torch_compile_runs_the_module_it_was_given_and_names_what_it_cannot_take(check):
    """The unit tier's runtime checks, in torch.compile (inductor's first compile in a process: 10 s on a fresh
    2-core machine)."""
    from ..unit import test_runtimes as unit

    if check == "runs":
        unit.test_a_runtime_runs_the_module_it_was_given("compile")
    else:
        unit.test_a_module_the_runtime_cannot_take_fails_loudly_with_the_entry_named("compile")
