"""Export of any zoo model, pruned and merged or not, to ONNX or a ``torch.export`` program, with a parity check.

    report = zoo.export(model, "model.onnx")                      # ONNX, checked in onnxruntime
    report = zoo.export(model, "model.pt2", format="torch_export")  # torch.export.save, checked by running it
    report = zoo.export(retnet, "step.onnx", form="recurrent")    # RetNet's one-token step with its state

The exported program is run on the example input (the model's default input size, or ``example=``) and its
outputs are compared with the PyTorch model's: the report holds the largest absolute and relative difference
(relative to the largest PyTorch output), and an export whose difference exceeds ``rtol`` raises
:class:`~zoo.errors.ExportError` after writing the file (so it can be inspected). Shapes are static: the batch and
input size of the example (a RetNet's sequence length too); export again for another shape.

RetNet forms: ``parallel`` (token ids [B, T] -> logits [B, T, vocab]) and ``recurrent`` (the decode step: token
ids [B, 1], the position as a float64 scalar and one state per retention sub-layer -> logits [B, vocab] and the
new states), the arithmetic of :meth:`zoo.models.retnet.MultiScaleRetention.step`.
"""

from __future__ import annotations

import contextlib
import io
import math
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .errors import ExportError

FORMATS = ("onnx", "torch_export")
FORMS = ("parallel", "recurrent")


@dataclass
class ExportReport:
    """What :func:`export` wrote and how closely the exported program reproduces the model."""

    path: str
    format: str
    form: str
    checked_with: str
    input_shapes: list[list[int]]
    max_abs_diff: float
    max_rel_diff: float
    rtol: float
    passed: bool
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def export(model: nn.Module, path: str | Path, format: str = "onnx", example: Any = None, batch_size: int = 1,
           input_size: Sequence[int] | None = None, form: str = "parallel", rtol: float = 1e-4,
           opset: int | None = None) -> ExportReport:
    """Write `model` (eval mode) to `path` as ONNX or a ``torch.export`` program and check it against PyTorch.

    example: the input (a tensor or a tuple); default the model's ``example_input(batch_size, input_size)`` (random
    values; token ids for a RetNet) or, for ``form="recurrent"``, a token, a position and random states. rtol: the
    largest allowed difference relative to the largest output. Raises ExportError for an unknown format or form, a
    missing runtime (with the install command), an operator the exporter cannot handle (naming the model), or a
    difference beyond `rtol` (after writing the file).
    """
    if format not in FORMATS:
        raise ExportError(f"Unknown export format {format!r}; allowed are {', '.join(FORMATS)}.")
    if form not in FORMS:
        raise ExportError(f"Unknown form {form!r}; allowed are {', '.join(FORMS)} (recurrent: RetNet only).")
    recurrent_model = getattr(model, "recurrent", False)
    if form == "recurrent" and not recurrent_model:
        raise ExportError(f"form='recurrent' is the decode step of a recurrent model; {type(model).__name__} has "
                          f"none. Use form='parallel'.")
    if format == "onnx":
        _require("onnx", "onnxscript", "onnxruntime")
    if format == "torch_export" and Path(path).suffix != ".pt2":
        raise ExportError(f"A torch.export program is saved as a .pt2 file (torch.export.save's format); got {path}.")
    dtype = next(model.parameters()).dtype
    if format == "onnx" and dtype not in (torch.float32, torch.float64):
        raise ExportError(f"ONNX export is checked in onnxruntime, which has no {dtype} kernels for these models; "
                          f"export model.float() (or use format='torch_export').")
    was_training = model.training
    try:
        return _export(model.eval(), Path(path), format, example, batch_size, input_size, form, rtol, opset)
    finally:
        model.train(was_training)  # the caller's model is left as it was


