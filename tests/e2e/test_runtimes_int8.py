"""prune.py with prune.quantize=int8, as a user runs it: planned on INT8 latencies in onnxruntime and in torch.compile
(PT2E), with the INT8 networks' quality reported (a module of its own so that CI's two workers share the slow runs)."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from zoo.latency import NetworkTimingSettings, TableSettings, build_table

from ..helpers import TINY_PRUNE as TINY
from ..helpers import agreement, in_onnxruntime, run_prune

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


# In process, but minutes of onnxruntime and PT2E work on 2 cores: here rather than in the unit tier.
def test_an_int8_table_is_its_own_condition(tmp_path):
    # plainresnet8: a handful of entries (every entry is exported and, for INT8, quantised: MobileNetV2 takes minutes)
    fp32 = build_table("plainresnet8", input_size=16, device="cpu", cache_dir=str(tmp_path),
                       settings=replace(FAST, runtime="onnxruntime"))
    int8 = build_table("plainresnet8", input_size=16, device="cpu", cache_dir=str(tmp_path),
                       settings=replace(FAST, runtime="onnxruntime_int8"))
    assert int8.condition["runtime"] == "onnxruntime_int8" and int8.n_measured > 0  # not fp32's records
    assert len(list(tmp_path.glob("*.json"))) == 2 and int8.predict() > 0 and fp32.predict() > 0


def test_int8_export_reports_agreement_and_refuses_what_it_cannot_quantise(tmp_path):
    import zoo
    from zoo.errors import ExportError

    from ..helpers import randomise_norm_stats

    torch.manual_seed(0)
    model = randomise_norm_stats(zoo.create_model("mobilenetv2_035", num_classes=10)).eval()
    calibration = [torch.randn(4, 3, 32, 32) for _ in range(3)]
    report = zoo.export(model, tmp_path / "m.onnx", input_size=(3, 32, 32), quantize="int8", calibration=calibration,
                        min_agreement=0.0)  # (random weights: near-equal logits, so agreement is not the point here)
    agree, largest = agreement(model, in_onnxruntime(tmp_path / "m.onnx"), calibration)
    assert report.quantize == "int8" and report.calibration_batches == 3 and report.passed
    assert report.top1_agreement == pytest.approx(agree)  # recomputed here from the file it wrote
    assert report.max_abs_diff == pytest.approx(largest, rel=1e-5) and largest > 0  # quantised: close, not equal
    import onnx

    ops = {node.op_type for node in onnx.load(str(tmp_path / "m.onnx")).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    with pytest.raises(ExportError, match="below min_agreement=101%"):  # the verdict follows the threshold
        zoo.export(model, tmp_path / "n.onnx", input_size=(3, 32, 32), quantize="int8", min_agreement=1.01)
    with pytest.raises(ExportError, match="quantised export is quantize='int8' of a model's forward"):
        zoo.export(model, tmp_path / "m.pt2", format="torch_export", quantize="int4")
    if importlib.util.find_spec("torchao") is None:
        return
    import torchao.quantization.pt2e  # noqa: F401 - the program's quantise/dequantise operators

    report = zoo.export(model, tmp_path / "m.pt2", format="torch_export", input_size=(3, 32, 32), quantize="int8",
                        calibration=calibration, min_agreement=0.0)  # PT2E, for torch.compile
    agree, largest = agreement(model, torch.export.load(str(tmp_path / "m.pt2")).module(), calibration)
    assert report.format == "torch_export" and report.top1_agreement == pytest.approx(agree)
    assert report.max_abs_diff == pytest.approx(largest, rel=1e-5)
    assert report.max_abs_diff > 0 and (tmp_path / "m.pt2").stat().st_size < report.float_size_bytes
