"""Where a deploy runtime's table error comes from: the whole network in the runtime, the same network run segment by
segment (each segment compiled or exported on its own, timed in context), and the table, side by side.

One cold table build in `--runtime` (fresh cache), then, for the original and each picked random plan (the
``runtime_tables`` suite's plans: ``random_plans(seed=1)``), in one interleaved session:

* **whole**: the pruned network compiled or exported as one program (what a user deploys, what the suite measures);
* **segmented**: the same network with every segment replaced by its own compiled/exported program, run in sequence
  with hooks at the segment boundaries (:class:`zoo.latency.timing.ContextBench`): each segment's time *in context*
  (the cache state the network leaves it, its weights evicted by the layers since) with one program call each;
* **table**: the table's raw and anchored prediction, and per changed segment its table cost.

If the table's anchored prediction matches *whole*, its entries (chained, timed alone) carry what a segment costs in
the compiled network; if *segmented* minus *whole* is large, the runtime gains across segment boundaries (fusion,
layout kept between programs), which a per-segment table cannot see.

    python -m studies.runtime_diagnosis --model mobilenetv2_100 --runtime compile --plans 4,6,12,0
"""

from __future__ import annotations

import copy
import statistics
import tempfile
import time
from typing import Any

import torch
from torch import nn

from benchmarks.common import (
    CommandLine,
    count,
    environment,
    model_name,
    names_from,
    out_folder,
    write_result,
)
from zoo.errors import run_command
from zoo.latency import TableSettings, build_table, random_plans
from zoo.latency.accuracy import pruned_network
from zoo.latency.device import timing_context
from zoo.latency.measure import Bench, measured_form, prepare, time_rounds
from zoo.latency.runtime import check_runtime, in_runtime
from zoo.latency.timing import ContextBench, hook_overhead_ms
from zoo.pruning.capture import capture_segments
from zoo.pruning.surgery import build_segment


class Program(nn.Module):
    """A compiled or exported segment as a module (hooks can time it inside the network)."""

    def __init__(self, call: Any):
        super().__init__()
        self.call = call

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(self.call(x)[0])


def segmented(table: Any, eager: nn.Module, plan: dict[str, Any], runtime: str, device: torch.device) -> nn.Module:
    """The plan's network (`eager`) with every kept segment replaced by its own program in `runtime` (a copy, checked:
    it computes what `eager` computes, within 1e-4 relative)."""
    net = copy.deepcopy(eager)
    captures = capture_segments(net, table.segments, table.example, {})  # each segment's input inside the network
    for seg, variant, capture in zip(table.segments, table.variants_of(plan), captures):
        module = prepare(measured_form(build_segment(table.model, seg, variant, table.merge), table.settings), device,
                         False)
        if not isinstance(module, nn.Identity):
            net.set_submodule(seg.name, Program(in_runtime(module, capture.args, {}, runtime, device, 1,
                                                           what=seg.name)))
    want, got = eager(table.example), net(table.example)
    error = float((got - want).abs().max() / want.abs().max())
    if error > 1e-4:
        raise AssertionError(f"the segment-by-segment network differs from the plan's network by {error:.1e}")
    return net


