"""prune.py with prune.quantize=int8, as a user runs it: planned on INT8 latencies in onnxruntime and in torch.compile
(PT2E), with the INT8 networks' quality reported (a module of its own so that CI's two workers share the slow runs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from zoo.latency import NetworkTimingSettings, TableSettings

from ..helpers import TINY_PRUNE as TINY
from ..helpers import run_prune

ROOT = Path(__file__).resolve().parents[2]
FAST = TableSettings(warmup_s=0.1, entry_warmup_s=0.0, min_rounds=3, max_rounds=4)
QUICK_TIMING = NetworkTimingSettings(warmup_s=0.1, net_warmup_s=0.0, min_rounds=3, max_rounds=4)


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
