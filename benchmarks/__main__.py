"""``python -m benchmarks run [suite ...] [--set gpu_check] [--quick] [--device D] [--budget-s S] [--out DIR]``,
``python -m benchmarks judge REPORT.json``, ``python -m benchmarks merge REPORT.json ... --out MERGED.json``,
``python -m benchmarks list``: the one benchmark runner.

Each suite writes ``benchmarks/results/<suite>.json`` (or under ``--out`` / ``$OUT``) and the run writes a report of
every suite's status, verdicts and result (``<set>.json``, or ``run.json``; :mod:`benchmarks.report`). Unless
``--quick``, ``--no-docs`` or a set, a suite named here replaces its section of ``docs/benchmarks.md`` (between
``<!-- suite:NAME -->`` markers) with its verdicts and the command that produced it.

``run`` with no suite names runs the GPU check (``--set gpu_check``) on CUDA and every suite elsewhere; suites named
with ``--set`` run alone in the set's configuration. The GPU check stops starting new work after ``--budget-s``
(default 360 s: under 8 minutes in all on an H200); what it did not start is recorded as skipped. ``--device cpu
--quick`` is its dry run at tiny sizes (part of the tests). ``merge`` makes one report of a set run over several
calls (short device leases): each suite from the one call that ran it; calls on different machines or versions, or a
suite run twice, are refused.

Statuses: passed (every target measured and met), failed, error (the suite raised), skipped, incomplete (a target not
measured). Exit status: 0 every suite passed, 1 one failed or raised, 3 nothing failed but work was skipped or
incomplete, 2 bad usage.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import exit_code
from benchmarks.report import DEFAULT_BUDGET_S, SETS, digest, judge_file, merge_files, run_suites, statuses
from zoo.errors import run_command as boundary
from zoo.files import atomic_write

SUITES = {
    "zoo_vs_timm": "eval latency of zoo vs timm models (same weights), eager and fused",
    "train_throughput": "training engine vs a hand-written loop, samples/s",
    "latency_table": "latency lookup tables: build time, entries, prediction error over random plans",
    "prune_speedup": "pruned vs unpruned measured speed-up and metric; DP vs greedy vs random",
    "retnet_decode": "RetNet vs KV-cache Transformer decode latency vs context, generate, parallel form vs torchscale",
    "train_memory": "training activation memory with/without gradient checkpointing and bf16, largest batch in a "
                    "budget, checkpointing's step-time cost, what pruning saves",
    "export_parity": "ONNX (onnxruntime) and torch.export programs of every family against PyTorch",
    "runtime_tables": "latency tables built in each deploy runtime (eager, torch.compile, onnxruntime, TensorRT): "
                      "prediction error, and the chosen plans' speed-ups across runtimes",
    "measurement": "timing modes on one network (eager, CUDA graph, bf16, channels_last): events vs wall clock, "
                   "outputs vs eager fp32",
    "prune_search": "DP plans at 1.5x and 2.0x on synthetic inputs, merged, fused and timed beside the unpruned "
                    "network (GPU)",
    "fla": "flash-linear-attention's fused retention kernels vs the PyTorch path (CUDA)",
    "zero_folding": "a removed sub-layer's ops and block latency with its zeros folded away vs left in",
}
DOCS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


def update_docs(name: str, body: str, command: str, path: Path = DOCS, platform: str = "cpu") -> None:
    """Replace (or append) the suite's marked section of docs/benchmarks.md (a suite that records its platform gets
    one section per platform besides the CPU's: ``int8_depth_cuda``)."""
    text = path.read_text() if path.is_file() else "# Benchmarks\n"
    marker = name if platform == "cpu" else f"{name}_{platform}"
    section = (f"<!-- suite:{marker} -->\n### {marker}\n\n{SUITES[name]}. Command: `{command}` "
               f"({time.strftime('%Y-%m-%d')}).\n\n{body}\n<!-- /suite:{marker} -->")
    pattern = re.compile(rf"<!-- suite:{marker} -->.*?<!-- /suite:{marker} -->", re.S)
    text = pattern.sub(lambda _: section, text) if pattern.search(text) else text.rstrip() + "\n\n" + section + "\n"
    atomic_write(path, lambda tmp: tmp.write_text(text))


def on_cuda(device: str) -> bool:
    import torch

    return device == "cuda" or (device == "auto" and torch.cuda.is_available())


