"""The product's entry points run as a user runs them: ``python prune.py ...`` / ``python train.py ...`` in a fresh
process, offline, from the repository root (a study measures whole jobs, not functions)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from zoo.files import read_sealed_json

ROOT = Path(__file__).resolve().parents[1]


def job_command(script: str, overrides: list[str]) -> list[str]:
    """The command line of ``python <script> overrides`` (``prune.py`` or ``train.py`` at the repository root)."""
    return [sys.executable, str(ROOT / script), *overrides]


def offline_env() -> dict[str, str]:
    """The environment of a study's job: W&B offline and silent, output unbuffered."""
    return {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "PYTHONUNBUFFERED": "1"}


def python_job(script: str, overrides: list[str], run_dir: Path, workdir: Path) -> dict[str, Any]:
    """``python <script> overrides`` in `run_dir` (offline, no logger); its ``results.json``, read checked."""
    command = [*job_command(script, overrides), "logger=none", "trainer.progress=false", f"hydra.run.dir={run_dir}",
               f"paths.log_dir={workdir / 'outputs'}"]
    proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=offline_env())
    if proc.returncode != 0:
        raise RuntimeError(f"{script} {' '.join(overrides)} failed ({proc.returncode}): "
                           f"{(proc.stdout + proc.stderr)[-3000:]}")
    return read_sealed_json(run_dir / "results.json")
