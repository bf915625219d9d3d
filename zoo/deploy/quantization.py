"""INT8, declared once. Post-training quantisation of an ONNX model with onnxruntime: static, QDQ format, weights per
output channel (signed 8-bit, symmetric), activations per tensor, ranges from calibration inputs (min/max), after
onnxruntime's pre-processing (shape inference, graph optimisation). What cannot be quantised stays float (an FP32
island: GroupNorm, for example). Activations are unsigned 8-bit for onnxruntime on the CPU, and signed symmetric 8-bit
for TensorRT (``scheme="tensorrt"``: its explicit quantisation takes Q/DQ pairs with zero points 0 only).

On an x86 CPU without VNNI (AVX2 only), the u8s8 kernels of onnxruntime and oneDNN add pairs of products in 16 bits
(``vpmaddubsw``), which saturates with full-range weights; there, as both libraries advise, the CPU schemes quantise
with ``reduce_range`` (:func:`saturating_cpu`): 7-bit weights in onnxruntime's scheme (-64..64), 7-bit activations in
PT2E's (0..127). TensorRT's scheme is for the GPU and keeps full range; on the CPU, :data:`QDQ_IN_FLOAT` runs its file
as TensorRT computes it (each Q/DQ pair rounded, the layers in float), not through those kernels.

Used by the ``onnxruntime_int8`` and ``tensorrt_int8`` latency runtimes (each table record quantised on its own
inputs, for its timing) and by :func:`zoo.export` with ``quantize="int8"`` (the network quantised on calibration
batches, for its accuracy).

With ``torch.compile`` instead: :func:`quantize_pt2e`, torchao's PT2E flow with the X86InductorQuantizer (per-channel
int8 weights, uint8 activations; ranges from a histogram observer), for the ``compile_int8`` runtime and
``zoo.export(format="torch_export", quantize="int8")``.

Quantisation-aware training (:func:`prepare_qat`, :func:`strip_qat`) simulates the same scheme in PyTorch with
``torch.ao.quantization.FakeQuantize``: each Conv2d/Linear weight rounded per output channel to signed 8-bit
(symmetric, -127..127, the range onnxruntime gives symmetric int8 weights; -64..64 where it reduces the range), each
Conv2d/Linear input rounded per tensor to unsigned 8-bit (min/max ranges, moving average; signed and symmetric,
-127..127, in TensorRT's scheme). Trained on the deploy form (BatchNorm folded), so the weights it rounds are the
weights onnxruntime quantises afterwards.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import platform
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import ZooError

QUANTIZE = ("int8",)
INT8_SCHEMES = {  # who runs the QDQ model -> how onnxruntime's quantize_static writes it (activation QuantType,
    # extra_options); weights are signed, symmetric, per output channel in both
    # onnxruntime: activations unsigned 8-bit with zero points (onnxruntime's fastest CPU kernels, u8s8)
    "onnxruntime": ("QUInt8", {"WeightSymmetric": True}),
    # tensorrt: activations signed 8-bit, symmetric (zero points 0), biases left float: TensorRT's explicit
    # quantisation takes only this (its DequantizeLinear reads no int32 bias)
    "tensorrt": ("QInt8", {"WeightSymmetric": True, "ActivationSymmetric": True, "QuantizeBias": False}),
}
INSTALL = "pip install onnx onnxscript onnxruntime, or pip install -e \".[export]\""
VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")  # /proc/cpuinfo flags of x86 CPUs whose int8 dot products
# accumulate in 32 bits
QDQ_IN_FLOAT = {"session.disable_quant_qdq": "1"}  # onnxruntime session config: Q/DQ pairs computed, not fused into
# its int8 kernels (the arithmetic of a runtime that does not saturate, as TensorRT's)


class QuantizationError(ZooError):
    """A model that onnxruntime cannot quantise, missing calibration data, or missing packages."""


def check_quantization_available() -> None:
    """Raise :class:`QuantizationError` (with the install command) unless onnxruntime's quantiser is installed."""
    missing = [m for m in ("onnx", "onnxruntime") if importlib.util.find_spec(m) is None]
    if missing:
        raise QuantizationError(f"INT8 quantisation needs {', '.join(missing)}: {INSTALL}.")


