"""train.py in this process on a tiny config (digits, MobileNetV2-0.35 at 16 px): its results and checkpoint, and the
errors it stops with. train.py in a subprocess, with W&B, signals and torchrun, is in ``tests/e2e/test_train.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import zoo

from ..helpers import run_in_process

TINY_DIGITS = ["data.image_size=16", "data.batch_size=32", "trainer.max_epochs=2", "trainer.limit_train_batches=4",
               "trainer.progress=false", "model=mobilenetv2_035", "optim.warmup_epochs=0", "logger=none"]


def tiny(*changes: str) -> list[str]:
    """TINY_DIGITS with `changes` replacing the entries for the same keys (Hydra refuses duplicates)."""
    keys = {c.split("=", 1)[0] for c in changes}
    return [o for o in TINY_DIGITS if o.split("=", 1)[0] not in keys] + list(changes)


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    """One tiny train.py run in this process (shared by the module)."""
    run_dir = tmp_path_factory.mktemp("digits") / "run"
    outcome = run_in_process("train", *TINY_DIGITS, f"paths.log_dir={run_dir.parent}", f"hydra.run.dir={run_dir}")
    assert outcome.code == 0, outcome.output[-3000:]
    return run_dir, outcome


def test_train_runs_and_leaves_results_a_checkpoint_and_its_config(digits_run):
    """results.json (metrics, epochs, memory), the best checkpoint that zoo.load and create_model read back, Hydra's
    config beside them."""
    run_dir, outcome = digits_run
    results = json.loads((run_dir / "results.json").read_text())
    assert results["model"] == "mobilenetv2_035" and results["data"] == "digits" and results["epochs"] == 2
    assert set(results["metrics"]) == {"val/acc1", "val/acc5", "val/loss"}
    assert results["params"] > 0 and results["train_time_s"] > 0 and results["memory"]["peak_rss_mb"] > 50
    checkpoint = Path(results["checkpoint"])
    assert checkpoint.is_file() and "epoch 2/2" in outcome.output
    assert zoo.create_model("mobilenetv2_035", pretrained=checkpoint).num_classes == 10
    assert zoo.load(checkpoint).num_classes == 10 and (run_dir / ".hydra" / "config.yaml").is_file()


@pytest.mark.parametrize("overrides, code, message", [
    (["data=imagenot"], 2, "data=imagenot is not an option of the data group. Did you mean imagefolder?"),
    (["data=cifar10", "data.root=/nonexistent/cifar"], 2, "not found or corrupted"),
    (["model.num_classes=7"], 2, "model.num_classes=7 but the data set has 10 classes"),
    (["model=mobilenetv2_050", "trainer.resume={resume}"], 2, "written for model=mobilenetv2_035"),
])
def test_bad_input_exits_with_a_clear_message(overrides, code, message, digits_run, tmp_path):
    overrides = [o.format(resume=digits_run[0]) for o in overrides]
    outcome = run_in_process("train", *tiny(*overrides), f"hydra.run.dir={tmp_path / 'run'}")
    output = outcome.output
    assert outcome.code == code, output[-3000:]
    assert message in output
    assert "Traceback" not in output
    assert not (tmp_path / "run" / "checkpoints").exists()
