"""Export of any zoo model, pruned and merged or not, to ONNX or a ``torch.export`` program, with a parity check.

    report = zoo.export(model, "model.onnx")                      # ONNX, checked in onnxruntime
    report = zoo.export(model, "model.pt2", format="torch_export")  # torch.export.save, checked by running it
    report = zoo.export(retnet, "step.onnx", form="recurrent")    # RetNet's one-token step with its state
    report = zoo.export(retnet, "folder", format="hf")            # a flash-linear-attention model folder

``format="hf"`` writes a model's Hugging Face form (``model.hf_form()``: RetNet's is a flash-linear-attention
``RetNetForCausalLM``) as ``config.json`` + ``model.safetensors`` (+ the tokenizer, when given), which
``transformers.AutoModelForCausalLM.from_pretrained`` loads once ``fla`` is imported; the check loads it that way and
compares its logits. fla's kernels need a GPU (Triton): where they cannot run the report says "not checked" and why,
and ``passed`` is None (never True).

The batch axis is dynamic by default, as timm's exporter makes it (``dynamic_batch=False`` fixes it to the
example's); ``dynamic_size=True`` makes an image model's height and width dynamic too (other axes, such as a RetNet's
sequence length, stay those of the example). The exported program is run on the example input (the model's default
input size, or ``example=``) and, when an axis is dynamic, on a second input one sample larger (and 32 pixels
larger with ``dynamic_size``); its outputs are compared with the PyTorch model's each time: the report holds the
largest absolute and relative difference (relative to the largest PyTorch output) over both, the shapes checked,
the opset and the dynamic axes. An export whose difference exceeds ``rtol`` raises
:class:`~zoo.errors.ExportError` after writing the file (so it can be inspected).

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
import torch.nn.functional as F
from torch import nn

from ..errors import ExportError, first_line
from ..models.depth import run_example

FORMATS = ("onnx", "torch_export", "hf")
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
    passed: bool | None  # None: the export could not be run here (checked_with says why)
    seconds: float
    opset: int | None = None
    dynamic_axes: dict[str, dict[int, str]] | None = None  # input name -> {axis: name}
    checked_shapes: list[list[list[int]]] | None = None  # every input's shape, per parity check
    quantize: str | None = None  # "int8": checked by top1_agreement with the float model instead of rtol
    int8_scheme: str | None = None  # "int8" ONNX: whose QDQ form (zoo.deploy.quantization.INT8_SCHEMES)
    top1_agreement: float | None = None
    min_agreement: float | None = None
    calibration_batches: int | None = None
    float_size_bytes: int | None = None  # "int8": the float model's size (its ONNX file; for torch_export, its tensors)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def export(model: nn.Module, path: str | Path, format: str = "onnx", example: Any = None, batch_size: int = 1,
           input_size: Sequence[int] | None = None, form: str = "parallel", rtol: float = 1e-4,
           opset: int | None = None, dynamic_batch: bool = True, dynamic_size: bool = False,
           tokenizer: str | None = None, quantize: str | None = None, calibration: Sequence[Any] | None = None,
           min_agreement: float = 0.9, int8_scheme: str = "onnxruntime") -> ExportReport:
    """Write `model` (eval mode) to `path` as ONNX or a ``torch.export`` program and check it against PyTorch.

    example: the input (a tensor or a tuple); default the model's ``example_input(batch_size, input_size)`` (random
    values; token ids for a RetNet) or, for ``form="recurrent"``, a token, a position and random states. With a
    dynamic batch the program is traced at a batch of at least 2 (torch.export specialises a batch of 1).
    tokenizer: for ``format="hf"``, a tokenizer folder or hub name saved beside the weights. quantize: ``"int8"``
    writes the model quantised on `calibration` (input batches; default the example): as ONNX by onnxruntime
    (:func:`zoo.deploy.quantization.quantize_int8`, static QDQ; ``int8_scheme="tensorrt"`` writes TensorRT's symmetric
    form,
    which a TensorRT engine builds from), as a torch.export program by PT2E
    (:func:`zoo.deploy.quantization.quantize_pt2e`, for ``torch.compile``; needs torchao); its check is one suited to
    quantisation: the top-1 agreement of its outputs with the float model's on the calibration inputs (the check
    inputs without them; passed at `min_agreement` or more) and the largest logit difference there
    (``max_abs_diff``). rtol: the largest allowed difference relative to the largest output. Raises ExportError for
    an unknown format or form, a missing runtime (with the install command), an operator the exporter cannot handle
    (naming the model), or a difference beyond `rtol` (after writing the file).
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
    if quantize is None and int8_scheme != "onnxruntime":
        raise ExportError(f"int8_scheme={int8_scheme!r} is the form of an INT8 file; give quantize='int8' with it.")
    if quantize is not None and getattr(model, "task", "classification") == "language_model":
        raise ExportError(f"quantize={quantize!r} exports an image model quantised on calibration images; "
                          f"{type(model).__name__} is a language model, which decodes in INT8 with "
                          f"generate(..., quantize='int8'). Export it without quantize.")
    if quantize is not None:
        from .quantization import INT8_SCHEMES, QUANTIZE

        if quantize not in QUANTIZE or format not in ("onnx", "torch_export") or form != "parallel":
            raise ExportError(f"quantize={quantize!r} with format={format!r}, form={form!r}: quantised export is "
                              f"quantize='int8' of a model's forward (form='parallel') as ONNX (onnxruntime's static "
                              f"QDQ) or a torch.export program (PT2E, for torch.compile).")
        if int8_scheme not in INT8_SCHEMES or (format != "onnx" and int8_scheme != "onnxruntime"):
            raise ExportError(f"int8_scheme={int8_scheme!r} with format={format!r}: the scheme of an INT8 ONNX file is "
                              f"one of {', '.join(INT8_SCHEMES)} (a torch.export program has PT2E's own).")
    if format == "hf" and hasattr(model, "save_stock"):  # a transformers model: its stock folder
        return _export_stock(model, Path(path), tokenizer)
    if format == "hf":
        if not hasattr(model, "hf_form"):
            raise ExportError(f"format='hf' writes a model's Hugging Face form; {type(model).__name__} has none (a "
                              f"RetNet has: a flash-linear-attention model). Use format='onnx' or 'torch_export'.")
        was_training = model.training
        try:
            return _export_hf(model.eval(), Path(path), rtol, tokenizer)
        finally:
            model.train(was_training)
    if dynamic_size and getattr(model, "task", "classification") != "classification":
        raise ExportError(f"dynamic_size=True makes an image's height and width dynamic; {type(model).__name__} takes "
                          f"no images. Export with dynamic_size=False (its other axes are the example's).")
    if format == "torch_export" and Path(path).suffix != ".pt2":
        raise ExportError(f"A torch.export program is saved as a .pt2 file (torch.export.save's format); got {path}.")
    dtype = next(model.parameters()).dtype
    if format == "onnx" and dtype not in (torch.float32, torch.float64):
        raise ExportError(f"ONNX export is checked in onnxruntime, which has no {dtype} kernels for these models; "
                          f"export model.float() (or use format='torch_export').")
    if example is None and form == "parallel" and not hasattr(model, "example_input"):
        raise ExportError(f"zoo.export makes its example input from a zoo model's example_input(); "
                          f"{type(model).__name__} has none: pass example=... (a tensor or a tuple of the inputs).")
    if quantize is not None and calibration is not None:
        check_calibration(model, calibration, input_size)
    was_training = model.training
    try:
        axes = Axes(dynamic_batch, dynamic_size)
        if quantize is not None:
            return _export_int8(model.eval(), Path(path), format, example, batch_size, input_size, opset, axes,
                                calibration, min_agreement, int8_scheme)
        return _export(model.eval(), Path(path), format, example, batch_size, input_size, form, rtol, opset, axes)
    finally:
        model.train(was_training)  # the caller's model is left as it was


