"""The zoo: registry, timm-compatible weights, our checkpoints, depth units, fuse, CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import zoo


def test_cli_lists_models_and_rejects_unknown_names():
    run = subprocess.run([sys.executable, "-m", "zoo", "list", "tresnet_*"], capture_output=True, text=True)
    assert run.returncode == 0 and "tresnet_xl" in run.stdout and "31.39M" in run.stdout
    bad = subprocess.run([sys.executable, "-m", "zoo", "info", "tresnet_s"], capture_output=True, text=True)
    assert bad.returncode == 2 and "Closest names" in bad.stderr


BLOCKER = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('hydra', 'omegaconf', 'wandb'):
            raise ImportError(f'{name} is blocked')
sys.meta_path.insert(0, Block())
"""


def test_zoo_runs_without_hydra_or_wandb(tmp_path):
    """The library core needs only PyTorch and timm (the GPU check relies on it)."""
    (tmp_path / "sitecustomize.py").write_text(BLOCKER)
    code = ("import zoo, torch, sys; m = zoo.create_model('mobilenetv2_035', num_classes=3).eval(); "
            "print(m(torch.zeros(1, 3, 32, 32)).shape, len(zoo.depth_units(m, (3, 32, 32))), "
            "[k for k in ('hydra', 'wandb', 'omegaconf') if k in sys.modules])")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(Path(zoo.__file__).parents[2])])}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    assert "torch.Size([1, 3])" in run.stdout and run.stdout.strip().endswith("[]")


