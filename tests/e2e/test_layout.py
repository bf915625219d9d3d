"""The package layout: no import cycles (function-level imports included), lower layers never import higher ones,
and ``import zoo`` stays light."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ..helpers import env_for

# Each module's layer: a module may import its own layer and the ones below, never a higher one.


def test_import_zoo_stays_light():
    """``import zoo`` needs torch only: not timm (several seconds), Hydra, W&B or huggingface_hub."""
    code = ("import sys, zoo; heavy = [m for m in ('timm', 'hydra', 'wandb', 'huggingface_hub', 'torchvision') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env_for(Path("/tmp")))
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
