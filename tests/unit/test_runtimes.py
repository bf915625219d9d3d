"""Deploy runtimes (zoo.latency.runtime): latency tables, their correction and prune runs in torch.compile and
onnxruntime, the fixed part derived from the whole network there, refusals before any work, and failures that name
the record."""

from __future__ import annotations

import sys
from dataclasses import replace

import numpy as np
import pytest
import torch
from torch import nn

from zoo.errors import ZooError
from zoo.latency import TableSettings, build_table
from zoo.latency.build import STATS, fixed_from_whole, record_cost
from zoo.latency.device import timing_context
from zoo.latency.runtime import RuntimeCall, RuntimeFailure, check_runtime, in_runtime, tensorrt_backend
from zoo.latency.timing import Pending, measure_rounds
from zoo.pruning.capture import Capture

from ..helpers import TINY_PRUNE, agreement, in_onnxruntime, prune_in_process

CPU = torch.device("cpu")
FAST = TableSettings(warmup_s=0.1, entry_warmup_s=0.0, min_rounds=3, max_rounds=4)


class Branchy(nn.Module):
    """A branch on the data: neither a one-graph compile nor an ONNX export can take it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.sum() > 0 else x - 1


@pytest.mark.parametrize("runtime", ["onnxruntime"])  # (compile: tests/e2e/test_runtimes.py, with inductor's cold
def test_a_runtime_runs_the_module_it_was_given(runtime):  # start of 10 s on a fresh machine)
    torch.manual_seed(0)
    conv = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 1)).eval()
    x = torch.randn(2, 4, 12, 12)
    with timing_context(CPU, torch.float32, 1):
        call = in_runtime(conv, (x,), {}, runtime, CPU, what="the test block")
        out = call(x)
        got = torch.as_tensor(out[0]) if isinstance(out, (list, tuple)) else out
        want = conv(x)
    assert isinstance(call, RuntimeCall) and call.build_s > 0
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert in_runtime(conv, (x,), {}, "eager", CPU) is conv


@pytest.mark.parametrize("runtime", ["onnxruntime"])  # (compile: tests/e2e/test_runtimes.py)
def test_a_module_the_runtime_cannot_take_fails_loudly_with_the_entry_named(runtime):
    x = torch.randn(1, 3)
    pending = [Pending("k", Branchy(), Capture((x,), {}), "blocks.7 [removed act] Branchy")]
    with timing_context(CPU, torch.float32, 1), pytest.raises(RuntimeFailure, match=r"blocks\.7 \[removed act\]"):
        measure_rounds(pending, CPU, TableSettings(runtime=runtime, min_rounds=1, max_rounds=1))


def test_unavailable_runtimes_are_refused_with_the_install_command(monkeypatch):
    with pytest.raises(RuntimeFailure, match="needs a CUDA GPU"):
        check_runtime("tensorrt", CPU)
    with pytest.raises(RuntimeFailure, match="builds TensorRT INT8 engines on a CUDA GPU"):
        check_runtime("tensorrt_int8", CPU)
    with pytest.raises(RuntimeFailure, match="allowed are eager, compile, compile_int8, onnxruntime, onnxruntime_int8, "
                                             "tensorrt"):
        check_runtime("openvino", CPU)
    with pytest.raises(RuntimeFailure, match="float32"):
        check_runtime("onnxruntime", CPU, torch.bfloat16)
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if it were not installed
    with pytest.raises(RuntimeFailure, match="pip install"):
        check_runtime("onnxruntime", CPU)
    monkeypatch.setitem(sys.modules, "torchao", None)
    with pytest.raises(RuntimeFailure, match="compile_int8 needs torchao .*pip install torchao"):
        check_runtime("compile_int8", CPU)
    with pytest.raises(ZooError, match="entries='context'"):
        TableSettings(runtime="compile", entries="context")


def test_the_fixed_part_outside_eager_is_the_whole_network_less_its_intact_segments():
    """By hand: whole 10 ms (p10 9); segment 0 alone 3 ms (p10 2.8) less the call overhead 0.5 (p10 0.4); segment 1
    chained after segment 0: 5.5 ms (p10 5.0) less segment 0 alone 3 (p10 2.8). Costs 2.5 + 2.5 = 5 ms (p10 2.4 + 2.2
    = 4.6): fixed = 5 ms (p10 4.4)."""
    def rec(median, p10):
        return {s: (p10 if s in ("p10_ms", "min_ms") else median) for s in STATS}

    overhead, seg0, chain1 = rec(0.5, 0.4), rec(3.0, 2.8), rec(5.5, 5.0)
    intact = [{s: record_cost(seg0, overhead, s) for s in STATS}, {s: record_cost(chain1, seg0, s) for s in STATS}]
    fixed = fixed_from_whole(rec(10.0, 9.0), intact)
    assert fixed["median_ms"] == pytest.approx(5.0) and fixed["p10_ms"] == pytest.approx(4.4)
    assert fixed["peak_mem_bytes"] is None


@pytest.mark.skipif(not torch.cuda.is_available() or tensorrt_backend() is None, reason="TensorRT needs a CUDA GPU "
                    "and torch-tensorrt or onnxruntime's TensorRT EP")
def test_tensorrt_table_on_a_gpu(tmp_path):
    table = build_table("mobilenetv2_035", input_size=64, batch_size=8, device="cuda", cache_dir=str(tmp_path),
                        settings=replace(FAST, runtime="tensorrt"))
    assert table.condition["runtime"] == "tensorrt" and table.predict() > 0


# -------------------------------------------------------------------------------------------- INT8 (onnxruntime)
def test_the_int8_runtime_runs_a_quantised_module_close_to_the_float_one():
    torch.manual_seed(0)
    conv = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 1)).eval()
    x = torch.randn(2, 4, 12, 12)
    with timing_context(CPU, torch.float32, 1):
        call = in_runtime(conv, (x,), {}, "onnxruntime_int8", CPU, what="the test block")
        got = torch.as_tensor(call(x)[0])
        want = conv(x)
    assert not torch.equal(got, want)  # quantised: not the float numbers ...
    torch.testing.assert_close(got, want, rtol=0.05, atol=0.05 * want.abs().max().item())  # ... but close to them
    with pytest.raises(RuntimeFailure, match="INT8 on a GPU is TensorRT's: runtime=tensorrt_int8"):
        check_runtime("onnxruntime_int8", torch.device("cuda"))


def test_int8_export_for_tensorrt_writes_symmetric_qdq(tmp_path):
    """int8_scheme='tensorrt': every activation Q/DQ pair signed 8-bit with zero point 0 (TensorRT's explicit
    quantisation takes nothing else), weights per channel; the agreement is recomputed from the file."""
    import onnx
    from onnx import numpy_helper

    import zoo
    from zoo.errors import ExportError

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5)).eval()
    calibration = [torch.rand(4, 3, 16, 16) for _ in range(2)]  # (non-negative: an asymmetric scheme would shift)
    report = zoo.export(model, tmp_path / "trt.onnx", example=calibration[0], quantize="int8",
                        calibration=calibration, min_agreement=0.0, int8_scheme="tensorrt")
    graph = onnx.load(str(tmp_path / "trt.onnx")).graph
    stored = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    zero_points = [stored[n.input[2]] for n in graph.node if n.op_type == "QuantizeLinear"]
    assert zero_points and all(z.dtype == np.int8 and not z.any() for z in zero_points)
    weights = [stored[n.input[1]] for n in graph.node if n.op_type == "DequantizeLinear"
               and stored.get(n.input[0], np.zeros(1)).dtype == np.int8 and stored[n.input[0]].ndim > 1]
    assert len(weights) == 3 and all(scale.size > 1 for scale in weights)  # per output channel
    dequantised = [stored[n.input[0]].dtype for n in graph.node if n.op_type == "DequantizeLinear"
                   and n.input[0] in stored]
    assert dequantised and set(dequantised) == {np.dtype(np.int8)}  # no int32 bias: TensorRT's parser takes none
    agree, largest = agreement(model, in_onnxruntime(tmp_path / "trt.onnx", qdq_in_float=True), calibration)
    assert report.int8_scheme == "tensorrt" and report.top1_agreement == pytest.approx(agree)
    assert 0 < report.max_abs_diff == pytest.approx(largest, rel=1e-5)
    with pytest.raises(ExportError, match="int8_scheme='openvino'"):
        zoo.export(model, tmp_path / "x.onnx", example=calibration[0], quantize="int8", int8_scheme="openvino")
    with pytest.raises(ExportError, match="give quantize='int8' with it"):
        zoo.export(model, tmp_path / "x.onnx", example=calibration[0], int8_scheme="tensorrt")


@pytest.mark.parametrize("scheme", ["onnxruntime", "tensorrt"])
def test_int8_keeps_group_norm_float(tmp_path, scheme):
    """BiT's GroupNorm (exported as InstanceNormalization, then its affine Mul/Add) stays a float island: only the
    convolutions' and the classifier's constants are rounded. (Fresh GroupNorms have equal affines, which the
    exporter shares: rounded as weights, onnxruntime's quantiser refuses them, as it did BiT.)"""
    import onnx

    import zoo

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1),
                          nn.GroupNorm(2, 8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5)).eval()
    x = torch.randn(4, 3, 16, 16)
    report = zoo.export(model, tmp_path / "gn.onnx", example=x, quantize="int8", calibration=[x], min_agreement=0.0,
                        int8_scheme=scheme)
    graph = onnx.load(str(tmp_path / "gn.onnx")).graph
    stored = {i.name for i in graph.initializer}
    readers: dict[str, list[str]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node.op_type)
    rounded = [n.output[0] for n in graph.node if n.op_type == "DequantizeLinear" and n.input[0] in stored]
    assert rounded and {op for name in rounded for op in readers[name]} <= {"Conv", "Gemm", "MatMul"}
    assert sum(n.op_type == "InstanceNormalization" for n in graph.node) == 2  # the normalisations, in float
    with torch.no_grad():
        scale = model(x).abs().max().item()
    assert 0 < report.max_abs_diff < 0.1 * scale