@functools.cache
def saturating_cpu() -> bool:
    """Whether this is an x86 CPU without VNNI (its u8s8 int8 kernels saturate 16-bit pair sums), read from
    /proc/cpuinfo's flags; an x86 CPU whose flags cannot be read counts as one (reduced range is exact anywhere)."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        return False
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return True
    return not any(flag in flags for flag in VNNI_FLAGS)


def reduce_range(scheme: str) -> bool:
    """Whether `scheme`'s INT8 files are written with 7-bit ranges here: the CPU schemes on a saturating CPU."""
    return scheme == "onnxruntime" and saturating_cpu()


def input_names(model: bytes) -> list[str]:
    """The graph inputs of a serialised ONNX model (its initializers excluded)."""
    import onnx

    proto = onnx.load_from_string(model)
    initializers = {i.name for i in proto.graph.initializer}
    return [i.name for i in proto.graph.input if i.name not in initializers]


def quantize_int8(model: bytes, calibration: Iterable[Sequence[Any]], what: str = "the model",
                  scheme: str = "onnxruntime") -> bytes:
    """`model` (a serialised float32 ONNX model) quantised to INT8 QDQ on `calibration` (an iterable of input tuples,
    tensors or arrays in the graph's input order); returns the quantised model's bytes. `scheme`: the runtime the
    file is for (:data:`INT8_SCHEMES`); weights are per output channel, signed and symmetric in both."""
    if scheme not in INT8_SCHEMES:
        raise QuantizationError(f"Unknown INT8 scheme {scheme!r}; allowed: {', '.join(INT8_SCHEMES)}.")
    check_quantization_available()
    import onnxruntime

    onnxruntime.set_default_logger_severity(3)  # its notes on removed initializers are not the user's business
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    names = input_names(model)
    feeds = [{n: _array(x) for n, x in zip(names, inputs)} for inputs in calibration]
    if not feeds:
        raise QuantizationError(f"INT8 quantisation of {what} needs calibration inputs; none were given.")

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter(feeds)

        def get_next(self) -> dict[str, Any] | None:
            return next(self.feeds, None)

    with tempfile.TemporaryDirectory(prefix="zoo-int8-") as tmp:
        source, prepared, target = (Path(tmp) / name for name in ("fp32.onnx", "pre.onnx", "int8.onnx"))
        source.write_bytes(model)
        try:
            quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True)
            float_nodes = float_islands(prepared)
            activations, options = INT8_SCHEMES[scheme]
            quantize_static(str(prepared), str(target), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                            activation_type=QuantType[activations], weight_type=QuantType.QInt8,
                            nodes_to_exclude=float_nodes, extra_options=options,
                            reduce_range=reduce_range(scheme))
        except Exception as error:  # noqa: BLE001 - onnxruntime's own errors become one message naming the model
            first = str(error).splitlines()[0] if str(error) else ""
            raise QuantizationError(f"onnxruntime could not quantise {what} to INT8: {type(error).__name__}: "
                                    f"{first}") from error
        return target.read_bytes()


NORMALIZATIONS = ("InstanceNormalization", "GroupNormalization", "LayerNormalization")


def float_islands(path: Path) -> list[str]:
    """The nodes of the ONNX file at `path` that onnxruntime's quantiser keeps float: normalisations (GroupNorm
    exports as InstanceNormalization, then its affine) and every Mul/Add that reads a float constant (a
    normalisation's affine, a scale). INT8 would not speed them up, and the quantiser would round their constants as
    weights (and refuses one the exporter shares between readers, as it does the equal affines of fresh GroupNorms).
    """
    import onnx

    graph = onnx.load(str(path)).graph
    constants = {i.name for i in graph.initializer if i.data_type == onnx.TensorProto.FLOAT}
    return [node.name for node in graph.node if node.op_type in NORMALIZATIONS
            or (node.op_type in ("Mul", "Add") and any(i in constants for i in node.input))]