@dataclass(frozen=True)
class Axes:
    """Which axes of the exported program are dynamic: the batch (axis 0 of every batched input), and an image's
    height and width (axes 2 and 3)."""

    batch: bool = True
    size: bool = False

    def specs(self, inputs: tuple[Any, ...]) -> tuple[dict[int, Any] | None, ...] | None:
        """torch.export's ``dynamic_shapes``, one entry per input (None: all static)."""
        if not (self.batch or self.size):
            return None
        batch_dim = torch.export.Dim("batch", min=1, max=65536) if self.batch else None
        height, width = (torch.export.Dim("height", min=32, max=8192), torch.export.Dim("width", min=32, max=8192)) \
            if self.size else (None, None)
        batch = _batch_of(inputs)
        specs = []
        for t in inputs:
            axes: dict[int, Any] = {}
            if torch.is_tensor(t) and t.dim() and t.shape[0] == batch:
                if batch_dim is not None:
                    axes[0] = batch_dim
                if height is not None and t.dim() == 4:
                    axes[2], axes[3] = height, width
            specs.append(axes or None)
        return tuple(specs)

    def names(self, inputs: tuple[Any, ...], input_names: Sequence[str]) -> dict[str, dict[int, str]]:
        specs = self.specs(inputs) or ()
        return {name: {axis: dim.__name__ for axis, dim in spec.items()}
                for name, spec in zip(input_names, specs) if spec}

    def second(self, inputs: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """A second input for the parity check: one sample more (and 32 pixels more a side), or None when static."""
        if not (self.batch or self.size):
            return None
        batch = _batch_of(inputs)
        out = []
        for t in inputs:
            if torch.is_tensor(t) and t.dim() and t.shape[0] == batch:
                if self.batch:
                    t = torch.cat([t, t[:1]])
                if self.size and t.dim() == 4:
                    t = F.pad(t, (16, 16, 16, 16), mode="reflect")
            out.append(t)
        return tuple(out)


def _as_signature(program: nn.Module, specs: tuple[Any, ...] | None) -> tuple[Any, ...] | None:
    """`specs` grouped as torch.export matches them to ``forward``'s parameters: those of ``*args`` in one tuple."""
    import inspect

    if specs is None:
        return None
    kinds = [p.kind for p in inspect.signature(program.forward).parameters.values()]
    if inspect.Parameter.VAR_POSITIONAL in kinds:
        k = kinds.index(inspect.Parameter.VAR_POSITIONAL)
        return (*specs[:k], tuple(specs[k:]))
    return specs


def _batch_of(inputs: tuple[Any, ...]) -> int | None:
    first = next((t for t in inputs if torch.is_tensor(t) and t.dim()), None)
    return None if first is None else first.shape[0]


def _export(model: nn.Module, path: Path, format: str, example: Any, batch_size: int,
            input_size: Sequence[int] | None, form: str, rtol: float, opset: int | None, axes: Axes
            ) -> ExportReport:
    program = model.export_form(form) if hasattr(model, "export_form") else model  # a family's own forms
    traced_batch = max(batch_size, 2) if axes.batch else batch_size  # a batch of 1 would be specialised
    inputs = _inputs(model, program, example, traced_batch, input_size)
    checks = [inputs] + [x for x in [axes.second(inputs)] if x is not None]
    path.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    name = type(model).__name__
    with torch.no_grad():
        with _exact_matmuls():  # the references first, in full fp32 (TF32 would differ by ~1e-3 from any runtime),
            expected = [_flatten(program(*check)) for check in checks]  # before tracing fills any cache
        if format == "onnx":
            input_names = _export_onnx(program, inputs, path, opset, name, _as_signature(program, axes.specs(inputs)))
            outputs = [_run_onnx(path, check) for check in checks]
            got, runtime = [o for o, _ in outputs], outputs[0][1]
            opset = opset or _onnx_opset(path)
        else:
            input_names = [f"input_{i}" for i in range(len(inputs))]
            dynamic = _as_signature(program, axes.specs(inputs))
            torch.export.save(_torch_export(program, inputs, name, dynamic), str(path))
            loaded = torch.export.load(str(path)).module()
            with _exact_matmuls():
                got = [_flatten(loaded(*check)) for check in checks]
            runtime = "torch.export " + torch.__version__
    differences = [_differences(want, have) for want, have in zip(expected, got)]
    abs_diff, rel_diff = max(d[0] for d in differences), max(d[1] for d in differences)
    shapes = [[list(t.shape) for t in check if torch.is_tensor(t)] for check in checks]
    report = ExportReport(str(path), format, form, runtime, shapes[0], abs_diff, rel_diff, rtol, rel_diff <= rtol,
                          time.perf_counter() - start, opset, axes.names(inputs, input_names), shapes)
    if not report.passed:
        raise ExportError(f"The {format} export of {type(model).__name__} ({path}) differs from PyTorch by "
                          f"{rel_diff:.2e} relative ({abs_diff:.2e} absolute), beyond rtol={rtol:g}.")
    return report


def check_calibration(model: nn.Module, calibration: Any, input_size: Sequence[int] | None) -> None:
    """Calibration data for INT8: one or more input batches, each a tensor of the model's input shape (any batch
    size); anything else is an :class:`ExportError` naming what is allowed (never a silent fallback)."""
    expected = tuple(model.example_input(1, input_size).shape[1:]) if hasattr(model, "example_input") else None
    form = f"[B, {', '.join(map(str, expected))}]" if expected else "the model's input"
    if isinstance(calibration, (str, bytes, torch.Tensor)) or not hasattr(calibration, "__len__"):
        raise ExportError(f"calibration is a list of input batches, each a tensor {form}; got "
                          f"{type(calibration).__name__}.")
    if len(calibration) == 0:
        raise ExportError(f"calibration=[] holds no batch: INT8 ranges come from the data it is calibrated on. Give "
                          f"one or more input batches, each a tensor {form}, or leave calibration=None to calibrate on "
                          f"the example input.")
    for index, batch in enumerate(calibration):
        first = batch[0] if isinstance(batch, (tuple, list)) and batch else batch
        if not torch.is_tensor(first):
            raise ExportError(f"calibration batch {index} is a {type(first).__name__}; each batch is a tensor {form}.")
        if expected is not None and (first.dim() != len(expected) + 1 or tuple(first.shape[1:]) != expected):
            raise ExportError(f"calibration batch {index} has shape {tuple(first.shape)}; each batch is a tensor "
                              f"{form} (the input size being exported).")


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
        inputs = (torch.randn(base.shape, generator=generator).to(device=base.device, dtype=dtype),)
    else:
        inputs = (torch.randint(0, model.vocab_size, base.shape, generator=generator).to(base.device),)
    with torch.no_grad():
        run_example(model, inputs, input_size)  # an input size the model cannot take: one clear error, here
    return inputs


def _export_int8(model: nn.Module, path: Path, format: str, example: Any, batch_size: int,
                 input_size: Sequence[int] | None, opset: int | None, axes: Axes, calibration: Sequence[Any] | None,
                 min_agreement: float, scheme: str = "onnxruntime") -> ExportReport:
    """The model quantised to INT8 and written: the float ONNX export quantised in place by onnxruntime, or the PT2E
    program saved by torch.export; checked by top-1 agreement and the largest logit difference against the float
    model on the calibration inputs (else the check inputs)."""
    from .quantization import QuantizationError, quantize_int8, quantize_pt2e

    traced_batch = max(batch_size, 2) if axes.batch else batch_size
    inputs = _inputs(model, model, example, traced_batch, input_size)
    given = [tuple(c) if isinstance(c, (tuple, list)) else (c,) for c in calibration or []]
    checks = [inputs] + [x for x in [axes.second(inputs)] if x is not None]
    path.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    name = type(model).__name__
    from ..files import atomic_write

    with torch.no_grad():
        if format == "onnx":
            input_names = _export_onnx(model, inputs, path, opset, name, axes.specs(inputs))
            float_size = path.stat().st_size
            try:
                quantized = quantize_int8(path.read_bytes(), given or [inputs], name, scheme=scheme)
            except QuantizationError as error:
                raise ExportError(str(error)) from error
            atomic_write(path, lambda tmp: tmp.write_bytes(quantized))

            def run(check: tuple[Any, ...]) -> tuple[list[torch.Tensor], str]:
                return _run_onnx(path, check, qdq_in_float=scheme == "tensorrt")
        else:
            input_names = [f"input_{i}" for i in range(len(inputs))]
            float_size = sum(t.numel() * t.element_size() for t in model.state_dict().values())
            try:
                quantized = quantize_pt2e(model, inputs, given or [inputs], name, axes.specs(inputs))
            except QuantizationError as error:
                raise ExportError(str(error)) from error
            program = _torch_export(quantized, inputs, name, axes.specs(inputs))
            buffer = io.BytesIO()  # (torch.export.save wants a .pt2 name; the temporary file has another)
            torch.export.save(program, buffer)
            atomic_write(path, lambda tmp: tmp.write_bytes(buffer.getvalue()))
            loaded = torch.export.load(str(path)).module()

            def run(check: tuple[Any, ...]) -> tuple[list[torch.Tensor], str]:
                return _flatten(loaded(*check)), f"torch.export {torch.__version__} (PT2E, eager)"
        agree = total = 0
        abs_diff = 0.0
        for check in given or checks:  # agreement on the calibration data (else the check inputs)
            want = _flatten(model(*check))[0].float()
            have, runtime = run(check)
            have = have[0].float()
            agree += int((want.argmax(-1) == have.argmax(-1)).sum())
            total += want.argmax(-1).numel()
            abs_diff = max(abs_diff, (want - have).abs().max().item())
    agreement = agree / max(total, 1)
    shapes = [[list(t.shape) for t in check if torch.is_tensor(t)] for check in checks]
    report = ExportReport(str(path), format, "parallel", runtime, shapes[0], abs_diff, math.nan, math.nan,
                          agreement >= min_agreement, time.perf_counter() - start,
                          (opset or _onnx_opset(path)) if format == "onnx" else None,
                          axes.names(inputs, input_names), shapes, quantize="int8", top1_agreement=agreement,
                          min_agreement=min_agreement, calibration_batches=len(given) or 1,
                          float_size_bytes=float_size, int8_scheme=scheme if format == "onnx" else None)
    if not report.passed:
        raise ExportError(f"The INT8 export of {name} ({path}) agrees with the float model on {agreement:.1%} of "
                          f"top-1 predictions, below min_agreement={min_agreement:.0%} (largest logit difference "
                          f"{abs_diff:.3g}).")
    return report


def _export_hf(model: nn.Module, folder: Path, rtol: float, tokenizer: str | None) -> ExportReport:
    """config.json + model.safetensors (+ tokenizer files) in `folder`, then the folder loaded as transformers loads
    it and its logits compared with the model's, where fla can run."""
    from safetensors.torch import save_file

    from ..files import atomic_write, write_json

    config, state = model.hf_form()
    start = time.perf_counter()
    atomic_write(folder / "model.safetensors", lambda tmp: save_file(state, str(tmp), metadata={"format": "pt"}))
    write_json(folder / "config.json", config)
    if tokenizer is not None:
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(tokenizer).save_pretrained(str(folder))
    tokens = torch.randint(0, model.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), _exact_matmuls():
        expected = [model(tokens.to(model.embed.weight.device)).float().cpu()]
    try:
        got, checked_with = [hf_logits(folder, tokens)], f"transformers {_version('transformers')} + fla " \
                                                          f"{_version('flash-linear-attention')}"
        abs_diff, rel_diff = _differences(expected, got)
        passed: bool | None = rel_diff <= rtol
    except Exception as error:  # noqa: BLE001 - fla's kernels (Triton) or transformers missing: say so, not passed
        checked_with = f"not checked: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        abs_diff = rel_diff = math.nan
        passed = None
    report = ExportReport(str(folder), "hf", "parallel", checked_with, [list(tokens.shape)], abs_diff, rel_diff, rtol,
                          passed, time.perf_counter() - start, checked_shapes=[[list(tokens.shape)]])
    if passed is False:
        raise ExportError(f"The Hugging Face form of {type(model).__name__} ({folder}) differs from PyTorch by "
                          f"{rel_diff:.2e} relative ({abs_diff:.2e} absolute), beyond rtol={rtol:g}.")
    return report


def _export_stock(model: nn.Module, folder: Path, tokenizer: str | None) -> ExportReport:
    """A transformers model's stock folder (``model.save_stock``: its removed layers cut as its config says it,
    kept only if ``AutoModelForCausalLM`` reloads it with logits equal to the model's) with `tokenizer`'s files."""
    from ..errors import ZooError
    from ..models.hf_causal import SAVE_TOLERANCE

    start = time.perf_counter()
    tok = None
    if tokenizer is not None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tokenizer)
    try:
        _, error = model.save_stock(folder, tok)
    except ZooError as error:
        raise ExportError(f"The stock folder of {type(model).__name__} ({folder}) was not written: {error}.") from None
    checked = f"transformers {_version('transformers')} AutoModelForCausalLM (no custom code)"
    return ExportReport(str(folder), "hf", "parallel", checked, [[2, 16]], math.nan, error, SAVE_TOLERANCE,
                        error <= SAVE_TOLERANCE, time.perf_counter() - start, checked_shapes=[[[2, 16]]])


