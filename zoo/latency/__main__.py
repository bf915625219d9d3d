"""``python -m zoo.latency model=NAME [key=value ...]``: build (or load) a latency table, print it and,
with ``correct=N``, its prediction error over N random plans beside the noise floor and the fitted correction
(:func:`~zoo.latency.accuracy.correct`).

Keys: model, batch_size, input_size (int or [C,H,W] / [T]), device (auto|cpu|cuda|cuda:N), dtype
(float32|bfloat16|float16), channels_last, threads, cache_dir, correct, seed, clock (wall|thread),
estimator (median|p10|min), warmup_s, min_rounds, max_rounds, entries (auto|context|isolated),
cuda_timing (auto|queued|isolated), cuda_graph, runtime (eager|compile|compile_int8|onnxruntime|onnxruntime_int8|
tensorrt|tensorrt_int8: the deploy runtime the records and the prediction check run in; the _int8 ones quantise each
record first: PT2E for torch.compile, static QDQ for onnxruntime, symmetric QDQ for TensorRT), json (write a
summary there). The defaults are prune.py's: the wall clock, one thread, eager, records timed in context on the CPU
(docs/latency.md says why).
Example: ``python -m zoo.latency model=mobilenetv2_100 batch_size=32 device=cuda correct=5``.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import Any

from ..errors import ZooError, run_command
from ..files import check_writable, write_json
from .settings import TableSettings

_TABLE = TableSettings()  # the defaults are prune.py's, declared once


@dataclass
class LatencyConfig:
    model: str = "mobilenetv2_100"
    batch_size: int = 1
    input_size: Any = None
    device: str = "auto"
    dtype: str = "float32"
    channels_last: bool = False
    threads: int = _TABLE.threads
    cache_dir: Any = None
    correct: int = 0
    seed: int = 0
    clock: str = _TABLE.clock
    estimator: str = _TABLE.estimator
    warmup_s: float = _TABLE.warmup_s
    min_rounds: int = _TABLE.min_rounds
    max_rounds: int = _TABLE.max_rounds
    entries: str = _TABLE.entries
    cuda_timing: str = _TABLE.cuda_timing
    cuda_graph: bool = _TABLE.cuda_graph
    runtime: str = _TABLE.runtime
    json: Any = None


def parse_args(argv: list[str]) -> LatencyConfig:
    """key=value arguments (Hydra style, ``--key=value`` accepted too) over :class:`LatencyConfig`."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    items = [a.removeprefix("--") for a in argv]
    bad = [a for a in items if "=" not in a]
    if bad:
        raise ZooError(f"Arguments must be key=value, got {bad}. Keys: {', '.join(LatencyConfig.__annotations__)}.")
    try:
        cfg = OmegaConf.merge(OmegaConf.structured(LatencyConfig), OmegaConf.from_dotlist(items))
    except OmegaConfBaseException as exc:
        first = str(exc).splitlines()[0]
        raise ZooError(f"Bad argument ({first}). Keys: {', '.join(LatencyConfig.__annotations__)}.") from None
    values = OmegaConf.to_container(cfg)
    if isinstance(values["input_size"], list):
        values["input_size"] = tuple(values["input_size"])
    return check(LatencyConfig(**values))


def check(cfg: LatencyConfig) -> LatencyConfig:
    """Checks that need no measurement, so a bad value never costs a table build (raises ZooError)."""
    from pathlib import Path

    for key in ("correct", "min_rounds", "max_rounds"):
        if getattr(cfg, key) < (0 if key == "correct" else 1):
            raise ZooError(f"{key}={getattr(cfg, key)} must be >= {0 if key == 'correct' else 1}.")
    if cfg.warmup_s < 0:
        raise ZooError(f"warmup_s={cfg.warmup_s} must be >= 0.")
    if cfg.json:
        folder = Path(cfg.json).expanduser().resolve().parent
        if not folder.is_dir():
            raise ZooError(f"json={cfg.json}: folder {folder} does not exist; create it or write elsewhere.")
        check_writable(folder, "json (its folder)")
    from ..models.registry import get_entry, get_family
    from .cache import CACHE_ENV, cache_root, default_cache_dir
    from .device import resolve_device, resolve_dtype
    from .runtime import check_runtime

    family = get_family(get_entry(cfg.model).family)  # an unknown model: the closest names
    why = family.refusal("runtime", cfg.runtime.removesuffix("_int8"))
    if why is None and cfg.runtime.endswith("_int8"):
        why = family.refusal("quantize", "int8")
    if why is not None:
        raise ZooError(f"runtime={cfg.runtime} is not possible for model={cfg.model} (the {family.name} family): "
                       f"{why}.")
    device = resolve_device(cfg.device)
    check_runtime(cfg.runtime, device, resolve_dtype(cfg.dtype, device))
    check_writable(cfg.cache_dir or default_cache_dir(), "cache_dir" if cfg.cache_dir else f"${CACHE_ENV}")
    check_writable(cache_root(), f"${CACHE_ENV} (the device timing lock)")
    return cfg


def run(cfg: LatencyConfig) -> dict[str, Any]:
    """Build the table (and, with ``correct=N``, measure its error over N random plans and fit its correction);
    print both; return a JSON-able summary."""
    from . import NetworkTimingSettings, TableSettings, build_table, correct

    settings = TableSettings(threads=cfg.threads, warmup_s=cfg.warmup_s, min_rounds=cfg.min_rounds,
                             max_rounds=cfg.max_rounds, estimator=cfg.estimator, clock=cfg.clock,
                             entries=cfg.entries, cuda_timing=cfg.cuda_timing, cuda_graph=cfg.cuda_graph,
                             runtime=cfg.runtime)
    table = build_table(cfg.model, batch_size=cfg.batch_size, input_size=cfg.input_size, device=cfg.device,
                        dtype=cfg.dtype, channels_last=cfg.channels_last, cache_dir=cfg.cache_dir, settings=settings)
    print(table.format())
    summary: dict[str, Any] = {"table": table.summary()}
    if cfg.correct > 0:
        error = correct(table, cfg.correct, seed=cfg.seed, settings=NetworkTimingSettings())
        print()
        print(error.format())
        print(f"leave-one-out error of the chosen correction: {error.loo_error:.1%}")
        summary["correction"] = error.summary()
    if cfg.json:
        write_json(cfg.json, summary)  # atomically
    return summary


def main(argv: list[str] | None = None) -> int:
    """The command line, inside the error boundary (:func:`zoo.errors.run_command`); returns the exit status."""
    return run_command(lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help", "help") for a in argv):
        print(__doc__)
        return 0
    from ..models.registry import load_plugins

    load_plugins()
    run(parse_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
