"""Deploy runtimes: a module made into the callable a runtime runs, for table records and whole networks alike.

* ``eager``: the module as it is (PyTorch eager).
* ``compile``: ``torch.compile`` (inductor, static shapes, one graph: a graph break is an error; weights frozen as
  constants, inductor's inference setting, which lets it pre-pack convolution weights). Each module gets a
  call frame of its own, so its compiled code is the only dynamo cache entry there (no guard lists shared between
  modules, no recompile limit that would drop a module back to eager).
* ``onnxruntime``: the module exported to ONNX (torch.onnx, the exporter :func:`zoo.export` uses) and run in an
  InferenceSession: the CPU execution provider on the CPU (``threads`` intra-op threads, sequential), the CUDA one on
  a GPU, on PyTorch's current stream through I/O binding.
* ``onnxruntime_int8`` (CPU): as ``onnxruntime``, with the exported module quantised to INT8 first
  (:func:`zoo.deploy.quantization.quantize_int8`: static QDQ, per-channel weights, ranges from the module's own
  inputs): the
  latency of the network you ship quantised. INT8 on a GPU is ``tensorrt_int8``'s.
* ``compile_int8`` (CPU): as ``compile``, with the module quantised to INT8 first by torchao's PT2E flow
  (:func:`zoo.deploy.quantization.quantize_pt2e`: X86InductorQuantizer, ranges from the module's own inputs), which
  inductor lowers to INT8 kernels (oneDNN). Needs torchao.
* ``tensorrt`` (CUDA only): torch-tensorrt when it is installed, else TensorRT's Python API building the ONNX export,
  else onnxruntime's TensorRT execution provider.
* ``tensorrt_int8`` (CUDA only): TensorRT's explicit quantisation. The exported module is quantised to INT8 QDQ in
  TensorRT's form (:func:`zoo.deploy.quantization.quantize_int8` with ``scheme="tensorrt"``: symmetric, zero points 0,
  ranges
  from the module's own inputs), then built by TensorRT's ONNX parser into an engine whose precisions the Q/DQ pairs
  set (a strongly typed network where TensorRT has them, else the INT8 builder flag), run on a CUDA stream of its own
  ordered after and before PyTorch's current one; without the ``tensorrt`` package, by onnxruntime's TensorRT
  execution provider with INT8 on.

:func:`in_runtime` makes the callable and times its making (compilation, export, engine build: a table reports it in
its build time); a module a runtime cannot take raises :class:`RuntimeFailure` naming it, never a silent eager run.
:func:`check_runtime` refuses a runtime this machine lacks before any work, with the install command.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import time
import types
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..errors import ZooError

RUNTIMES = ("eager", "compile", "compile_int8", "onnxruntime", "onnxruntime_int8", "tensorrt", "tensorrt_int8")
INSTALL = {"onnxruntime": "pip install onnx onnxscript onnxruntime (CPU) or onnxruntime-gpu (CUDA), or "
                          "pip install -e \".[export]\"",
           "tensorrt": "pip install torch-tensorrt (matching your PyTorch) or tensorrt, or onnxruntime-gpu built with "
                       "TensorRT",
           "tensorrt_int8": "pip install tensorrt onnx onnxscript onnxruntime (TensorRT's Python API and the "
                            "quantiser), or onnxruntime-gpu built with TensorRT"}


class RuntimeFailure(ZooError):
    """A module that a runtime cannot compile, export or run (the message names it), or a runtime that is missing."""


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a blocked or half-installed package counts as missing
        return False


def _ort_providers() -> list[str]:
    import onnxruntime as ort

    return list(ort.get_available_providers())


def tensorrt_backend() -> str | None:
    """How ``tensorrt`` runs here: ``torch_tensorrt``, ``tensorrt`` (TensorRT's Python API building the ONNX export),
    ``ort-tensorrt`` (onnxruntime's TensorRT EP) or None."""
    if _has("torch_tensorrt"):
        return "torch_tensorrt"
    return tensorrt_int8_backend()


def tensorrt_int8_backend() -> str | None:
    """How ``tensorrt_int8`` runs here: ``tensorrt`` (TensorRT's Python API), ``ort-tensorrt`` or None."""
    if _has("tensorrt"):
        return "tensorrt"
    if _has("onnxruntime") and "TensorrtExecutionProvider" in _ort_providers():
        return "ort-tensorrt"
    return None


def check_runtime(runtime: str, device: torch.device, dtype: torch.dtype = torch.float32) -> None:
    """Raise :class:`RuntimeFailure` (one message: what is missing, how to install it) unless `runtime` can time
    `dtype` models on `device` here."""
    if runtime not in RUNTIMES:
        raise RuntimeFailure(f"Unknown runtime {runtime!r}; allowed are {', '.join(RUNTIMES)}.")
    if runtime == "onnxruntime_int8" and device.type != "cpu":
        raise RuntimeFailure(f"runtime=onnxruntime_int8 times INT8 models on the CPU (device is {device}); INT8 on a "
                             f"GPU is TensorRT's: runtime=tensorrt_int8 (prune.runtime=tensorrt), or prune.device=cpu.")
    if runtime == "compile_int8":
        from ..deploy.quantization import PT2E_INSTALL

        if device.type != "cpu" or dtype != torch.float32:
            raise RuntimeFailure(f"runtime=compile_int8 times INT8 models that inductor builds for the CPU from "
                                 f"float32 ones (device {device}, dtype {dtype}): use prune.device=cpu and float32.")
        if not _has("torchao"):
            raise RuntimeFailure(f"runtime=compile_int8 needs torchao (PT2E quantisation): {PT2E_INSTALL}.")
    if runtime in ("onnxruntime", "onnxruntime_int8"):
        missing = [m for m in ("onnx", "onnxscript", "onnxruntime") if not _has(m)]
        if missing:
            raise RuntimeFailure(f"runtime={runtime} needs {', '.join(missing)}: {INSTALL['onnxruntime']}.")
        if device.type == "cuda" and "CUDAExecutionProvider" not in _ort_providers():
            raise RuntimeFailure("runtime=onnxruntime on CUDA needs onnxruntime's CUDA execution provider, which this "
                                 f"onnxruntime lacks (it has {', '.join(_ort_providers())}): pip install "
                                 "onnxruntime-gpu.")
        if dtype != torch.float32:
            raise RuntimeFailure(f"runtime={runtime} times float32 models (exported as they are); got dtype "
                                 f"{dtype}. Use dtype=float32, or runtime=compile / tensorrt for reduced precision.")
    if runtime == "tensorrt":
        if device.type != "cuda":
            raise RuntimeFailure(f"runtime=tensorrt needs a CUDA GPU (device is {device}); on the CPU use "
                                 "runtime=onnxruntime or compile.")
        backend = tensorrt_backend()
        missing = [m for m in ("onnx", "onnxscript") if not _has(m)]  # all but torch-tensorrt build the ONNX export
        if backend is None or (backend != "torch_tensorrt" and missing):
            raise RuntimeFailure(f"runtime=tensorrt needs TensorRT{' and ' + ', '.join(missing) if missing else ''}: "
                                 f"{INSTALL['tensorrt']}.")
        if dtype not in (torch.float32, torch.float16):
            raise RuntimeFailure(f"runtime=tensorrt builds float32 or float16 engines; got dtype {dtype}.")
    if runtime == "tensorrt_int8":
        if device.type != "cuda":
            raise RuntimeFailure(f"runtime=tensorrt_int8 builds TensorRT INT8 engines on a CUDA GPU (device is "
                                 f"{device}); INT8 on the CPU is runtime=onnxruntime_int8 or compile_int8.")
        missing = [m for m in ("onnx", "onnxscript", "onnxruntime") if not _has(m)]
        if missing or tensorrt_int8_backend() is None:
            raise RuntimeFailure(f"runtime=tensorrt_int8 needs TensorRT and the INT8 quantiser "
                                 f"({', '.join(missing) or 'tensorrt'} missing): {INSTALL['tensorrt_int8']}.")
        if dtype != torch.float32:
            raise RuntimeFailure(f"runtime=tensorrt_int8 quantises float32 models (the Q/DQ pairs set every "
                                 f"precision); got dtype {dtype}.")
    compilers = ("g++", "c++", "clang++")
    if runtime in ("compile", "compile_int8") and device.type == "cpu" and not any(map(_has_compiler, compilers)):
        raise RuntimeFailure(f"runtime={runtime} (inductor) on the CPU needs a C++ compiler: apt install g++.")


def _has_compiler(name: str) -> bool:
    import shutil

    return shutil.which(name) is not None


def runtime_version(runtime: str) -> str:
    """The version of the package behind `runtime` (part of a table's cache condition)."""
    if runtime == "compile_int8":  # both make the program: torchao quantises, inductor compiles
        return f"{runtime_version('compile')}, {_package_version('torchao')}"
    if runtime == "tensorrt_int8":  # onnxruntime quantises, TensorRT (or its execution provider) builds
        builder = _tensorrt_version() if tensorrt_int8_backend() == "tensorrt" else "TensorRT EP"
        return f"{builder}, {_package_version('onnxruntime')}"
    if runtime == "tensorrt" and tensorrt_backend() == "tensorrt":
        return _tensorrt_version()
    package = {"eager": "torch", "compile": "torch", "onnxruntime": "onnxruntime", "onnxruntime_int8": "onnxruntime",
               "tensorrt": "torch_tensorrt" if tensorrt_backend() == "torch_tensorrt" else "onnxruntime"}[runtime]
    return _package_version(package)


def _tensorrt_version() -> str:
    """TensorRT's own version (its wheels have several distribution names, and apt installs have none)."""
    import tensorrt

    return f"tensorrt {tensorrt.__version__}"


def _package_version(package: str) -> str:
    import importlib.metadata

    for name in (package, package.replace("_", "-"), "onnxruntime-gpu"):
        try:
            return f"{package} {importlib.metadata.version(name)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return f"{package} ?"


def tensor_args(args: tuple, kwargs: Mapping[str, Any]) -> list[torch.Tensor]:
    """The tensors among a call's arguments, in the order a runtime takes them as inputs."""
    return [leaf for leaf in tree_flatten((tuple(args), dict(kwargs)))[0] if torch.is_tensor(leaf)]


class RuntimeCall:
    """``fn(*args, **kwargs)`` run by a runtime: the tensors among the arguments are its inputs, everything else was
    fixed when it was built. ``build_s``: what making it cost (compile, export, engine build)."""

    def __init__(self, run: Callable[[list[torch.Tensor]], Any], runtime: str, build_s: float):
        self.run, self.runtime, self.build_s = run, runtime, build_s

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.run(tensor_args(args, kwargs))


class _Bound(nn.Module):
    """`module` as a function of the tensors among its arguments (the rest bound), returning a flat tuple."""

    def __init__(self, module: nn.Module, args: tuple, kwargs: Mapping[str, Any]):
        super().__init__()
        self.module = module
        leaves, self.spec = tree_flatten((tuple(args), dict(kwargs)))
        self.constants = [None if torch.is_tensor(leaf) else leaf for leaf in leaves]

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        given = iter(tensors)
        leaves = [next(given) if c is None else c for c in self.constants]
        args, kwargs = tree_unflatten(leaves, self.spec)
        return tuple(t for t in tree_flatten(self.module(*args, **kwargs))[0] if torch.is_tensor(t))


def _call(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    return module(*args, **kwargs)


def _own_frame() -> Callable[..., Any]:
    """A copy of :func:`_call` with a code object of its own: dynamo keeps compiled code per code object."""
    return types.FunctionType(_call.__code__.replace(), _call.__globals__, "_call")


def _compiled(module: nn.Module, args: tuple, kwargs: Mapping[str, Any], what: str,
              int8: bool = False) -> Callable[[list], Any]:
    import torch._dynamo
    import torch._inductor.config as inductor_config

    bound = _Bound(module, args, kwargs)
    tensors = tensor_args(args, kwargs)
    if int8:
        from ..deploy.quantization import QuantizationError, quantize_pt2e

        try:
            with _quiet():
                bound = quantize_pt2e(bound.eval(), tensors, [tensors], what)
        except QuantizationError as error:
            raise RuntimeFailure(str(error)) from error
    fn = torch.compile(_own_frame(), backend="inductor", fullgraph=True, dynamic=False)
    try:
        with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True), inductor_config.patch(freezing=True), \
                _quiet():
            fn(bound, *tensors)  # compiles now, under the caller's threads, dtype and inference mode
    except Exception as error:  # noqa: BLE001 - any compiler failure becomes one message naming the module
        raise RuntimeFailure(f"runtime={'compile_int8' if int8 else 'compile'} could not compile {what}: "
                             f"{_first_line(error)}") from error
    return lambda given: fn(bound, *given)


CHATTY = ("onnx_ir", "onnxscript", "torch.onnx", "torch._dynamo", "torch._inductor", "torch_tensorrt")


@contextlib.contextmanager
def _quiet() -> Any:
    """The exporters' and compilers' chatter (prints, warnings, INFO logs) kept off the run's log."""
    loggers = [logging.getLogger(name) for name in CHATTY]
    levels = [log.level for log in loggers]
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        for log in loggers:
            log.setLevel(max(log.level, logging.WARNING))
        try:
            yield
        finally:
            for log, level in zip(loggers, levels):
                log.setLevel(level)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"


def onnx_bytes(module: nn.Module, args: tuple, kwargs: Mapping[str, Any], what: str) -> tuple[bytes, int]:
    """`module` exported to ONNX (as a function of the tensors among its arguments) and the number of inputs."""
    bound = _Bound(module, args, kwargs).eval()
    tensors = tensor_args(args, kwargs)
    with torch.inference_mode(False), torch.no_grad(), _quiet():
        inputs = tuple(t.clone() for t in tensors)  # inference tensors cannot be traced
        try:
            program = torch.onnx.export(bound, inputs, dynamo=True, external_data=False, verbose=False)
            proto = program.model_proto
        except Exception as error:  # noqa: BLE001
            raise RuntimeFailure(f"runtime=onnxruntime could not export {what} to ONNX: {_first_line(error)}") \
                from error
    return proto.SerializeToString(), len(inputs)


def _ort_session(model: bytes, providers: list[Any], threads: int, what: str) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    try:
        return ort.InferenceSession(model, sess_options=options, providers=providers)
    except Exception as error:  # noqa: BLE001
        raise RuntimeFailure(f"onnxruntime could not load {what}: {_first_line(error)}") from error


def _onnx_model(module: nn.Module, args: tuple, kwargs: Mapping[str, Any], what: str,
                int8_scheme: str | None = None) -> bytes:
    """`module` exported to ONNX, and with an `int8_scheme` quantised to INT8 QDQ in that form on its own inputs."""
    from ..deploy.quantization import QuantizationError, quantize_int8

    model, _ = onnx_bytes(module, args, kwargs, what)
    if int8_scheme is None:
        return model
    try:
        return quantize_int8(model, [tensor_args(args, kwargs)], what, scheme=int8_scheme)
    except QuantizationError as error:
        raise RuntimeFailure(str(error)) from error


def _onnxruntime(module: nn.Module, args: tuple, kwargs: Mapping[str, Any], device: torch.device, threads: int,
                 what: str, tensorrt: bool = False, int8: bool = False) -> Callable[[list], Any]:
    model = _onnx_model(module, args, kwargs, what, ("tensorrt" if tensorrt else "onnxruntime") if int8 else None)
    if device.type == "cpu":
        session = _ort_session(model, ["CPUExecutionProvider"], threads, what)
        names = [i.name for i in session.get_inputs()]

        def run_cpu(tensors: list[torch.Tensor]) -> Any:
            return session.run(None, {n: t.contiguous().numpy() for n, t in zip(names, tensors)})

        _check_runs(run_cpu, args, kwargs, what)
        return run_cpu
    stream = {"device_id": device.index or 0, "user_compute_stream": str(torch.cuda.current_stream(device).cuda_stream)}
    provider = ("TensorrtExecutionProvider", {"device_id": device.index or 0, "trt_fp16_enable": False,
                                              "trt_int8_enable": int8}) if tensorrt \
        else ("CUDAExecutionProvider", stream)
    session = _ort_session(model, [provider], threads, what)
    names = [i.name for i in session.get_inputs()]
    outputs = [o.name for o in session.get_outputs()]
    binding = session.io_binding()
    for name in outputs:
        binding.bind_output(name, "cuda", device.index or 0)

    def run_cuda(tensors: list[torch.Tensor]) -> Any:
        for name, t in zip(names, tensors):
            t = t.contiguous()
            binding.bind_input(name, "cuda", device.index or 0, _numpy_dtype(t.dtype), list(t.shape), t.data_ptr())
        session.run_with_iobinding(binding)
        return binding.get_outputs()

    _check_runs(run_cuda, args, kwargs, what)
    return run_cuda


def _numpy_dtype(dtype: torch.dtype) -> Any:
    import numpy as np

    return {torch.float32: np.float32, torch.float16: np.float16, torch.int64: np.int64, torch.int32: np.int32,
            torch.float64: np.float64, torch.bool: np.bool_}[dtype]


def _check_runs(run: Callable[[list], Any], args: tuple, kwargs: Mapping[str, Any], what: str) -> None:
    try:
        run(tensor_args(args, kwargs))
    except Exception as error:  # noqa: BLE001
        raise RuntimeFailure(f"onnxruntime could not run {what}: {_first_line(error)}") from error


def _torch_tensorrt(module: nn.Module, args: tuple, kwargs: Mapping[str, Any], dtype: torch.dtype,
                    what: str) -> Callable[[list], Any]:
    import torch_tensorrt

    bound = _Bound(module, args, kwargs).eval()
    tensors = tensor_args(args, kwargs)
    try:
        with torch.inference_mode(False), torch.no_grad(), _quiet():
            engine = torch_tensorrt.compile(bound, ir="dynamo", inputs=[t.clone() for t in tensors],
                                            enabled_precisions={dtype}, min_block_size=1)
            engine(*tensors)
    except Exception as error:  # noqa: BLE001
        raise RuntimeFailure(f"runtime=tensorrt could not build {what}: {_first_line(error)}") from error
    return lambda given: engine(*given)


TRT_DTYPES = {"FLOAT": torch.float32, "HALF": torch.float16, "BF16": torch.bfloat16, "INT32": torch.int32,
              "INT64": torch.int64, "INT8": torch.int8, "BOOL": torch.bool}


def _tensorrt_engine(model: bytes, tensors: list[torch.Tensor], device: torch.device, what: str,
                     runtime: str) -> Callable[[list], Any]:
    """An ONNX `model` built by TensorRT's ONNX parser into an engine, run on a stream of its own. A strongly
    typed network where TensorRT has them (the graph's types and, for INT8, its Q/DQ pairs set every precision),
    else the builder flags its types need (TensorRT 8)."""
    import tensorrt as trt

    from ..deploy.quantization import input_names

    logger = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(logger)
    kinds = trt.NetworkDefinitionCreationFlag
    typed = hasattr(kinds, "STRONGLY_TYPED")  # TensorRT 10+: the Q/DQ pairs and tensor types set every precision
    flags = 1 << int(kinds.STRONGLY_TYPED) if typed else 1 << int(kinds.EXPLICIT_BATCH)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(model):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeFailure(f"runtime={runtime}: TensorRT's ONNX parser could not read {what}: {errors}")
    config = builder.create_builder_config()
    if not typed and runtime == "tensorrt_int8":
        config.set_flag(trt.BuilderFlag.INT8)
    if not typed and any(t.dtype == torch.float16 for t in tensors):
        config.set_flag(trt.BuilderFlag.FP16)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise RuntimeFailure(f"runtime={runtime}: TensorRT could not build an engine for {what}.")
    engine = trt.Runtime(logger).deserialize_cuda_engine(serialized)
    context = engine.create_execution_context()
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    outputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
    results = [torch.empty(tuple(context.get_tensor_shape(n)), device=device,
                           dtype=TRT_DTYPES[engine.get_tensor_dtype(n).name]) for n in outputs]
    for name, result in zip(outputs, results):
        context.set_tensor_address(name, result.data_ptr())
    inputs = input_names(model)  # the graph's inputs, in the order the tensors come
    stream = torch.cuda.Stream(device)  # TensorRT synchronises the device on the default stream: a stream of its own

    def run(given: list[torch.Tensor]) -> list[torch.Tensor]:
        """Queue the engine after the caller's stream's work and the caller's stream after it; the outputs are the
        engine's own buffers, overwritten by the next call."""
        given = [t.contiguous() for t in given]
        caller = torch.cuda.current_stream(device)
        stream.wait_stream(caller)
        for name, t in zip(inputs, given):
            context.set_tensor_address(name, t.data_ptr())
        if not context.execute_async_v3(stream.cuda_stream):
            raise RuntimeFailure(f"runtime={runtime} could not run {what}.")
        caller.wait_stream(stream)  # (the inputs are freed on the caller's stream: after the engine read them)
        return results

    try:
        run(tensors)
    except Exception as error:  # noqa: BLE001
        raise RuntimeFailure(f"runtime={runtime} could not run {what}: {_first_line(error)}") from error
    return run


def _tensorrt(module: nn.Module, args: tuple, kwargs: Mapping[str, Any], device: torch.device, threads: int,
              what: str, int8: bool) -> Callable[[list], Any]:
    """`module` built by TensorRT from its ONNX export (quantised to TensorRT's QDQ form first with `int8`)."""
    runtime = "tensorrt_int8" if int8 else "tensorrt"
    if (tensorrt_int8_backend() if int8 else tensorrt_backend()) == "ort-tensorrt":
        return _onnxruntime(module, args, kwargs, device, threads, what, tensorrt=True, int8=int8)
    model = _onnx_model(module, args, kwargs, what, "tensorrt" if int8 else None)
    try:
        with _quiet():
            return _tensorrt_engine(model, tensor_args(args, kwargs), device, what, runtime)
    except RuntimeFailure:
        raise
    except Exception as error:  # noqa: BLE001 - TensorRT's own errors become one message naming the module
        raise RuntimeFailure(f"runtime={runtime} could not build {what}: {_first_line(error)}") from error


def in_runtime(module: nn.Module, args: tuple, kwargs: Mapping[str, Any] | None, runtime: str, device: torch.device,
               threads: int = 1, dtype: torch.dtype = torch.float32, what: str = "the module"
               ) -> nn.Module | RuntimeCall:
    """`module` (prepared: on `device`, eval) as `runtime` runs it on these arguments (static shapes); ``eager``
    returns the module itself. Call inside :func:`~zoo.latency.device.timing_context` (a compiled kernel keeps the
    thread count it was built with). Raises :class:`RuntimeFailure` naming `what` when the runtime cannot take it."""
    if runtime == "eager":
        return module
    kwargs = dict(kwargs or {})
    start = time.perf_counter()
    if runtime in ("compile", "compile_int8"):
        run = _compiled(module, tuple(args), kwargs, what, int8=runtime == "compile_int8")
    elif runtime in ("onnxruntime", "onnxruntime_int8"):
        run = _onnxruntime(module, tuple(args), kwargs, device, threads, what, int8=runtime == "onnxruntime_int8")
    elif runtime == "tensorrt" and tensorrt_backend() == "torch_tensorrt":
        run = _torch_tensorrt(module, tuple(args), kwargs, dtype, what)
    elif runtime in ("tensorrt", "tensorrt_int8"):
        run = _tensorrt(module, tuple(args), kwargs, device, threads, what, int8=runtime == "tensorrt_int8")
    else:
        raise RuntimeFailure(f"Unknown runtime {runtime!r}; allowed are {', '.join(RUNTIMES)}.")
    return RuntimeCall(run, runtime, time.perf_counter() - start)


__all__ = ["RUNTIMES", "RuntimeCall", "RuntimeFailure", "check_runtime", "in_runtime", "onnx_bytes",
           "runtime_version", "tensorrt_backend", "tensorrt_int8_backend"]
