"""INT8 post-training quantisation of an ONNX model with onnxruntime: static, QDQ format, weights per output channel
(signed 8-bit), activations per tensor (unsigned 8-bit), ranges from calibration inputs (min/max), after
onnxruntime's pre-processing (shape inference, graph optimisation). What cannot be quantised stays float (an FP32
island: GroupNorm, for example).

Used by the ``onnxruntime_int8`` latency runtime (each table record quantised on its own inputs, for its timing) and
by :func:`zoo.export` with ``quantize="int8"`` (the network quantised on calibration batches, for its accuracy).
"""

from __future__ import annotations

import importlib.util
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from .errors import ZooError

QUANTIZE = ("int8",)
INSTALL = "pip install onnx onnxscript onnxruntime, or pip install -e \".[export]\""


class QuantizationError(ZooError):
    """A model that onnxruntime cannot quantise, missing calibration data, or missing packages."""


def check_quantization_available() -> None:
    """Raise :class:`QuantizationError` (with the install command) unless onnxruntime's quantiser is installed."""
    missing = [m for m in ("onnx", "onnxruntime") if importlib.util.find_spec(m) is None]
    if missing:
        raise QuantizationError(f"INT8 quantisation needs {', '.join(missing)}: {INSTALL}.")


def input_names(model: bytes) -> list[str]:
    """The graph inputs of a serialised ONNX model (its initializers excluded)."""
    import onnx

    proto = onnx.load_from_string(model)
    initializers = {i.name for i in proto.graph.initializer}
    return [i.name for i in proto.graph.input if i.name not in initializers]


def quantize_int8(model: bytes, calibration: Iterable[Sequence[Any]], what: str = "the model") -> bytes:
    """`model` (a serialised float32 ONNX model) quantised to INT8 QDQ on `calibration` (an iterable of input tuples,
    tensors or arrays in the graph's input order); returns the quantised model's bytes."""
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
            quantize_static(str(prepared), str(target), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
        except Exception as error:  # noqa: BLE001 - onnxruntime's own errors become one message naming the model
            first = str(error).splitlines()[0] if str(error) else ""
            raise QuantizationError(f"onnxruntime could not quantise {what} to INT8: {type(error).__name__}: "
                                    f"{first}") from error
        return target.read_bytes()


def _array(x: Any) -> Any:
    import numpy as np

    if hasattr(x, "detach"):
        return x.detach().cpu().contiguous().numpy()
    return np.asarray(x)


__all__ = ["QUANTIZE", "QuantizationError", "check_quantization_available", "input_names", "quantize_int8"]
