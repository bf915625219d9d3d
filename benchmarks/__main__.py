"""``python -m benchmarks run [suite ...] [--quick] [--device D] [--no-docs]``: run benchmark suites.

Each suite writes ``benchmarks/results/<suite>.json`` (or under ``$OUT``) and, unless ``--quick`` or
``--no-docs``, replaces its section of ``docs/benchmarks.md`` (between ``<!-- suite:NAME -->`` markers) with
its table and the command that produced it. ``python -m benchmarks list`` names the suites.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import re
import time
from pathlib import Path
from typing import Any

SUITES = {
    "zoo_vs_timm": "eval latency of zoo vs timm models (same weights), eager and fused",
    "train_throughput": "training engine vs a hand-written loop, samples/s",
    "latency_table": "latency lookup tables: build time, entries, prediction error over random plans",
    "prune_speedup": "pruned vs unpruned measured speed-up and metric; DP vs greedy vs random",
    "retnet_decode": "RetNet vs KV-cache Transformer decode latency and training cost vs length",
    "train_memory": "training activation memory with/without gradient checkpointing and bf16, largest batch in a "
                    "budget, checkpointing's step-time cost, what pruning saves",
    "export_parity": "ONNX (onnxruntime) and torch.export programs of every family against PyTorch",
    "runtime_tables": "latency tables built in each deploy runtime (eager, torch.compile, onnxruntime, TensorRT): "
                      "prediction error, and the chosen plans' speed-ups across runtimes",
    "prune_quality": "pruning quality at the measured target (plans within 2 %, or interpolated between two that "
                     "bracket it; cells that reach neither are off target and left out of the tests): the default "
                     "search against random, greedy, SLEB, Block Influence, the "
                     "angular run, reverse order and the previous default, 5 seeds, one-shot / short fine-tune, "
                     "paired tests with Holm's correction",
    "prune_cost": "the whole default prune.py, cold: today's default search and measured-target loop against the "
                  "previous default, in turns",
}
DOCS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


def run_suite(name: str, quick: bool, device: str, out: str | None) -> tuple[dict[str, Any], float]:
    """Run one suite's ``run()`` with the arguments it accepts; returns its result and the wall time."""
    module = importlib.import_module(f"benchmarks.{name}")
    accepted = inspect.signature(module.run).parameters
    kwargs = {k: v for k, v in (("quick", quick), ("device", device), ("out", out)) if k in accepted}
    start = time.perf_counter()
    result = module.run(**kwargs)
    return result, time.perf_counter() - start


def update_docs(name: str, body: str, command: str, path: Path = DOCS) -> None:
    """Replace (or append) the suite's marked section of docs/benchmarks.md."""
    text = path.read_text() if path.is_file() else "# Benchmarks\n"
    section = (f"<!-- suite:{name} -->\n### {name}\n\n{SUITES[name]}. Command: `{command}` "
               f"({time.strftime('%Y-%m-%d')}).\n\n{body}\n<!-- /suite:{name} -->")
    pattern = re.compile(rf"<!-- suite:{name} -->.*?<!-- /suite:{name} -->", re.S)
    text = pattern.sub(lambda _: section, text) if pattern.search(text) else text.rstrip() + "\n\n" + section + "\n"
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list")
    run_cmd = sub.add_parser("run")
    run_cmd.add_argument("suites", nargs="*", help=f"default: all ({', '.join(SUITES)})")
    run_cmd.add_argument("--quick", action="store_true", help="the smallest configuration (a smoke test)")
    run_cmd.add_argument("--device", default="auto")
    run_cmd.add_argument("--out", default=None)
    run_cmd.add_argument("--no-docs", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "list":
        for name, text in SUITES.items():
            print(f"{name:<18} {text}")
        return 0
    unknown = [s for s in args.suites if s not in SUITES]
    if unknown:
        parser.error(f"unknown suite(s) {', '.join(unknown)}; choose from {', '.join(SUITES)}")
    for name in args.suites or list(SUITES):
        result, seconds = run_suite(name, args.quick, args.device, args.out)
        body = importlib.import_module(f"benchmarks.{name}").markdown(result)
        print(f"## {name} ({seconds:.0f} s)\n{body}\n")
        if not (args.quick or args.no_docs):
            update_docs(name, body, f"python -m benchmarks run {name} --device {args.device}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