def hf_logits(folder: str | Path, tokens: torch.Tensor) -> torch.Tensor:
    """Logits of a Hugging Face model folder on `tokens`, loaded by ``AutoModelForCausalLM`` (fla registers its
    models with transformers when imported), in fp32 on the CPU."""
    import fla  # noqa: F401 - registers flash-linear-attention's models with transformers' Auto classes
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    with torch.no_grad():
        return model(tokens).logits.float()


def _export_onnx(program: nn.Module, inputs: tuple[Any, ...], path: Path, opset: int | None, name: str,
                 dynamic_shapes: Any) -> list[str]:
    """torch.onnx's exporter (torch.export based), its chatter kept off the terminal unless it fails; returns the
    graph's input names."""
    log = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            warnings.simplefilter("ignore")
            torch.onnx.export(program, inputs, str(path), dynamo=True, opset_version=opset, external_data=False,
                              verbose=False, dynamic_shapes=dynamic_shapes)
    except Exception as error:  # noqa: BLE001 - any exporter failure becomes one message naming the model
        kept = ""
        if log.getvalue().strip():  # what the exporter printed: kept beside the file, not on the terminal
            from ..files import atomic_write

            saved = path.with_name(path.name + ".export.log")
            atomic_write(saved, lambda tmp: tmp.write_text(log.getvalue()))
            kept = f" (the exporter's output: {saved})"
        raise ExportError(f"{name} could not be exported to ONNX: {type(error).__name__}: "
                          f"{first_line(error)}{kept}") from error
    import onnx

    return [i.name for i in onnx.load(str(path), load_external_data=False).graph.input]