@pytest.mark.skipif(not torch.cuda.is_available(), reason="TensorRT INT8 engines need a CUDA GPU")
def test_the_tensorrt_int8_runtime_runs_the_symmetric_qdq_file():
    """tensorrt_int8 on a GPU: the engine computes what the TensorRT-form QDQ file computes (onnxruntime on the CPU),
    within INT8 rounding, and differs from float."""
    from zoo.deploy.quantization import quantize_int8
    from zoo.latency.runtime import onnx_bytes, tensorrt_int8_backend

    if tensorrt_int8_backend() is None:
        pytest.skip("no TensorRT here")
    import onnxruntime as ort

    cuda = torch.device("cuda")
    torch.manual_seed(0)
    block = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 8, 1)).eval()
    x = torch.randn(2, 8, 16, 16)
    with torch.no_grad():
        want = block(x)
    from zoo.deploy.quantization import QDQ_IN_FLOAT

    qdq = quantize_int8(onnx_bytes(block, (x,), {}, "the block")[0], [(x,)], scheme="tensorrt")
    options = ort.SessionOptions()
    for key, value in QDQ_IN_FLOAT.items():  # TensorRT's arithmetic: Q/DQ pairs rounded, layers in float
        options.add_session_config_entry(key, value)
    session = ort.InferenceSession(qdq, options, providers=["CPUExecutionProvider"])
    rounded = torch.from_numpy(session.run(None, {session.get_inputs()[0].name: x.numpy()})[0])
    gpu_block = block.to(cuda)
    with timing_context(cuda, torch.float32, 1):
        call = in_runtime(gpu_block, (x.to(cuda),), {}, "tensorrt_int8", cuda, what="the block")
        out = call(x.to(cuda))[0]  # a tensor (TensorRT's API) or an OrtValue (onnxruntime's TensorRT EP)
        got = out.cpu() if torch.is_tensor(out) else torch.from_numpy(out.numpy())
    scale = want.abs().max().item()
    assert (got - want).abs().max().item() > 1e-5 * scale  # INT8, not float
    torch.testing.assert_close(got, rounded, rtol=0.02, atol=0.02 * scale)