def _export(model: nn.Module, path: Path, format: str, example: Any, batch_size: int,
            input_size: Sequence[int] | None, form: str, rtol: float, opset: int | None) -> ExportReport:
    program = model.export_form(form) if hasattr(model, "export_form") else model  # a family's own forms
    inputs = _inputs(model, program, example, batch_size, input_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with torch.no_grad():
        with _exact_matmuls():  # the reference in full fp32 (TF32 would differ by ~1e-3 from any runtime)
            expected = _flatten(program(*inputs))
        if format == "onnx":
            _export_onnx(program, inputs, path, opset, type(model).__name__)
            got, runtime = _run_onnx(path, inputs)
        else:
            program_ep = _torch_export(program, inputs, type(model).__name__)
            torch.export.save(program_ep, str(path))
            with _exact_matmuls():
                got = _flatten(torch.export.load(str(path)).module()(*inputs))
            runtime = "torch.export " + torch.__version__
    abs_diff, rel_diff = _differences(expected, got)
    report = ExportReport(str(path), format, form, runtime, [list(t.shape) for t in inputs if torch.is_tensor(t)],
                          abs_diff, rel_diff, rtol, rel_diff <= rtol, time.perf_counter() - start)
    if not report.passed:
        raise ExportError(f"The {format} export of {type(model).__name__} ({path}) differs from PyTorch by "
                          f"{rel_diff:.2e} relative ({abs_diff:.2e} absolute), beyond rtol={rtol:g}.")
    return report


def _inputs(model: nn.Module, program: nn.Module, example: Any, batch_size: int,
            input_size: Sequence[int] | None) -> tuple[Any, ...]:
    if example is not None:
        return tuple(example) if isinstance(example, (tuple, list)) else (example,)
    if hasattr(program, "example"):  # a form with inputs of its own (RetNet's decode step: token, position, states)
        return program.example(batch_size)
    base = model.example_input(batch_size, input_size)
    generator = torch.Generator().manual_seed(0)
    if base.dtype.is_floating_point:
        dtype = next(model.parameters()).dtype
        return (torch.randn(base.shape, generator=generator).to(device=base.device, dtype=dtype),)
    return (torch.randint(0, model.vocab_size, base.shape, generator=generator).to(base.device),)


def _export_onnx(program: nn.Module, inputs: tuple[Any, ...], path: Path, opset: int | None, name: str) -> None:
    """torch.onnx's exporter (torch.export based), its chatter kept off the terminal unless it fails."""
    log = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(log):
            warnings.simplefilter("ignore")
            torch.onnx.export(program, inputs, str(path), dynamo=True, opset_version=opset, external_data=False,
                              verbose=False)
    except Exception as error:  # noqa: BLE001 - any exporter failure becomes one message naming the model
        raise ExportError(f"{name} could not be exported to ONNX: {type(error).__name__}: "
                          f"{str(error).splitlines()[0] if str(error) else ''}") from error


def _torch_export(program: nn.Module, inputs: tuple[Any, ...], name: str) -> Any:
    try:
        return torch.export.export(program, inputs)
    except Exception as error:  # noqa: BLE001
        raise ExportError(f"{name} could not be exported with torch.export: {type(error).__name__}: "
                          f"{str(error).splitlines()[0] if str(error) else ''}") from error


def _run_onnx(path: Path, inputs: tuple[Any, ...]) -> tuple[list[torch.Tensor], str]:
    """Outputs of the ONNX file in an onnxruntime session (CUDA when the inputs are and it is available), and the
    runtime that ran it."""
    import onnxruntime as ort

    cuda = any(torch.is_tensor(t) and t.is_cuda for t in inputs)
    providers = ["CUDAExecutionProvider"] if cuda and "CUDAExecutionProvider" in ort.get_available_providers() \
        else []
    try:
        session = ort.InferenceSession(str(path), providers=[*providers, "CPUExecutionProvider"])
        feed = {arg.name: torch.as_tensor(t).detach().cpu().numpy() for arg, t in zip(session.get_inputs(), inputs)}
        outputs = [torch.from_numpy(out) for out in session.run(None, feed)]
    except Exception as error:  # noqa: BLE001 - onnxruntime's own errors, named as one
        raise ExportError(f"onnxruntime could not run {path}: {type(error).__name__}: {error}") from error
    return outputs, f"onnxruntime {_version('onnxruntime')} ({session.get_providers()[0]})"


@contextlib.contextmanager
def _exact_matmuls() -> Any:
    """TF32 off for CUDA matmuls and convolutions while computing a reference."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def _flatten(outputs: Any) -> list[torch.Tensor]:
    if torch.is_tensor(outputs):
        return [outputs]
    return [t for item in outputs for t in _flatten(item)]


def _differences(expected: list[torch.Tensor], got: list[torch.Tensor]) -> tuple[float, float]:
    if len(expected) != len(got):
        raise ExportError(f"The exported program returns {len(got)} outputs, the model {len(expected)}.")
    abs_diff, rel_diff = 0.0, 0.0
    for want, have in zip(expected, got):
        want, have = want.detach().double().cpu(), have.detach().double().cpu()
        if want.shape != have.shape:
            raise ExportError(f"An exported output has shape {tuple(have.shape)}, the model's {tuple(want.shape)}.")
        if not want.isfinite().all():
            raise ExportError("The model's own outputs on the example are not finite (NaN or inf): there is nothing "
                              "to compare the export with.")
        if not have.isfinite().all():
            return math.inf, math.inf  # NaN or inf where the model has numbers: no parity
        if want.numel():
            diff = (want - have).abs().max().item()
            abs_diff = max(abs_diff, diff)
            rel_diff = max(rel_diff, diff / max(want.abs().max().item(), 1e-12))
    return abs_diff, rel_diff


def _require(*modules: str) -> None:
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ExportError(f"ONNX export needs {', '.join(missing)}: pip install {' '.join(missing)} (or "
                          f"pip install -e \".[export]\").")


def _version(module: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(module)
    except importlib.metadata.PackageNotFoundError:
        return "?"
