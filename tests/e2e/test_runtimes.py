"""Deploy runtimes (zoo.latency.runtime): latency tables, their correction and prune runs in torch.compile and
onnxruntime, the fixed part derived from the whole network there, refusals before any work, and failures that name
the record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from zoo.latency import LatencyCache, NetworkTimingSettings, TableSettings, build_table, correct

from ..helpers import TINY_PRUNE as TINY
from ..helpers import run_prune

ROOT = Path(__file__).resolve().parents[2]
FAST = TableSettings(warmup_s=0.1, entry_warmup_s=0.0, min_rounds=3, max_rounds=4)
QUICK_TIMING = NetworkTimingSettings(warmup_s=0.1, net_warmup_s=0.0, min_rounds=3, max_rounds=4)


def test_an_onnxruntime_table_is_its_own_condition_predicts_the_whole_network_and_is_corrected(tmp_path):
    kwargs = dict(input_size=16, device="cpu", cache_dir=str(tmp_path), settings=FAST)
    table = build_table("mobilenetv2_035", runtime="onnxruntime", **kwargs)
    assert table.condition["runtime"] == "onnxruntime" and table.condition["runtime_version"].startswith("onnxruntime")
    assert table.settings.entries == "isolated"  # nothing to time in context inside a session
    measured = [k for k, src in table.sources.items() if src == "measured"]
    assert all(table.records[k]["runtime_build_s"] > 0 for k in measured if k != table.fixed_key)
    assert table.runtime_build_s > 0 and "runtime onnxruntime" in table.describe_condition()
    # the original's prediction is the whole network's own measurement (the fixed part is derived from it)
    again = build_table("mobilenetv2_035", runtime="onnxruntime", **kwargs)
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
    eager = build_table("mobilenetv2_035", **kwargs)  # same cache folder, another condition: measured anew
    assert eager.n_measured == eager.n_records and eager.condition["runtime"] == "eager"
    evaluation = correct(table, 2, settings=QUICK_TIMING)
    assert len(evaluation.results) == 3 and all(r.measured_ms > 0 for r in evaluation.results)


def test_a_compiled_table_builds_caches_and_is_corrected(tmp_path):
    kwargs = dict(input_size=16, device="cpu", cache_dir=str(tmp_path), settings=FAST, runtime="compile")
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


def test_prune_plans_on_int8_latencies_and_reports_int8_quality(tmp_path):
    out = run_prune(*TINY, "prune.device=cpu", "prune.quantize=int8", "prune.target_speedup=1.1", "finetune.qat=true",
                    base=tmp_path, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    qat = results["int8"]["qat"]  # the pruned INT8 model comes from quantisation-aware training ...
    assert qat["epochs"] == 1 and 0 <= qat["simulated_metrics"]["val/acc1"] <= 100
    assert (tmp_path / "run" / "qat" / "checkpoints" / "last.safetensors").is_file()
    from ..wandb_reader import find_run_files, read_run

    (run_file,) = find_run_files(tmp_path / "run")
    history = read_run(run_file).history  # ... logged beside the fine-tune, under its own names
    assert any("qat/val/acc1" in row and "qat/train/loss" in row for row in history)
    assert any("val/acc1" in row and "train/loss" in row for row in history)  # the fine-tune's own names
    assert results["condition"]["runtime"] == "onnxruntime_int8"
    rows = results["runtimes"]
    assert list(rows) == ["onnxruntime_int8", "onnxruntime"] and rows["onnxruntime_int8"]["chosen_here"]
    int8 = results["int8"]
    for side in ("baseline", "pruned"):
        assert 0 <= int8[side]["metrics"]["val/acc1"] <= 100 and 0 <= int8[side]["top1_agreement"] <= 1
        assert int8[side]["int8_size_mb"] < int8[side]["fp32_size_mb"]
    assert (tmp_path / "run" / "pruned_int8.onnx").is_file() and "int8 (onnxruntime" in out.stdout


def test_prune_plans_on_compiled_int8_latencies_and_ships_a_pt2e_program(tmp_path):
    pytest.importorskip("torchao")
    out = run_prune(*TINY, "model=plainresnet8", "prune.device=cpu", "prune.quantize=int8", "prune.runtime=compile",
                    "prune.target_speedup=1.1", "prune.target_corrections=1", base=tmp_path, timeout=1500)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["condition"]["runtime"] == "compile_int8" and list(results["runtimes"]) == ["compile_int8",
                                                                                              "compile"]
    int8 = results["int8"]
    assert int8["format"] == "torch_export" and int8["path"].endswith("pruned_int8.pt2")
    for side in ("baseline", "pruned"):
        assert 0 <= int8[side]["metrics"]["val/acc1"] <= 100 and 0 <= int8[side]["top1_agreement"] <= 1
    import torchao.quantization.pt2e  # noqa: F401 - the program's quantise/dequantise operators

    program = torch.export.load(int8["path"]).module()
    ops = {str(node.target) for node in program.graph.nodes if node.op == "call_function"}
    assert any("quantize_per_tensor" in op for op in ops)  # the shipped program is the quantised one
    assert "int8 (torch.compile, PT2E)" in out.stdout