def run_suites_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from benchmarks.common import suite_module, verdict_table

    set_name = args.set or (None if args.suites or not on_cuda(args.device) else "gpu_check")
    names = args.suites or list(SETS[set_name] if set_name else SUITES)
    device = "cuda" if args.device == "auto" and on_cuda("auto") else "cpu" if args.device == "auto" else args.device
    if device == "cuda" and not on_cuda("cuda"):
        print("error: no CUDA device; run with --device cpu (with --quick: the dry run)", file=sys.stderr)
        return 2
    budget_s = args.budget_s if args.budget_s is not None else (DEFAULT_BUDGET_S if set_name else None)
    report = run_suites(names, set_name, args.quick, device, args.out, budget_s)
    for name, section in report["suites"].items():
        if "result" in section and "skipped" not in section["result"]:
            body = suite_module(name).markdown(section["result"])
            print(f"## {name} ({section['seconds']:.0f} s, {section['status']})\n{body}\n")
            if not (args.quick or args.no_docs or set_name):
                table = verdict_table(suite_module(name).checks(section["result"]))
                update_docs(name, f"Status: {section['status']}. Result: `{report['path']}`.\n\n{table}",
                            f"python -m benchmarks run {name} --device {args.device}",
                            platform=section["result"].get("platform", "cpu"))
    print(digest(report))
    print(f"report: {report['path']}")
    return exit_code(statuses(report).values())


def command_line() -> argparse.ArgumentParser:
    from benchmarks.common import CommandLine, out_file, out_folder, positive

    parser = CommandLine("benchmarks", __doc__, check=runner_problem)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the suites, and the sets they belong to")
    run_cmd = sub.add_parser("run", help="run suites (or a set) and write their report")
    run_cmd.add_argument("suites", nargs="*", type=suite_name, help="default: on CUDA the gpu_check set, else every "
                         f"suite ({', '.join(SUITES)})")
    run_cmd.add_argument("--set", choices=list(SETS), default=None, help="a named set of suites")
    run_cmd.add_argument("--quick", action="store_true", help="the smallest configuration (a smoke test / dry run)")
    run_cmd.add_argument("--device", choices=("cpu", "cuda", "auto"), default="auto")
    run_cmd.add_argument("--budget-s", type=positive, default=None,
                         help=f"start no new work after this long (a set's default: {DEFAULT_BUDGET_S:g} s)")
    run_cmd.add_argument("--out", type=out_folder, default=None)
    run_cmd.add_argument("--no-docs", action="store_true")
    judge_cmd = sub.add_parser("judge", help="recompute the verdicts of a stored report from its numbers")
    judge_cmd.add_argument("report", help="a run report (<set>.json, run.json, gpu_check.json) or a suite's result")
    judge_cmd.add_argument("--suite", type=suite_name, default=None,
                           help="the suite of a result file that does not name it")
    judge_cmd.add_argument("--out", type=out_file, default=None, help="write the judged report here")
    merge_cmd = sub.add_parser("merge", help="one report from the reports of several calls (a set run over several "
                               "short device leases), judged")
    merge_cmd.add_argument("reports", nargs="+", help="run reports, in the order they were run")
    merge_cmd.add_argument("--set", choices=list(SETS), default=None, help="the set they make up (default: the "
                           "first report's)")
    merge_cmd.add_argument("--out", type=out_file, required=True, help="where the merged report is written")
    return parser


def suite_name(text: str) -> str:
    if text not in SUITES:
        raise argparse.ArgumentTypeError(f"unknown suite {text!r}; allowed: {', '.join(SUITES)}")
    return text


def runner_problem(args: argparse.Namespace) -> str | None:
    """Suites named beside a set they are not in (None: none)."""
    outside = [s for s in getattr(args, "suites", []) if args.set and s not in SETS[args.set]]
    if outside:
        return f"suite(s) {', '.join(outside)} are not in the set {args.set} ({', '.join(SETS[args.set])})"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = command_line()
    return boundary(lambda: command(parser.parse_args(argv), parser))


def command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.command == "merge":
        report, code = merge_files(args.reports, args.set, args.out)
        print(digest(report))
        print(f"report: {args.out}")
        return code
    if args.command == "list":
        member = {name: [s for s, names in SETS.items() if name in names] for name in SUITES}
        for name, text in SUITES.items():
            sets = f" [{', '.join(member[name])}]" if member[name] else ""
            print(f"{name:<18} {text}{sets}")
        return 0
    if args.command == "judge":
        report: Any
        report, code = judge_file(args.report, args.suite, args.out)
        print(digest(report))
        return code
    return run_suites_command(args, parser)


if __name__ == "__main__":
    raise SystemExit(main())
