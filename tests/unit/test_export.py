"""zoo.export: every family, pruned and merged or not, to ONNX (checked in onnxruntime) and torch.export programs;
RetNet's parallel form and its decode step; the parity check and its refusals."""

from __future__ import annotations

import pytest
import torch

import zoo
from zoo.errors import ExportError

SMALL = (3, 64, 64)


@pytest.mark.parametrize("family", [zoo.get_family("mobilenetv2")], ids=lambda f: f.name)  # the others: e2e
@pytest.mark.parametrize("fmt,suffix", [("torch_export", "pt2")])  # (to ONNX: e2e, and the shared prune run's export)
def test_a_cnn_family_exports_within_tolerance(family, fmt, suffix, tmp_path):
    from benchmarks.export_parity import moved_norms

    from ..helpers import small_model

    torch.manual_seed(0)
    model = moved_norms(small_model(family, num_classes=10))  # TResNet zeroes each block's last norm scale
    report = zoo.export(model, tmp_path / f"m.{suffix}", format=fmt, input_size=SMALL, batch_size=2)
    assert report.passed and report.max_rel_diff <= 1e-4 and report.input_shapes == [[2, *SMALL]]
    assert (tmp_path / f"m.{suffix}").stat().st_size > 0
    assert report.checked_with.startswith("onnxruntime" if fmt == "onnx" else "torch.export")


@pytest.mark.parametrize("prune", [False])  # (pruned, and to ONNX: tests/e2e/test_export_families.py)
@pytest.mark.parametrize("fmt,suffix", [("torch_export", "pt2")])
def test_retnet_parallel_form_and_decode_step(prune, fmt, suffix, tmp_path):
    torch.manual_seed(0)
    model = zoo.create_model("retnet_tiny", vocab_size=97).eval()
    if prune:
        model = zoo.remove_units(model, ["blocks.0.retention", "blocks.1.ffn"])
    parallel = zoo.export(model, tmp_path / f"p.{suffix}", format=fmt, input_size=(24,))
    assert parallel.passed and parallel.checked_shapes == [[[2, 24]], [[3, 24]]]  # traced at 2, checked at 2 and 3
    step = zoo.export(model, tmp_path / f"s.{suffix}", format=fmt, form="recurrent", batch_size=2)
    assert step.passed and step.max_rel_diff <= 1e-4
    assert step.input_shapes[0] == [2, 1] and len(step.input_shapes) == 2 + (1 if prune else 2)  # token, position,
    # one state per retention sub-layer; the states' batch axis is dynamic too, the position has none
    second = step.checked_shapes[1]
    assert second[0] == [3, 1] and second[1] == [] and all(shape[0] == 3 for shape in second[2:])


def test_the_recurrent_form_is_the_models_decode_step():
    """The exported step function computes what model(token, mode='recurrent', state=...) computes."""
    from zoo.models.retnet import RecurrentForm

    torch.manual_seed(0)
    model = zoo.create_model("retnet_tiny", vocab_size=97).eval()
    with torch.no_grad():
        _, state = model(torch.randint(0, 97, (2, 9)), return_state=True)
        token = torch.randint(0, 97, (2, 1))
        expected, expected_state = model(token, mode="recurrent", state=state, return_state=True)
        logits, *states = RecurrentForm(model)(token, torch.tensor(9.0, dtype=torch.float64), *state.layers)
    torch.testing.assert_close(logits, expected[:, -1], rtol=0, atol=0)
    for got, want in zip(states, expected_state.layers):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_bad_requests_are_refused(tmp_path):
    model = zoo.create_model("mobilenetv2_035", num_classes=10)
    with pytest.raises(ExportError, match="Unknown export format 'tflite'"):
        zoo.export(model, tmp_path / "m.tflite", format="tflite")
    with pytest.raises(ExportError, match=r"\.pt2"):
        zoo.export(model, tmp_path / "m.onnx", format="torch_export")
    with pytest.raises(ExportError, match="no.*decode step|has none"):
        zoo.export(model, tmp_path / "m.onnx", form="recurrent")


def test_export_leaves_the_model_as_it_was(tmp_path):
    model = zoo.create_model("mobilenetv2_035", num_classes=10).train()
    zoo.export(model, tmp_path / "m.pt2", format="torch_export", input_size=SMALL)
    assert model.training


def test_low_precision_models(tmp_path):
    model = zoo.create_model("mobilenetv2_035", num_classes=10).to(torch.bfloat16)
    with pytest.raises(ExportError, match="model.float"):
        zoo.export(model, tmp_path / "m.onnx", input_size=SMALL)
    report = zoo.export(model, tmp_path / "m.pt2", format="torch_export", input_size=SMALL)
    assert report.passed


def test_a_failing_exporter_is_quiet_and_keeps_what_it_printed(tmp_path, capfd):
    """An exporter that fails (data-dependent control flow) prints nothing: one message names the model and the
    cause (no terminal colour codes) and where the exporter's own output was kept. A language model is refused
    INT8 export before any exporter runs."""

    class Branchy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x) if x.sum().item() > 0 else x

    with pytest.raises(ExportError) as refused:
        zoo.export(Branchy(), tmp_path / "b.onnx", example=torch.randn(2, 4))
    message = str(refused.value)
    assert message.startswith("Branchy could not be exported to ONNX") and "\x1b" not in message
    log = tmp_path / "b.onnx.export.log"
    assert f"(the exporter's output: {log})" in message and log.read_text().strip()
    printed = capfd.readouterr()
    assert not printed.out.strip() and not printed.err.strip(), printed
    with pytest.raises(ExportError, match="RetNet is a language model, which decodes in INT8 with generate"):
        zoo.export(zoo.create_model("retnet_tiny"), tmp_path / "r.onnx", quantize="int8")
    assert not capfd.readouterr().err.strip()

