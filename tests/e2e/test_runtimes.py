"""Deploy runtimes (zoo.latency.runtime): latency tables, their correction and prune runs in torch.compile and
onnxruntime, the fixed part derived from the whole network there, refusals before any work, and failures that name
the record."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

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