@pytest.mark.parametrize("scheme", ["onnxruntime", "tensorrt"])
def test_qat_simulates_the_int8_model_onnxruntime_writes(tmp_path, scheme):
    """prepare_qat rounds each weight to the very values onnxruntime's INT8 file holds, and a layer's input with the
    scale and zero point onnxruntime calibrates on the same batch (in either scheme: unsigned, or TensorRT's symmetric
    signed); strip_qat gives back the float layers."""
    import copy

    import onnx
    from onnx import numpy_helper

    import zoo
    from zoo.deploy.quantization import QuantizationError, prepare_qat, strip_qat

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2, padding=1),
                          nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)).eval()
    x = torch.randn(8, 3, 16, 16)
    zoo.export(model, tmp_path / "m.onnx", example=x, quantize="int8", calibration=[x], min_agreement=0.0,
               int8_scheme=scheme)
    graph = onnx.load(str(tmp_path / "m.onnx")).graph
    stored = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    onnx_weights = []  # each int8 weight times its per-channel scale (axis 0: output channels)
    for node in graph.node:
        if node.op_type == "DequantizeLinear" and stored.get(node.input[0], np.zeros(1)).dtype == np.int8:
            values, scale = stored[node.input[0]], stored[node.input[1]]
            onnx_weights.append(torch.from_numpy(values * scale.reshape(-1, *[1] * (values.ndim - 1))))
    first_input = next(n for n in graph.node if n.op_type == "QuantizeLinear")
    qat = prepare_qat(copy.deepcopy(model), scheme).train()
    with torch.no_grad():
        qat(x)  # one batch observed: the same min/max onnxruntime calibrated on
    layers = [qat[0], qat[2], qat[6]]
    assert len(onnx_weights) == len(layers)
    for layer in layers:
        twins = [w for w in onnx_weights if w.shape == layer.weight.shape]
        assert min((w - layer.weight.detach()).abs().max().item() for w in twins) < 1e-6
    assert qat[0].input_quant.scale.item() == pytest.approx(float(stored[first_input.input[1]]), rel=1e-5)
    assert qat[0].input_quant.zero_point.item() == int(stored[first_input.input[2]])
    assert qat[0].input_quant.quant_min == {"onnxruntime": 0, "tensorrt": -127}[scheme]
    assert not torch.equal(qat[0].weight, model[0].weight)  # rounded while prepared ...
    strip_qat(qat)
    assert qat.state_dict().keys() == model.state_dict().keys()  # ... plain float layers again
    assert all(torch.equal(value, model.state_dict()[key]) for key, value in qat.state_dict().items())
    with pytest.raises(QuantizationError, match="already prepared"):
        prepare_qat(prepare_qat(copy.deepcopy(model)))
    with pytest.raises(QuantizationError, match="no Conv2d or Linear"):
        prepare_qat(nn.Sequential(nn.ReLU()))
    with pytest.raises(QuantizationError, match="Unknown INT8 scheme 'int4'"):
        prepare_qat(copy.deepcopy(model), "int4")


