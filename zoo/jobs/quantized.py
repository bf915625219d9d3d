"""The INT8 side of a prune run (``prune.quantize=int8``): the baseline and the pruned network quantised after the
fine-tune and evaluated as onnxruntime runs them."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from torch import nn


def int8_quality(cfg: Any, networks: dict[str, nn.Module], data: Any, output_dir: Path) -> dict[str, Any]:
    """``prune.quantize=int8``: each network (baseline, pruned; deploy forms) exported to ONNX and quantised after the
    fine-tune (static QDQ on ``prune.calib_batches`` training batches), evaluated in onnxruntime on the validation
    split; with its top-1 agreement with the float network and the ONNX sizes, float and INT8. The pruned network's
    INT8 model is kept as ``pruned_int8.onnx``."""
    import tempfile

    from ..exporting import export
    from ..fuse import fuse
    from ..training import evaluate
    from .plan import calibration_batches

    calibration = [inputs for inputs, _ in calibration_batches(data, cfg.prune.calib_batches)]
    out: dict[str, Any] = {"calibration_batches": len(calibration), "method": "onnxruntime static QDQ, per-channel "
                           "weights (int8), per-tensor activations (uint8), min/max ranges"}
    with tempfile.TemporaryDirectory(prefix="zoo-int8-") as tmp:
        for name, network in networks.items():
            model = fuse(copy.deepcopy(network).cpu().float().eval())
            float_path = Path(tmp) / f"{name}_fp32.onnx"
            int8_path = output_dir / "pruned_int8.onnx" if name == "pruned" else Path(tmp) / f"{name}_int8.onnx"
            export(model, float_path, input_size=data.input_size, rtol=1.0)
            report = export(model, int8_path, input_size=data.input_size, quantize="int8", calibration=calibration,
                            min_agreement=0.0)
            metrics = evaluate(OnnxModule(int8_path), data.val, task="classification", device="cpu")
            out[name] = {"metrics": {f"val/{k}": round(float(v), 5) for k, v in metrics.items()},
                         "top1_agreement": report.top1_agreement, "max_logit_diff": report.max_abs_diff,
                         "fp32_size_mb": float_path.stat().st_size / 2**20,
                         "int8_size_mb": int8_path.stat().st_size / 2**20}
    out["path"] = str(output_dir / "pruned_int8.onnx")
    return out


class OnnxModule(nn.Module):
    """An ONNX file run in onnxruntime's CPU session, called like the network it was exported from."""

    def __init__(self, path: Path, threads: int = 1):
        super().__init__()
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.name = self.session.get_inputs()[0].name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.session.run(None, {self.name: x.detach().cpu().contiguous().numpy()})[0])
