"""Shared pieces of the benchmark suites: interleaved timing, the environment of a row, result files."""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from zoo.latency import Bench, resolve_device, resolve_dtype
from zoo.latency.device import device_name, timing_context

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
    """Time several callables on the same inputs in interleaved rounds (A B C A B C ...), so drift hits all alike.

    Returns each callable's robust summary (median_ms, iqr_ms, rel_uncertainty, ...).
    """
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    benches = {name: Bench(fn, tuple(args), {}, dev, cuda_graph) for name, fn in callables.items()}
    with timing_context(dev, torch_dtype, threads):
        next(iter(benches.values())).warmup(warmup_s)
        for bench in benches.values():
            bench.warmup(min(0.5, warmup_s))
        start = time.perf_counter()
        for _ in range(rounds):
            for bench in benches.values():
                bench.run(min_runs=runs_per_round, discard=1)
            if time.perf_counter() - start > max_time_s:
                break
    return {name: bench.summary() for name, bench in benches.items()}


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
