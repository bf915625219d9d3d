"""zoo.export, the slow half: the CNN families to ONNX and the other ones to torch.export, RetNet to ONNX and
pruned, dynamic axes, pruned and merged models, and the parity check's failures. In process, but minutes of export
and onnxruntime work on 2 cores, so here rather than in the unit tier (tests/unit/test_export.py holds MobileNetV2's
and RetNet's exports to torch.export and the refusals)."""

from __future__ import annotations

import pytest
import torch

import zoo
from zoo.errors import ExportError

SMALL = (3, 64, 64)


EXPORTS = [(f, fmt, suffix) for f in zoo.list_families(task="classification")
           for fmt, suffix in (("onnx", "onnx"), ("torch_export", "pt2"))
           if f.name != "mobilenetv2" or fmt == "onnx"]  # (MobileNetV2 to torch.export: the unit tier)


@pytest.mark.parametrize("family,fmt,suffix", EXPORTS, ids=[f"{f.name}-{fmt}" for f, fmt, _ in EXPORTS])
def test_every_other_cnn_family_exports_within_tolerance(family, fmt, suffix, tmp_path):
    from ..unit.test_export import test_a_cnn_family_exports_within_tolerance as check

    check(family, fmt, suffix, tmp_path)


def test_onnx_has_a_dynamic_batch_axis_and_optionally_dynamic_size(tmp_path):
    """The exported file takes any batch in onnxruntime (timm's default); dynamic_size lets it take another image
    size; dynamic_batch=False fixes the batch, and onnxruntime then refuses another one."""
    import onnxruntime as ort

    torch.manual_seed(0)
    model = zoo.create_model("mobilenetv2_035", num_classes=10).eval()
    report = zoo.export(model, tmp_path / "m.onnx", input_size=SMALL)
    (name,) = report.dynamic_axes
    assert report.dynamic_axes == {name: {0: "batch"}} and report.opset >= 18
    assert report.checked_shapes == [[[2, *SMALL]], [[3, *SMALL]]]
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    for batch in (1, 5):
        x = torch.randn(batch, *SMALL)
        (logits,) = session.run(None, {name: x.numpy()})
        with torch.no_grad():
            torch.testing.assert_close(torch.from_numpy(logits), model(x), rtol=1e-4, atol=1e-4)
    sized = zoo.export(model, tmp_path / "s.onnx", input_size=SMALL, dynamic_size=True)
    assert sized.dynamic_axes == {name: {0: "batch", 2: "height", 3: "width"}}
    assert sized.checked_shapes[1] == [[3, 3, 96, 96]]
    session = ort.InferenceSession(str(tmp_path / "s.onnx"), providers=["CPUExecutionProvider"])
    assert session.run(None, {name: torch.randn(1, 3, 128, 160).numpy()})[0].shape == (1, 10)
    fixed = zoo.export(model, tmp_path / "f.onnx", input_size=SMALL, dynamic_batch=False)
    assert fixed.dynamic_axes == {} and fixed.checked_shapes == [[[1, *SMALL]]]
    session = ort.InferenceSession(str(tmp_path / "f.onnx"), providers=["CPUExecutionProvider"])
    with pytest.raises(Exception, match="(?i)dimension|shape"):
        session.run(None, {name: torch.randn(2, *SMALL).numpy()})
    with pytest.raises(ExportError, match="takes no images"):
        zoo.export(zoo.create_model("retnet_tiny"), tmp_path / "r.onnx", dynamic_size=True)


def test_pruned_merged_and_fused_models_export(tmp_path):
    """Removed blocks, merged convolutions (dense convs replacing a depthwise chain) and the deploy form."""
    torch.manual_seed(0)
    model = zoo.create_model("mobilenetv2_035", num_classes=10).eval()
    acts = [u.name for u in zoo.depth_units(model, SMALL) if u.kind == "act"][:3]
    blocks = [u.name for u in zoo.depth_units(model, SMALL) if u.kind == "block" and u.removable][:1]
    pruned = zoo.apply_plan(model, {"remove": acts + blocks, "merge": True}, inplace=False).eval()
    for candidate, path in ((pruned, "pruned.onnx"), (zoo.fuse(pruned), "fused.onnx")):
        report = zoo.export(candidate, tmp_path / path, input_size=SMALL)
        assert report.passed and report.max_rel_diff <= 1e-4


def test_a_difference_beyond_the_tolerance_is_an_error(tmp_path):
    """The parity check can fail: BiT's ONNX graph differs from PyTorch by ~1e-5, beyond rtol=0."""
    torch.manual_seed(0)
    model = zoo.create_model("resnetv2_50x1_bit", num_classes=10)
    with pytest.raises(ExportError, match="differs from PyTorch by .* beyond rtol=0"):
        zoo.export(model, tmp_path / "bit.onnx", input_size=SMALL, rtol=0.0)
    assert (tmp_path / "bit.onnx").is_file()  # written, so that it can be inspected


def test_non_finite_outputs_never_pass(tmp_path, monkeypatch):
    """A runtime returning NaN where PyTorch has numbers fails the check; a model whose own outputs are NaN is
    refused (there is nothing to compare)."""
    from zoo.deploy import export as exporting

    model = zoo.create_model("mobilenetv2_035", num_classes=10)
    real = exporting._run_onnx
    monkeypatch.setattr(exporting, "_run_onnx", lambda path, inputs: (
        [torch.full_like(t, float("nan")) for t in real(path, inputs)[0]], "patched"))
    with pytest.raises(ExportError, match="differs from PyTorch by inf"):
        zoo.export(model, tmp_path / "m.onnx", input_size=SMALL)
    monkeypatch.setattr(exporting, "_run_onnx", real)
    with torch.no_grad():
        model.classifier.weight.fill_(float("nan"))
    with pytest.raises(ExportError, match="not finite"):
        zoo.export(model, tmp_path / "m.onnx", input_size=SMALL)


@pytest.mark.parametrize("prune,fmt,suffix", [(False, "onnx", "onnx"), (True, "onnx", "onnx"),
                                               (True, "torch_export", "pt2")])
def test_retnet_exports_its_parallel_form_and_decode_step(prune, fmt, suffix, tmp_path):
    """RetNet to ONNX, and with a retention and an FFN sub-layer removed: the unit tier's check of the intact one
    (to torch.export)."""
    from ..unit.test_export import test_retnet_parallel_form_and_decode_step as check

    check(prune, fmt, suffix, tmp_path)

