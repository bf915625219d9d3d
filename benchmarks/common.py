"""Shared pieces of the benchmark suites: interleaved timing, the environment of a row, result files, the
families a suite runs (from the registry), the time budget, the one way a suite's verdicts are computed, and the one
door of every suite's and study's command line (:class:`CommandLine`).

**Verdicts.** A suite states its targets in one function, ``checks(result) -> [Check, ...]``: each check is a label,
the measured number read from the result (None where it was not measured: skipped, out of budget, missing from a
stored report), a comparison and a limit. :func:`judge` turns them into ``result["verdicts"]`` (label -> True, False
or None) and ``result["status"]``; it runs on a fresh result and on a stored one alike, so re-judging a report is
the same computation with the current targets.
"""

from __future__ import annotations

import argparse
import gzip
import importlib
import json
import math
import operator
import os
import platform
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

import torch

import zoo
from zoo.errors import ZooError
from zoo.files import atomic_write, write_json
from zoo.latency import NetworkTimingSettings, resolve_device, resolve_dtype
from zoo.latency.accuracy import time_interleaved
from zoo.latency.device import device_name, synchronize
from zoo.models.registry import Family
from zoo.pruning.search import Choice, dp_search, fastest_plan

RESULTS_DIR = Path(__file__).resolve().parent / "results"
CONF = Path(__file__).resolve().parents[1] / "conf"
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


def verdict_table(checks: Iterable[Check]) -> str:
    """The checks as a markdown table: target, measured number, verdict (what docs/benchmarks.md keeps of a run)."""
    def number(value: Any) -> str:
        return "not measured" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)

    rows = ["| target | measured | verdict |", "|---|---|---|"]
    for check in checks:
        word = {True: "met", False: "**not met**", None: "not measured"}[check.verdict]
        rows.append(f"| {check.label} ({check.op} {number(check.limit)}) | {number(check.measured)} | {word} |")
    return "\n".join(rows)


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


LAB = "studies"  # where the research protocols live: a result of theirs is judged by the same rules


def suite_module(name: str) -> Any:
    """The module of a suite (``benchmarks.<name>``) or of a study (``studies.<name>``) that owns a result's checks;
    a name that is neither raises :class:`BenchmarkInputError`."""
    from importlib.util import find_spec

    for package in ("benchmarks", LAB):
        if isinstance(name, str) and name.isidentifier() and find_spec(f"{package}.{name}") is not None:
            module = importlib.import_module(f"{package}.{name}")
            if hasattr(module, "checks"):
                return module
    raise BenchmarkInputError(f"{name!r} is not a suite or a study with targets; `python -m benchmarks list` names "
                              "the suites, studies/__init__.py the studies.")


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


def time_calls(fn: Callable[[], Any], count: int, device: torch.device) -> list[float]:
    """Seconds of `count` separate calls of fn."""
    times = []
    for _ in range(count):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return times


def warm_up(fns: list[Callable[[], Any]], seconds: float, device: torch.device) -> None:
    """Call the functions in turn for at least `seconds` (a time-based warm-up, not a count)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for fn in fns:
            fn()
    synchronize(device)


SESSION_TIMING = NetworkTimingSettings(min_rounds=20, max_rounds=60, max_time_s=240.0)
"""Whole networks in a table suite's prediction session (the original, calibration and 12-20 held-out plans): 20-60
rounds each, until its median converged. ``prune.py`` times its two networks 200-400 rounds (``NetworkTimingSettings``
defaults); a session of 20 networks at that count would take most of an hour."""


def exact_rounds(calib: NetworkTimingSettings, rounds: int) -> NetworkTimingSettings:
    """`calib` timing every network exactly `rounds` rounds: no convergence stop and no practical time cap."""
    return replace(calib, min_rounds=rounds, max_rounds=rounds, max_time_s=3600.0)


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


def write_result(name: str, payload: dict[str, Any], out: str | Path | None = None, compress: bool = False) -> Path:
    """Write one suite's JSON result (``<name>.json``, or ``<name>.json.gz`` with `compress`: a study's raw cells) and
    return its path. Atomically: a reader never sees half a result."""
    if not compress:
        return write_json(results_dir(out) / f"{name}.json", payload)
    text = json.dumps(payload, indent=1, default=str).encode()
    return atomic_write(results_dir(out) / f"{name}.json.gz", lambda tmp: tmp.write_bytes(gzip.compress(text, 9)))


class BenchmarkInputError(ZooError):
    """A stored result or report that cannot be read or judged: missing, not JSON, or not of a suite's shape."""


