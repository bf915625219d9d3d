"""train.py and the training library: config composition, tiny real training runs, W&B offline files read
back, checkpoints/resume, faults (NaN, signals, kill -9 during a save), DDP on 2 CPU processes, benchmark."""

from __future__ import annotations

import sys

import torch

from ..helpers import ROOT


# ------------------------------------------------------------------------------------------- benchmark
def test_benchmark_quick_smoke(tmp_path):
    sys.path.insert(0, str(ROOT))
    from benchmarks.train_throughput import run

    result = run(quick=True)
    assert result["engine_samples_per_s"] > 0 and result["loop_samples_per_s"] > 0
    assert result["ratio"] > 0 and result["torch"] == torch.__version__