def test_int8_planning_runtime_follows_int8_table():
    from omegaconf import OmegaConf

    from zoo.jobs.prune_config import int8_format, planning_runtime, reported_runtimes

    def p(**given):
        return OmegaConf.create({"runtime": "onnxruntime", "quantize": None, "int8_table": True, "runtime_report": [],
                                 **given})

    assert planning_runtime(p()) == "onnxruntime" and reported_runtimes(p()) == []
    assert planning_runtime(p(quantize="int8")) == "onnxruntime_int8"
    assert reported_runtimes(p(quantize="int8", runtime_report=["eager"])) == ["onnxruntime", "eager"]
    fp32_table = p(quantize="int8", int8_table=False)  # planned on float32, the INT8 network still measured
    assert planning_runtime(fp32_table) == "onnxruntime" and reported_runtimes(fp32_table) == ["onnxruntime_int8"]
    compiled = p(runtime="compile", quantize="int8")  # torch.compile's INT8: PT2E
    assert planning_runtime(compiled) == "compile_int8" and reported_runtimes(compiled) == ["compile"]
    assert int8_format(compiled) == ("torch_export", None)
    tensorrt = p(runtime="tensorrt", quantize="int8")  # TensorRT's INT8: explicit quantisation of a symmetric QDQ file
    assert planning_runtime(tensorrt) == "tensorrt_int8" and reported_runtimes(tensorrt) == ["tensorrt"]
    assert int8_format(tensorrt) == ("onnx", "tensorrt") and int8_format(p(quantize="int8")) == ("onnx", "onnxruntime")


TINY_CPU = [*TINY_PRUNE, "logger=none"]


def test_prune_refuses_a_runtime_it_cannot_use_before_any_work(tmp_path, capsys):
    for override, message in (("prune.runtime=tensorrt", "needs a CUDA GPU"),
                              ("prune.runtime_report=[onnxruntime,openvino]", "prune.runtime_report=openvino"),
                              ("++prune.table={runtime: compile}", "prune.runtime")):
        out = prune_in_process(*TINY_CPU, override, "prune.device=cpu", base=tmp_path)
        assert out.returncode == 2, out.stderr[-2000:]
        said = out.stdout + out.stderr
        assert message in said and "Traceback" not in said
        assert not (tmp_path / "outputs").exists() or not list((tmp_path / "outputs").rglob("*.safetensors"))
    from zoo.latency.__main__ import main

    assert main(["model=mobilenetv2_035", "runtime=tensorrt", "device=cpu", f"cache_dir={tmp_path}"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_prune_refuses_int8_where_it_has_no_int8_path(tmp_path):
    for override, message in (("prune.runtime=tensorrt", "prune.runtime=tensorrt_int8: runtime=tensorrt_int8 builds "
                                                          "TensorRT INT8 engines on a CUDA GPU (device is cpu)"),
                              ("prune.quantize=int4", "prune.quantize='int4'; allowed: null, int8")):
        out = prune_in_process(*TINY_CPU, "prune.quantize=int8", override, "prune.device=cpu", base=tmp_path)
        assert out.returncode == 2 and message in out.stdout + out.stderr, out.stderr[-2000:]
    out = prune_in_process(*TINY_CPU, "finetune.qat=true", "prune.device=cpu", base=tmp_path)
    said = out.stdout + out.stderr
    assert out.returncode == 2 and "finetune.qat=true" in said and "prune.quantize=int8" in said
    out = prune_in_process("model=retnet_tiny", "data=bytes", "prune.quantize=int8", base=tmp_path)
    assert out.returncode == 2 and "covers image classifiers" in out.stdout + out.stderr