def _onnx_opset(path: Path) -> int | None:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)


def _torch_export(program: nn.Module, inputs: tuple[Any, ...], name: str, dynamic_shapes: Any) -> Any:
    try:
        return torch.export.export(program, inputs, dynamic_shapes=dynamic_shapes)
    except Exception as error:  # noqa: BLE001
        raise ExportError(f"{name} could not be exported with torch.export: {type(error).__name__}: "
                          f"{str(error).splitlines()[0] if str(error) else ''}") from error


def _run_onnx(path: Path, inputs: tuple[Any, ...], qdq_in_float: bool = False) -> tuple[list[torch.Tensor], str]:
    """Outputs of the ONNX file in an onnxruntime session (CUDA when the inputs are and it is available), and the
    runtime that ran it. `qdq_in_float`: an INT8 file's Q/DQ pairs computed as such, not fused into onnxruntime's
    int8 kernels (a TensorRT-form file, checked with TensorRT's arithmetic)."""
    cuda = any(torch.is_tensor(t) and t.is_cuda for t in inputs)
    try:
        session = onnx_session(path, cuda=cuda, qdq_in_float=qdq_in_float)
        feed = {arg.name: torch.as_tensor(t).detach().cpu().numpy() for arg, t in zip(session.get_inputs(), inputs)}
        outputs = [torch.from_numpy(out) for out in session.run(None, feed)]
    except Exception as error:  # noqa: BLE001 - onnxruntime's own errors, named as one
        raise ExportError(f"onnxruntime could not run {path}: {type(error).__name__}: {error}") from error
    how = f"{session.get_providers()[0]}, Q/DQ in float" if qdq_in_float else session.get_providers()[0]
    return outputs, f"onnxruntime {_version('onnxruntime')} ({how})"