def read_json(path: str | Path) -> Any:
    """A result file as written by :func:`write_result` (gzip-compressed when its name ends in ``.gz``); one that is
    missing or not JSON raises :class:`BenchmarkInputError` saying so."""
    allowed = "a report or result file that python -m benchmarks (or a study) wrote"
    try:
        data = Path(path).read_bytes()
        return json.loads(gzip.decompress(data) if str(path).endswith(".gz") else data)
    except OSError as exc:
        raise BenchmarkInputError(f"{path} cannot be read ({exc.strerror or exc}); give {allowed}.") from None
    except (ValueError, EOFError) as exc:  # JSON, UTF-8 and gzip decoding errors
        raise BenchmarkInputError(f"{path} is not JSON ({type(exc).__name__}: {str(exc).splitlines()[0]}); give "
                                  f"{allowed}.") from None


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


def compose(overrides: list[str], output_dir: Path) -> Any:
    """A real Hydra composition of conf/prune.yaml, outside a Hydra run (output dir given explicitly)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from zoo.jobs.cli import register_resolvers
    from zoo.jobs.prune_config import register_configs
    from zoo.jobs.train_config import canonical_model_name

    register_configs(CONF)
    register_resolvers()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = hydra_compose(config_name="prune", overrides=[*overrides, f"paths.output_dir={output_dir}"])
    canonical_model_name(cfg)  # model=timm/hf model.name=<name>: the registry's name, as a run sets it
    return cfg


def speed_plan(table: Any, target: float) -> dict[str, Any] | None:
    """The DP's plan for `target` x on `table` with damage = units removed (None when the target is out of reach)."""
    options = [[Choice(variant, cost, float(len(variant))) for variant, cost in costs]
               for costs in table.segment_costs()]
    budget = table.predict({"remove": []}) / target - table.fixed_cost()
    if fastest_plan(options).latency > budget:
        return None
    result = dp_search(options, budget, bins=2000)
    return {"remove": result.removed(options), "merge": table.merge}


# ------------------------------------------------------------------------------------------------ the command line
class CommandLine(argparse.ArgumentParser):
    """The door of every suite's and study's command line: each argument is read by a type that checks it against
    what the command can do (:func:`count`, :func:`positive`, :func:`out_folder`, :func:`out_file`,
    :func:`names_from`, :func:`result_of`, :func:`run_folder`), then what they ask for together (`check`), all before
    any work; a wrong one is one line (``error: <command>: argument --seeds: ...``, with what is allowed) and exit
    status 2 through :func:`zoo.errors.run_command`. `command`: how the user ran it (``studies.timm_prune``)."""

    def __init__(self, command: str | None = None, doc: str | None = None,
                 check: Callable[[argparse.Namespace], str | None] | None = None, **kwargs: Any) -> None:
        if command is not None:  # (a sub-command's parser is made by argparse, with its own prog)
            kwargs.update(prog=f"python -m {command}", description=(doc or command).strip().splitlines()[0])
        super().__init__(**kwargs)
        self.check = check  # what the arguments ask for together that the command cannot do (None: nothing)

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        parsed = super().parse_args(args, namespace)
        problem = self.check(parsed) if self.check is not None else None
        if problem:
            self.error(problem)
        return parsed

    def error(self, message: str) -> NoReturn:
        raise BenchmarkInputError(f"{self.prog}: {message.splitlines()[0]}") from None