WEIGHT_RANGES = {False: (-127, 127), True: (-64, 64)}  # signed, symmetric: onnxruntime's range for int8 weights
# (by reduce_range: 8 or 7 bits)
ACTIVATION_RANGES = {  # per scheme: (qmin, qmax, dtype, qscheme) of onnxruntime's activation quantisation
    "onnxruntime": (0, 255, torch.quint8, torch.per_tensor_affine),  # QuantType.QUInt8, min/max
    "tensorrt": (-127, 127, torch.qint8, torch.per_tensor_symmetric),  # QInt8 with ActivationSymmetric: max|x| / 127
}
QAT_LAYERS = (nn.Conv2d, nn.Linear)  # the layers onnxruntime's QDQ quantises (weights and inputs)


def prepare_qat(model: nn.Module, scheme: str = "onnxruntime") -> nn.Module:
    """Make `model` (in place) simulate :func:`quantize_int8` in `scheme` while it trains: every Conv2d/Linear weight
    and input fake-quantised (straight-through gradients). Input ranges are observed only in training mode. Returns
    `model`."""
    from torch.ao.quantization import FakeQuantize, MovingAverageMinMaxObserver, MovingAveragePerChannelMinMaxObserver
    from torch.nn.utils import parametrize

    if scheme not in ACTIVATION_RANGES:
        raise QuantizationError(f"Unknown INT8 scheme {scheme!r}; allowed: {', '.join(ACTIVATION_RANGES)}.")
    layers = [m for m in model.modules() if isinstance(m, QAT_LAYERS)]
    if not layers:
        raise QuantizationError(f"{type(model).__name__} has no Conv2d or Linear layer to train for INT8.")
    for layer in layers:
        if parametrize.is_parametrized(layer, "weight"):
            raise QuantizationError(f"{type(model).__name__} is already prepared for quantisation-aware training.")
        weight_min, weight_max = WEIGHT_RANGES[reduce_range(scheme)]
        weight_quant = FakeQuantize(observer=MovingAveragePerChannelMinMaxObserver, averaging_constant=1.0,
                                    quant_min=weight_min, quant_max=weight_max, dtype=torch.qint8,
                                    qscheme=torch.per_channel_symmetric, ch_axis=0)
        parametrize.register_parametrization(layer, "weight", weight_quant)
        qmin, qmax, dtype, qscheme = ACTIVATION_RANGES[scheme]
        layer.input_quant = FakeQuantize(observer=MovingAverageMinMaxObserver, quant_min=qmin, quant_max=qmax,
                                         dtype=dtype, qscheme=qscheme)
        layer.register_forward_pre_hook(_quantise_input)
    return model


def _quantise_input(layer: nn.Module, args: tuple) -> tuple:
    layer.input_quant.observer_enabled.fill_(int(layer.training))
    return (layer.input_quant(args[0]), *args[1:])


def strip_qat(model: nn.Module) -> nn.Module:
    """Undo :func:`prepare_qat` in place: the float weights QAT trained, plain layers again (for export, where
    onnxruntime quantises them). Returns `model`."""
    from torch.nn.utils import parametrize

    for layer in model.modules():
        if isinstance(layer, QAT_LAYERS) and parametrize.is_parametrized(layer, "weight"):
            parametrize.remove_parametrizations(layer, "weight", leave_parametrized=False)
            del layer.input_quant
            for key, hook in list(layer._forward_pre_hooks.items()):
                if hook is _quantise_input:
                    del layer._forward_pre_hooks[key]
    return model


PT2E_INSTALL = "pip install torchao, or pip install -e \".[int8]\""