def onnx_session(path: str | Path, threads: int | None = None, cuda: bool = False, qdq_in_float: bool = False) -> Any:
    """An onnxruntime session of the ONNX file: CUDA when asked for and available, else the CPU (`threads` intra-op
    threads; None: onnxruntime's default). `qdq_in_float`: Q/DQ pairs computed, not fused into int8 kernels
    (:data:`zoo.deploy.quantization.QDQ_IN_FLOAT`)."""
    import onnxruntime as ort

    from .quantization import QDQ_IN_FLOAT

    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
    for key, value in (QDQ_IN_FLOAT if qdq_in_float else {}).items():
        options.add_session_config_entry(key, value)
    providers = ["CUDAExecutionProvider"] if cuda and "CUDAExecutionProvider" in ort.get_available_providers() \
        else []
    return ort.InferenceSession(str(path), options, providers=[*providers, "CPUExecutionProvider"])


class OnnxModule(nn.Module):
    """An ONNX image model run in onnxruntime on the CPU, called like the network it was exported from (for
    :func:`zoo.training.evaluate`)."""

    def __init__(self, path: str | Path, threads: int = 1):
        super().__init__()
        self.session = onnx_session(path, threads)
        self.input_name = self.session.get_inputs()[0].name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.session.run(None, {self.input_name: x.detach().cpu().contiguous().numpy()})[0])


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