def at_least(minimum: int, what: str = "a whole number") -> Callable[[str], int]:
    """A whole number, `minimum` or more."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}; give {minimum} or more") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is below {minimum}; give {minimum} or more")
        return value

    return parse


def finite_from(low: float, inclusive: bool) -> Callable[[str], float]:
    """A finite number above `low` (or from it, `inclusive`)."""
    allowed = f"a finite number {'of' if inclusive else 'above'} {low:g}{' or more' if inclusive else ''}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number; give {allowed}") from None
        if not math.isfinite(value) or value < low or (value == low and not inclusive):
            raise argparse.ArgumentTypeError(f"{text} is not {allowed}")
        return value

    return parse


count = at_least(1)  # seeds, rounds, pairs, batch sizes
whole = at_least(0)  # an optional count, a first seed
positive = finite_from(0.0, inclusive=False)  # hours, seconds
non_negative = finite_from(0.0, inclusive=True)


def _writable_dir(path: Path) -> bool:
    """Whether `path` (a folder, or one that can be made) can be written: its nearest existing ancestor is a
    writable folder."""
    existing = path
    while not existing.exists():
        if existing.parent == existing:
            return False
        existing = existing.parent
    return existing.is_dir() and os.access(existing, os.W_OK | os.X_OK)


def out_folder(text: str) -> str:
    """``--out``: a folder this command may write its result into (made if missing), not a file."""
    path = Path(text).expanduser()
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty; give a folder for the result (default: benchmarks/results)")
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file; give a folder for the result file (made if missing)")
    if not _writable_dir(path):
        raise argparse.ArgumentTypeError(f"{text} cannot be written here; give a folder you can write to")
    return text


def out_file(text: str) -> Path:
    """An output file: not a folder, in a folder this command may write to."""
    path = Path(text).expanduser()
    if not text.strip() or path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is {'a folder' if text.strip() else 'empty'}; give a file name")
    if not _writable_dir(path.parent if str(path.parent) else Path(".")):
        raise argparse.ArgumentTypeError(f"{path.parent} cannot be written here; give a file in a folder you can "
                                         "write to")
    return path


def names_from(allowed: Iterable[str], what: str) -> Callable[[str], list[str]]:
    """A comma-separated list of `what`, each one of `allowed` (in the order given, each once)."""
    choices = list(allowed)

    def parse(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",") if n.strip()]
        unknown = [n for n in names if n not in choices]
        if not names or unknown:
            given = f"unknown {what} {', '.join(map(repr, unknown))}" if unknown else f"no {what} given"
            raise argparse.ArgumentTypeError(f"{given}; allowed (comma-separated): {', '.join(choices)}")
        return list(dict.fromkeys(names))

    return parse


def result_of(suite: str, fields: Sequence[str] = ()) -> Callable[[str], str]:
    """``--resume``/``--summarise``: a JSON result that this suite or study wrote (its ``suite`` is `suite`, and it
    holds `fields`), read once here; returns the path."""
    wanted = f"a {suite} result that python -m {'benchmarks' if suite in SUITES_HERE else 'studies'}.{suite} wrote"

    def parse(text: str) -> str:
        try:
            stored = read_json(text)
        except BenchmarkInputError as error:
            raise argparse.ArgumentTypeError(f"{str(error).split('; give')[0]}; give {wanted}") from None
        named = stored.get("suite", stored.get("benchmark")) if isinstance(stored, dict) else None
        missing = [f for f in fields if not isinstance(stored, dict) or f not in stored]
        if named != suite or missing:
            found = f"its suite is {named!r}" if named != suite else f"it has no {', '.join(missing)}"
            raise argparse.ArgumentTypeError(f"{text} is not a {suite} result ({found}); give {wanted}")
        return text

    return parse


SUITES_HERE = {p.stem for p in Path(__file__).parent.glob("*.py") if not p.stem.startswith("_")}


def existing_file(text: str) -> Path:
    """A file that exists (an input of the command)."""
    path = Path(text).expanduser()
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text} is {'a folder' if path.is_dir() else 'missing'}; give a file")
    return path



def model_name(text: str) -> str:
    """A model the zoo can build: a registered name, or ``timm/<name>``."""
    if not zoo.is_model(text):
        raise argparse.ArgumentTypeError(f"unknown model {text!r}; allowed: a name python -m zoo list shows, or "
                                         "timm/<name>")
    return text


def run_folder(text: str) -> Path:
    """The folder of a finished ``prune.py`` run (it holds results.json)."""
    path = Path(text).expanduser()
    if not (path / "results.json").is_file():
        raise argparse.ArgumentTypeError(f"{text} holds no results.json; give the folder of a finished prune.py run")
    return path
