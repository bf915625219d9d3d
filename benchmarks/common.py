"""Shared pieces of the benchmark suites: interleaved timing, the environment of a row, result files."""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from zoo.latency import CalibrationSettings, resolve_device, resolve_dtype
from zoo.latency.calibrate import time_interleaved
from zoo.latency.device import device_name

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def results_dir(out: str | Path | None = None) -> Path:
    """``--out``, else ``$OUT`` (the GPU machine's return folder), else ``benchmarks/results``."""
    path = Path(out or os.environ.get("OUT") or RESULTS_DIR)
    path.mkdir(parents=True, exist_ok=True)
    return path


def environment(device: torch.device, dtype: torch.dtype, batch: int, threads: int) -> dict[str, Any]:
    """What every benchmark row states: device, dtype, batch, threads, torch version."""
    return {"device": device_name(device), "dtype": str(dtype).removeprefix("torch."), "batch": batch,
            "threads": threads if device.type == "cpu" else None, "torch": torch.__version__,
            "python": platform.python_version()}


def interleaved(callables: Mapping[str, Any], args: Sequence[Any], device: str | torch.device = "cpu",
                dtype: str = "float32", threads: int = 1, warmup_s: float = 2.0, rounds: int = 15,
                runs_per_round: int = 5, max_time_s: float = 60.0, cuda_graph: bool = False) -> dict[str, dict]:
    """Time several callables on the same inputs in `rounds` interleaved rounds, so drift hits all alike.

    Returns each callable's robust summary (median_ms, iqr_ms, rel_uncertainty, ...).
    """
    dev = resolve_device(device)
    settings = CalibrationSettings(warmup_s=warmup_s, net_warmup_s=min(0.5, warmup_s), runs_per_round=runs_per_round,
                                   min_rounds=rounds, max_rounds=rounds, rel_tol=0.0, max_time_s=max_time_s)
    benches = time_interleaved(list(callables.values()), args, {}, dev, resolve_dtype(dtype, dev), threads, settings,
                               cuda_graph)
    return {name: bench.summary() for name, bench in zip(callables, benches)}


def write_result(name: str, payload: dict[str, Any], out: str | Path | None = None) -> Path:
    """Write one suite's JSON result and return its path."""
    path = results_dir(out) / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2, default=str))
    return path


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """A markdown table of `rows` restricted to `columns` (floats with 3 decimals)."""
    def cell(value: Any) -> str:
        return f"{value:.3f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines)
