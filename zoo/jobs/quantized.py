"""The INT8 side of a prune run (``prune.quantize=int8``): the baseline and the pruned network quantised after the
fine-tune (or the quantisation-aware training) and evaluated as their INT8 runtime computes them."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from torch import nn

from .prune_results import metric_view


def int8_quality(cfg: Any, networks: dict[str, nn.Module], data: Any, output_dir: Path) -> dict[str, Any]:
    """``prune.quantize=int8``: each network (baseline, pruned; deploy forms) quantised on ``prune.calib_batches``
    training batches (onnxruntime's static QDQ, in TensorRT's symmetric form with ``prune.runtime=tensorrt``; PT2E
    with ``prune.runtime=compile``) and evaluated on the validation split as that file computes it; with its top-1
    agreement with the float network and the sizes, float and INT8. The pruned network's INT8 model is kept as
    ``pruned_int8.onnx`` (``pruned_int8.pt2``, a PT2E program, with ``prune.runtime=compile``)."""
    import tempfile

    from ..deploy.export import export
    from ..deploy.fuse import fuse
    from ..training import evaluate
    from .plan import calibration_batches
    from .prune_config import int8_format

    calibration = [inputs for inputs, _ in calibration_batches(data, cfg.prune.calib_batches)]
    form, scheme = int8_format(cfg.prune)
    suffix = ".onnx" if form == "onnx" else ".pt2"
    out: dict[str, Any] = {"calibration_batches": len(calibration), "format": form, "scheme": scheme,
                           "method": METHODS[scheme or form]}
    with tempfile.TemporaryDirectory(prefix="zoo-int8-") as tmp:
        for name, network in networks.items():
            model = fuse(copy.deepcopy(network).cpu().float().eval())
            int8_path = output_dir / f"pruned_int8{suffix}" if name == "pruned" else Path(tmp) / f"{name}{suffix}"
            report = export(model, int8_path, format=form, input_size=data.input_size, quantize="int8",
                            calibration=calibration, min_agreement=0.0, int8_scheme=scheme or "onnxruntime")
            metrics = evaluate(int8_module(int8_path), data.val, task="classification", device="cpu")
            out[name] = {"metrics": metric_view(metrics), "top1_agreement": report.top1_agreement,
                         "max_logit_diff": report.max_abs_diff, "fp32_size_mb": report.float_size_bytes / 2**20,
                         "int8_size_mb": int8_path.stat().st_size / 2**20}
    out["path"] = str(output_dir / f"pruned_int8{suffix}")
    return out


METHODS = {"onnxruntime": "onnxruntime static QDQ, per-channel weights (int8), per-tensor activations (uint8), min/max "
                          "ranges",
           "tensorrt": "onnxruntime static QDQ in TensorRT's form (explicit quantisation): per-channel weights (int8), "
                       "per-tensor activations (int8, symmetric), min/max ranges; evaluated as onnxruntime computes "
                       "the file on the CPU (TensorRT's fused kernels round the same Q/DQ points, not bit for bit)",
           "torch_export": "torchao PT2E with X86InductorQuantizer (for torch.compile), per-channel weights (int8), "
                           "per-tensor activations (uint8), histogram ranges; evaluated as the eager program"}


def int8_module(path: Path) -> nn.Module:
    """A written INT8 network, callable for evaluation: an ONNX file in onnxruntime, or a PT2E program (eager: the
    rounding inductor's kernels compute)."""
    from ..deploy.export import OnnxModule

    if path.suffix == ".onnx":
        return OnnxModule(path)
    return ProgramModule(path)


class ProgramModule(nn.Module):
    """A saved ``torch.export`` program, called like the network it was exported from (in eval mode: a loaded
    program refuses ``.train()``/``.eval()``, so it is kept outside the module tree)."""

    def __init__(self, path: Path):
        super().__init__()
        import torch
        import torchao.quantization.pt2e  # noqa: F401 - registers the program's quantise/dequantise operators

        self.__dict__["program"] = torch.export.load(str(path)).module()

    def forward(self, *args: Any) -> Any:
        return self.program(*args)
