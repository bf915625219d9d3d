"""Shared pieces of the benchmark suites: interleaved timing, the environment of a row, result files, the
families a suite runs (from the registry), the time budget, and the one way a suite's verdicts are computed.

**Verdicts.** A suite states its targets in one function, ``checks(result) -> [Check, ...]``: each check is a label,
the measured number read from the result (None where it was not measured: skipped, out of budget, missing from a
stored report), a comparison and a limit. :func:`judge` turns them into ``result["verdicts"]`` (label -> True, False
or None) and ``result["status"]``; it runs on a fresh result and on a stored one alike, so re-judging a report is
the same computation with the current targets.
"""

from __future__ import annotations

import importlib
import operator
import os
import platform
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch

import zoo
from zoo.files import write_json
from zoo.latency import NetworkTimingSettings, resolve_device, resolve_dtype
from zoo.latency.device import device_name
from zoo.latency.networks import time_interleaved
from zoo.models.registry import Family

RESULTS_DIR = Path(__file__).resolve().parent / "results"
STATUSES = ("passed", "failed", "error", "skipped", "incomplete")
OPS: dict[str, Callable[[Any, Any], bool]] = {"<=": operator.le, ">=": operator.ge, "<": operator.lt,
                                             ">": operator.gt, "==": operator.eq, "!=": operator.ne}


# -------------------------------------------------------------------------------------------------- verdicts
class Check(NamedTuple):
    """One stated target applied to one measured number (None: not measured)."""

    label: str
    measured: Any
    op: str
    limit: Any

    @property
    def verdict(self) -> bool | None:
        """Whether the number meets the target; None when it was not measured (never passed)."""
        if self.measured is None:
            return None
        return bool(OPS[self.op](self.measured, self.limit))


def verdicts(checks: Iterable[Check]) -> dict[str, bool | None]:
    """Each check's verdict by label (a label stated twice is a bug in the suite)."""
    out: dict[str, bool | None] = {}
    for check in checks:
        if check.label in out:
            raise ValueError(f"target {check.label!r} is stated twice")
        out[check.label] = check.verdict
    return out


def status(result: Mapping[str, Any], judged: Mapping[str, bool | None]) -> str:
    """``error`` (the suite raised), ``skipped`` (nothing ran or nothing was measured), ``failed`` (a target is not
    met), ``incomplete`` (some targets not measured, or none stated) or ``passed`` (every target measured and met)."""
    if "error" in result:
        return "error"
    if "skipped" in result:
        return "skipped"
    values = list(judged.values())
    if any(v is False for v in values):
        return "failed"
    if values and all(v is None for v in values):
        return "skipped"
    return "passed" if values and all(v is True for v in values) else "incomplete"


def suite_module(name: str) -> Any:
    return importlib.import_module(f"benchmarks.{name}")


def judge(name: str, result: dict[str, Any]) -> dict[str, Any]:
    """`result` of suite `name` with ``verdicts`` and ``status`` computed from the suite's current targets
    (``checks``); a stored result's own verdicts are replaced, never trusted."""
    if "error" in result:
        judged: dict[str, bool | None] = {}
    elif "skipped" in result:  # the suite did not run (no CUDA, no fla, out of budget): its targets not measured
        judged = {f"{name}: not run": None}
    else:
        judged = verdicts(suite_module(name).checks(result))
    result["verdicts"] = judged
    result["status"] = status(result, judged)
    return result


def exit_code(statuses: Iterable[str]) -> int:
    """0: every suite passed; 1: one failed or raised; 3: nothing failed, but some work was skipped or incomplete."""
    found = set(statuses)
    if found & {"failed", "error"}:
        return 1
    return 0 if found == {"passed"} else 3


# ---------------------------------------------------------------------------------------------- time budget
class Budget:
    """Seconds left of a run's time budget; a piece of work starts only with `min_start_s` of it left."""

    def __init__(self, seconds: float = float("inf"), min_start_s: float = 0.0):
        self.seconds, self.min_start_s = seconds, min_start_s
        self.end = time.perf_counter() + seconds

    def left(self) -> float:
        return self.end - time.perf_counter()

    def allows(self) -> bool:
        return self.left() >= self.min_start_s

    def reason(self) -> str:
        return f"time budget ({max(self.left(), 0.0):.0f} s left of {self.seconds:g} s)"


def within_budget(items: Sequence[Any], label: Callable[[Any], str], run: Callable[[Any], dict[str, Any]],
                  budget: Budget | None) -> dict[str, Any]:
    """``{label(item): run(item)}``; an item that would start too late is recorded as skipped (not measured)."""
    out: dict[str, Any] = {}
    for item in items:
        out[label(item)] = run(item) if budget is None or budget.allows() else {"skipped": budget.reason()}
    return out


# ------------------------------------------------------------------------------------------------- families
def families(capability: str | None = None, task: str | None = None) -> list[Family]:
    """The declared families (:func:`zoo.models.registry.list_families`, plugins loaded): a suite runs these, so a new
    family is benchmarked with no list edited."""
    zoo.models.registry.load_plugins()
    return zoo.list_families(capability=capability, task=task)


def family_of(model: str) -> Family:
    """The family a registered model belongs to."""
    return zoo.get_family(zoo.get_entry(model).family)


def smoke_model(capability: str | None = None) -> str:
    """The smoke tests' model: the small member of the first classification family (with `capability`) that needs
    no options to be small."""
    return next(f.small for f in families(capability, "classification") if not f.small_options)


def machine(device: torch.device | str) -> dict[str, Any]:
    """Versions, and on CUDA the device and the settings that change GPU timings (a run report's environment)."""
    import numpy
    import timm

    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__, "timm": timm.__version__,
                           "numpy": numpy.__version__, "cuda": torch.version.cuda}
    try:
        import fla

        env["fla"] = getattr(fla, "__version__", "?")
    except ImportError:
        env["fla"] = None
    dev = torch.device(device)
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        env.update(device=props.name, capability=f"{props.major}.{props.minor}", sms=props.multi_processor_count,
                   memory_gib=round(props.total_memory / 2**30, 1), cudnn=torch.backends.cudnn.version(),
                   cudnn_benchmark=torch.backends.cudnn.benchmark, tf32_cudnn=torch.backends.cudnn.allow_tf32,
                   tf32_matmul=torch.backends.cuda.matmul.allow_tf32)
    else:
        env["device"] = device_name(dev)
    return env


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
    settings = NetworkTimingSettings(warmup_s=warmup_s, net_warmup_s=min(0.5, warmup_s), runs_per_round=runs_per_round,
                                     min_rounds=rounds, max_rounds=rounds, rel_tol=0.0, max_time_s=max_time_s)
    benches = time_interleaved(list(callables.values()), args, {}, dev, resolve_dtype(dtype, dev), threads, settings,
                               cuda_graph)
    return {name: bench.summary() for name, bench in zip(callables, benches)}


def write_result(name: str, payload: dict[str, Any], out: str | Path | None = None) -> Path:
    """Write one suite's JSON result and return its path."""
    return write_json(results_dir(out) / f"{name}.json", payload)  # atomically: a reader never sees half a result


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|, in fp32."""
    a, b = a.detach().float(), b.detach().float()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """A markdown table of `rows` restricted to `columns` (floats with 3 decimals)."""
    def cell(value: Any) -> str:
        return f"{value:.3f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines)
