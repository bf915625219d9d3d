"""train.py and the training library: config composition, tiny real training runs, W&B offline files read
back, checkpoints/resume, faults (NaN, signals, kill -9 during a save), DDP on 2 CPU processes, benchmark."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from zoo.jobs.cli import register_resolvers
from zoo.training.config import register_configs

from ..helpers import ROOT

CONF = ROOT / "conf"
TINY_DIGITS = ["data.image_size=16", "data.batch_size=32", "trainer.max_epochs=2", "trainer.limit_train_batches=4",
               "trainer.progress=false", "model=mobilenetv2_035", "optim.warmup_epochs=0"]


def tiny(*changes: str) -> list[str]:
    """TINY_DIGITS with `changes` replacing the entries for the same keys (Hydra refuses duplicates)."""
    keys = {c.split("=", 1)[0] for c in changes}
    return [o for o in TINY_DIGITS if o.split("=", 1)[0] not in keys] + list(changes)


def compose(overrides: list[str], output_dir: Path | None = None):
    """A real Hydra composition of conf/train.yaml (paths.output_dir replaced, it needs a Hydra run)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register_configs(CONF)
    register_resolvers()
    extra = [f"paths.output_dir={output_dir}"] if output_dir else ["paths.output_dir=unused"]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return hydra_compose(config_name="train", overrides=[*overrides, *extra])


# ------------------------------------------------------------------------------------------- benchmark
def test_benchmark_quick_smoke(tmp_path):
    sys.path.insert(0, str(ROOT))
    from benchmarks.train_throughput import run

    result = run(quick=True)
    assert result["engine_samples_per_s"] > 0 and result["loop_samples_per_s"] > 0
    assert result["ratio"] > 0 and result["torch"] == torch.__version__