def check_pt2e_available() -> None:
    """Raise :class:`QuantizationError` (with the install command) unless torchao's PT2E quantisation is installed."""
    if importlib.util.find_spec("torchao") is None:
        raise QuantizationError(f"INT8 with torch.compile (PT2E, X86InductorQuantizer) needs torchao: {PT2E_INSTALL}.")


def quantize_pt2e(module: nn.Module, inputs: Sequence[Any], calibration: Iterable[Sequence[Any]],
                  what: str = "the model", dynamic_shapes: Any = None) -> nn.Module:
    """`module` (a function of tensors, eval) exported with ``torch.export`` on `inputs` and quantised by torchao's
    PT2E flow for inductor (``X86InductorQuantizer``'s default: static, per-channel signed 8-bit weights, unsigned
    8-bit activations (7-bit on a :func:`saturating_cpu`), ranges observed on `calibration`, an iterable of input
    tuples). Returns the converted program (Q/DQ ops around float ops), which ``torch.compile`` lowers to INT8
    kernels and which runs eagerly with
    the same rounding. Sizes stay those of `inputs` except the axes ``dynamic_shapes`` (torch.export's) names.
    Activation ranges: the quantizer's default observer (a histogram); weights: per output channel, symmetric."""
    check_pt2e_available()
    import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as x86
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    feeds = [tuple(c) for c in calibration]
    if not feeds:
        raise QuantizationError(f"INT8 quantisation of {what} needs calibration inputs; none were given.")
    try:
        with torch.inference_mode(False), torch.no_grad():  # (inference tensors cannot be traced: cloned here)
            module = _without_inference_tensors(module)
            inputs = tuple(t.clone() if torch.is_tensor(t) else t for t in inputs)
            feeds = [tuple(t.clone() if torch.is_tensor(t) else t for t in feed) for feed in feeds]
            program = torch.export.export(module, inputs, dynamic_shapes=dynamic_shapes).module()
            quantizer = x86.X86InductorQuantizer()
            quantizer.set_global(x86.get_default_x86_inductor_quantization_config(reduce_range=saturating_cpu()))
            prepared = prepare_pt2e(program, quantizer)
            for feed in feeds:
                prepared(*feed)
            return _drop_unused_tensors(convert_pt2e(prepared))
    except Exception as error:  # noqa: BLE001 - torch.export's and torchao's errors become one message
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise QuantizationError(f"PT2E could not quantise {what} to INT8: {type(error).__name__}: {first}") from error


def _without_inference_tensors(module: nn.Module) -> nn.Module:
    """`module`, or a copy of it whose weights made in inference mode (a network copied while timing) are normal
    tensors again, which PT2E's passes can take."""
    if not any(t.is_inference() for t in [*module.parameters(), *module.buffers()]):
        return module
    module = copy.deepcopy(module)
    for sub in module.modules():
        for name, param in sub._parameters.items():
            if param is not None and param.is_inference():
                sub._parameters[name] = nn.Parameter(param.clone(), requires_grad=False)
        for name, buffer in sub._buffers.items():
            if buffer is not None and buffer.is_inference():
                sub._buffers[name] = buffer.clone()
    return module


def _drop_unused_tensors(program: Any) -> Any:
    """The converted program without the float weights it no longer reads (their INT8 copies replaced them), so
    that a program exported from it does not carry both."""
    used = {node.target for node in program.graph.nodes if node.op == "get_attr"}
    for name, _ in [*program.named_parameters(), *program.named_buffers()]:
        if name not in used:
            owner, _, attribute = name.rpartition(".")
            delattr(program.get_submodule(owner) if owner else program, attribute)
    return program


def _array(x: Any) -> Any:
    import numpy as np

    if hasattr(x, "detach"):
        return x.detach().cpu().contiguous().numpy()
    return np.asarray(x)


__all__ = ["INT8_SCHEMES", "QDQ_IN_FLOAT", "QUANTIZE", "QuantizationError", "check_pt2e_available",
           "check_quantization_available", "input_names", "prepare_qat", "quantize_int8", "quantize_pt2e",
           "reduce_range", "saturating_cpu", "strip_qat"]