def diagnose(model: str, runtime: str, picks: list[int], n_plans: int = 20, rounds: int = 40, input_size: int = 224
             ) -> dict[str, Any]:
    """The side-by-side timings of the original and the picked plans (see the module docstring)."""
    device = torch.device("cpu")
    check_runtime(runtime, device)
    with tempfile.TemporaryDirectory() as cache_dir:
        table = build_table(model, batch_size=1, input_size=input_size, device="cpu", cache_dir=cache_dir,
                            settings=TableSettings(runtime=runtime))
    plans = random_plans(table.segments, n_plans, seed=1, merge=table.merge)
    chosen = [("original", {"remove": [], "merge": table.merge})] + [(f"plan {i}", plans[i]) for i in picks]
    names = [seg.name for seg in table.segments]
    with timing_context(device, torch.float32, 1):
        pairs = []
        for label, plan in chosen:
            eager = pruned_network(table, plan)
            whole = in_runtime(eager, (table.example,), {}, runtime, device, 1, what=label)
            pairs.append((Bench(whole, (table.example,), {}, device, False, table.settings.clock),
                          ContextBench(segmented(table, eager, plan, runtime, device), names, (table.example,), {},
                                       device, table.settings.clock)))
        benches = [b for pair in pairs for b in pair]
        for bench in benches:
            bench.warmup(1.0)
        time_rounds(benches, (rounds, rounds), 1, 0.0, 600.0, warm_calls=table.settings.warm_calls)
        hooks_ms = hook_overhead_ms(device, table.settings.clock)
    estimate = f"{table.settings.estimator}_ms"
    original_ms = pairs[0][0].summary()[estimate]
    anchor = original_ms / table.predict(corrected=False)
    rows = []
    for (label, plan), (whole, ctx) in zip(chosen, pairs):
        predicted = table.predict(plan, corrected=False)
        changed = []
        for i, (name, variant) in enumerate(zip(names, table.variants_of(plan))):
            if variant and name not in variant:
                changed.append({"segment": name, "removed_acts": sorted(variant),
                                "in_context_ms": statistics.median(ctx.segment_ms[name]) - hooks_ms,
                                "table_ms": table.raw_cost(i, variant),
                                "intact_table_ms": table.raw_cost(i, frozenset())})
        measured = whole.summary()[estimate]
        rows.append({"network": label, "removed": len(plan["remove"]), "whole_ms": measured,
                     "segmented_ms": ctx.summary()[estimate], "predicted_raw_ms": predicted,
                     "predicted_anchored_ms": predicted * anchor, "anchored_error": predicted * anchor / measured - 1,
                     "merged_segments": changed})
    return {"suite": "runtime_diagnosis", "model": model, "runtime": runtime, "entries": table.n_records,
            "fixed_ms": table.fixed_raw_ms, "env": environment(device, torch.float32, 1, 1), "rows": rows}


def report(result: dict[str, Any]) -> str:
    lines = [f"{result['model']} under {result['runtime']}: whole network vs segment by segment vs table "
             f"(fixed part {result['fixed_ms']:.2f} ms)", "",
             "| network | removed | whole ms | segmented ms | table ms (anchored) | anchored error | merged segments: "
             "in context - table ms (sum) |", "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        gap = sum(m["in_context_ms"] - m["table_ms"] for m in r["merged_segments"])
        lines.append(f"| {r['network']} | {r['removed']} | {r['whole_ms']:.2f} | {r['segmented_ms']:.2f} | "
                     f"{r['predicted_raw_ms']:.2f} ({r['predicted_anchored_ms']:.2f}) | {r['anchored_error']:+.1%} | "
                     f"{len(r['merged_segments'])}: {gap:+.2f} |")
    return "\n".join(lines)


def command_line() -> CommandLine:
    parser = CommandLine("studies.runtime_diagnosis", __doc__)
    parser.add_argument("--model", type=model_name, default="mobilenetv2_100")
    parser.add_argument("--runtime", default="compile", choices=("compile", "onnxruntime"))
    parser.add_argument("--plans", type=names_from([str(i) for i in range(20)], "plan index"),
                        default=["4", "6", "12", "0"], help="indices into the suite's 20 random plans")
    parser.add_argument("--rounds", type=count, default=40)
    parser.add_argument("--input-size", type=count, default=224)
    parser.add_argument("--out", type=out_folder, default=None)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = command_line().parse_args(argv)
    start = time.perf_counter()
    result = diagnose(args.model, args.runtime, [int(p) for p in args.plans], rounds=args.rounds,
                      input_size=args.input_size)
    result["time_s"] = round(time.perf_counter() - start, 1)
    path = write_result(f"runtime_diagnosis_{args.model}_{args.runtime}", result, args.out)
    print(report(result))
    print(f"({result['time_s']:.0f} s; {path})")


if __name__ == "__main__":
    raise SystemExit(run_command(main))
