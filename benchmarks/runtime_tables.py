"""Latency tables in the runtime you deploy with: prediction error per runtime, and the same plans across runtimes.

For each model, in every runtime (eager, compile, onnxruntime; tensorrt and onnxruntime's CUDA EP on a GPU):

1. build the model's table in that runtime into a fresh cache (compile/export cost included in the build time);
2. choose the plan for each target speed-up (1.5x, 2.0x) with the DP on that runtime's table (damage = units removed,
   so the DP removes as little as the budget allows: this suite measures speed, not accuracy);
3. measure, in one interleaved session per runtime, the original (twice: the noise floor), `plans` random plans and
   every runtime's chosen plans: the table's raw prediction error over the random plans, and each chosen plan's
   measured speed-up in every runtime (the plan chosen in eager, measured under onnxruntime, and so on).

Verdicts (computed): a runtime's table passes when its raw error is at most mean 5 % / max 10 % over the random plans
(or 1.5x the noise floor, if larger); a chosen plan passes when its measured speed-up in the runtime it was chosen in
is at least 0.9x its target. Beside the raw verdict, the same limits are applied to the anchored error (the prediction
scaled by the original network measured in the same session: the error of the predicted speed-up, which is what a
``target_speedup`` search uses); the two differ by the machine's drift between the table's build and the session.

    python -m benchmarks.runtime_tables [--quick] [--device cpu] [--models a,b] [--runtimes eager,compile,onnxruntime]
        [--plans 20] [--compile-plans N] [--input-size 224] [--batch-size 1] [--out DIR]
    python -m benchmarks.runtime_tables --summarise RESULT.json   # verdicts recomputed from stored errors
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import environment, write_result
from zoo.latency import CalibrationSettings, TableSettings, build_table, evaluate, random_plans, resolve_device
from zoo.latency.runtime import RuntimeFailure, check_runtime, tensorrt_backend
from zoo.search import Choice, dp_search

MODELS = ("mobilenetv2_100", "tresnet_m", "resnetv2_50x1_bit")
TARGETS = (1.5, 2.0)
MEAN_LIMIT, MAX_LIMIT, NOISE_FACTOR, SPEEDUP_SHARE = 0.05, 0.10, 1.5, 0.9


def runtimes_here(device: torch.device) -> list[str]:
    """Every runtime this machine has for `device`."""
    found = []
    for runtime in ("eager", "compile", "onnxruntime", "tensorrt"):
        try:
            check_runtime(runtime, device)
            found.append(runtime)
        except RuntimeFailure:
            continue
    return found


def speed_plan(table: Any, target: float) -> dict[str, Any] | None:
    """The DP's plan for `target` x on `table` with damage = units removed (None when the target is out of reach)."""
    options = [[Choice(variant, cost, float(len(variant))) for variant, cost in costs]
               for costs in table.segment_costs()]
    budget = table.predict({"remove": []}) / target - table.fixed_cost()
    fastest = sum(min(c.latency for c in seg) for seg in options)
    if fastest > budget:
        return None
    result = dp_search(options, budget, bins=2000)
    return {"remove": result.removed(options), "merge": table.merge}


def table_row(table: Any, evaluation: Any, n_random: int) -> dict[str, Any]:
    """The table's raw error over the random plans (results 1..n_random) and its computed verdict."""
    random_results = evaluation.results[1:1 + n_random]
    errors = [abs(r.error(False)) for r in random_results]
    anchored = [abs(r.anchored_error()) for r in random_results]
    noise = evaluation.noise_floor
    mean_limit, max_limit = max(MEAN_LIMIT, NOISE_FACTOR * noise), max(MAX_LIMIT, NOISE_FACTOR * noise)
    mean, worst = statistics.fmean(errors), max(errors)
    return with_verdicts({"entries": table.n_entries, "build_s": round(table.build_s, 1),
            "runtime_build_s": round(table.runtime_build_s, 1), "runtime_version": table.condition["runtime_version"],
            "original_ms": evaluation.results[0].measured_ms, "predicted_original_ms": table.predict(corrected=False),
            "n_plans": n_random, "mean_error": mean, "max_error": worst,
            "mean_error_anchored": statistics.fmean(anchored), "max_error_anchored": max(anchored),
            "noise_floor": noise, "drift": evaluation.drift, "limits": [mean_limit, max_limit],
            "session_s": round(evaluation.time_s, 1),
            "plans": [{"removed": len(r.plan["remove"]), "measured_ms": r.measured_ms,
                       "predicted_raw_ms": r.predicted_raw_ms, "error": r.error(False)} for r in random_results]})


def with_verdicts(row: dict[str, Any]) -> dict[str, Any]:
    """`row` with its raw and anchored verdicts: mean and max error within the row's limits."""
    mean_limit, max_limit = row["limits"]
    row["passed"] = row["mean_error"] <= mean_limit and row["max_error"] <= max_limit
    row["passed_anchored"] = row["mean_error_anchored"] <= mean_limit and row["max_error_anchored"] <= max_limit
    return row


def overall(result: dict[str, Any]) -> dict[str, Any]:
    """`result` with its overall verdicts: every table (raw / anchored) and every chosen plan's speed-up passed."""
    speedups = all(s["passed"] for r in result["models"] for s in r["speedups"])
    tables = [t for r in result["models"] for t in r["tables"].values()]
    result["passed"] = speedups and all(t["passed"] for t in tables)
    result["passed_anchored"] = speedups and all(t["passed_anchored"] for t in tables)
    return result


def summarise_again(path: str | Path) -> dict[str, Any]:
    """A stored result with every verdict recomputed from its stored errors and limits (no measuring)."""
    import json

    result = json.loads(Path(path).read_text())
    for r in result["models"]:
        for t in r["tables"].values():
            with_verdicts(t)
    return overall(result)


def bench_model(name: str, device: str, runtimes: list[str], n_plans: dict[str, int], input_size: int,
                batch_size: int, settings: TableSettings, calib: CalibrationSettings) -> dict[str, Any]:
    """Tables, chosen plans and the cross-runtime measurements of one model."""
    tables, chosen = {}, {}
    with tempfile.TemporaryDirectory() as cache_dir:
        for runtime in runtimes:
            start = time.perf_counter()
            tables[runtime] = build_table(name, batch_size=batch_size, input_size=input_size, device=device,
                                          cache_dir=cache_dir, settings=settings, runtime=runtime)
            print(f"{name} {runtime}: table of {tables[runtime].n_entries} entries in {time.perf_counter() - start:.0f}"
                  " s", flush=True)
            for target in TARGETS:
                chosen[(runtime, target)] = speed_plan(tables[runtime], target)
    plans = [(key, plan) for key, plan in chosen.items() if plan is not None]
    rows, cross = {}, []
    for runtime in runtimes:
        table = tables[runtime]
        randoms = random_plans(table.segments, n_plans[runtime], seed=1, merge=table.merge)
        evaluation = evaluate(table, randoms + [plan for _, plan in plans], calib)
        rows[runtime] = table_row(table, evaluation, len(randoms))
        print(f"{name} {runtime}: error mean {rows[runtime]['mean_error']:.1%} / max {rows[runtime]['max_error']:.1%}"
              f" over {len(randoms)} plans (noise floor {rows[runtime]['noise_floor']:.1%})", flush=True)
        original = evaluation.results[0].measured_ms
        for ((chosen_in, target), plan), result in zip(plans, evaluation.results[1 + len(randoms):]):
            cross.append({"chosen_in": chosen_in, "target": target, "measured_in": runtime,
                          "removed": len(plan["remove"]), "measured_speedup": original / result.measured_ms,
                          "predicted_speedup": table.predict({"remove": []}, corrected=False) / result.predicted_raw_ms,
                          "pruned_ms": result.measured_ms, "original_ms": original})
    speedups = []
    for runtime in runtimes:
        for target in TARGETS:
            own = next((c for c in cross if c["chosen_in"] == runtime and c["measured_in"] == runtime
                        and c["target"] == target), None)
            reachable = chosen[(runtime, target)] is not None
            speedups.append({"runtime": runtime, "target": target, "reachable": reachable,
                             "measured_speedup": own["measured_speedup"] if own else None,
                             "passed": bool(own and own["measured_speedup"] >= SPEEDUP_SHARE * target)})
    return {"model": name, "input_size": input_size, "batch_size": batch_size, "tables": rows, "cross": cross,
            "speedups": speedups}


def run(quick: bool = False, device: str = "cpu", models: list[str] | None = None, runtimes: list[str] | None = None,
        plans: int = 20, compile_plans: int | None = None, input_size: int = 224, batch_size: int = 1,
        out: str | Path | None = None) -> dict[str, Any]:
    """Every model in every runtime; writes ``runtime_tables.json`` (``runtime_tables_quick.json`` with quick)."""
    dev = resolve_device(device)
    runtimes = runtimes or runtimes_here(dev)
    for runtime in runtimes:
        check_runtime(runtime, dev)
    if quick:
        models, plans, compile_plans, input_size = models or ["mobilenetv2_035"], 3, 2, 32
        settings = TableSettings(warmup_s=0.2, entry_warmup_s=0.0, min_rounds=3, max_rounds=5)
        calib = CalibrationSettings(warmup_s=0.2, net_warmup_s=0.0, min_rounds=3, max_rounds=5)
    else:
        settings = TableSettings()
        calib = CalibrationSettings(max_rounds=60, max_time_s=240.0)
    n_plans = {r: compile_plans if r == "compile" and compile_plans is not None else plans for r in runtimes}
    start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for name in models or MODELS:  # the file is rewritten after each model: a long run keeps what it measured
        rows.append(bench_model(name, str(dev), runtimes, n_plans, input_size, batch_size, settings, calib))
        result = {"suite": "runtime_tables", "quick": quick, "runtimes": runtimes,
                  "tensorrt_backend": tensorrt_backend(), "env": environment(dev, torch.float32, batch_size,
                                                                             settings.threads),
                  "models": rows, "complete": len(rows) == len(models or MODELS),
                  "time_s": round(time.perf_counter() - start, 1)}
        overall(result)
        write_result("runtime_tables_quick" if quick else "runtime_tables", result, out)
    return result


def _pct(value: float) -> str:
    return f"{value:.1%}"


def markdown(result: dict[str, Any]) -> str:
    """The per-runtime error table, then the speed-up of each chosen plan in every runtime."""
    lines = ["| model | runtime | entries | build s (compile/export s) | original ms | raw error mean / max | "
             "verdict | drift | anchored error mean / max | verdict | noise floor | limit mean / max |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["models"]:
        for runtime, t in r["tables"].items():
            anchored = (f"{_pct(t['mean_error_anchored'])} / {_pct(t['max_error_anchored'])} | "
                        f"{'pass' if t['passed_anchored'] else 'FAIL'}")
            lines.append(f"| {r['model']} | {runtime} | {t['entries']} | {t['build_s']} ({t['runtime_build_s']}) | "
                         f"{t['original_ms']:.2f} | {_pct(t['mean_error'])} / {_pct(t['max_error'])} over "
                         f"{t['n_plans']} plans | {'pass' if t['passed'] else 'FAIL'} | {t['drift']:+.1%} | "
                         f"{anchored} | {_pct(t['noise_floor'])} | {_pct(t['limits'][0])} / {_pct(t['limits'][1])} |")
    runtimes = result["runtimes"]
    lines += ["", "Measured speed-up of the plan chosen in one runtime (rows) in every runtime (columns); the "
              "diagonal is the target check (>= 0.9x target):", "",
              "| model | target | chosen in | " + " | ".join(f"in {rt}" for rt in runtimes) + " | verdict |",
              "|---|---|---|" + "---|" * len(runtimes) + "---|"]
    for r in result["models"]:
        for s in r["speedups"]:
            cells = []
            for rt in runtimes:
                c = next((c for c in r["cross"] if c["chosen_in"] == s["runtime"] and c["target"] == s["target"]
                          and c["measured_in"] == rt), None)
                cells.append("-" if c is None else f"{c['measured_speedup']:.2f}x")
            verdict = "pass" if s["passed"] else ("out of reach" if not s["reachable"] else "FAIL")
            lines.append(f"| {r['model']} | {s['target']}x | {s['runtime']} | " + " | ".join(cells) + f" | {verdict} |")
    env = result["env"]
    lines += ["", f"{env['device']}, batch {result['models'][0]['batch_size']}, input "
              f"{result['models'][0]['input_size']}, {env['threads']} thread(s), torch {env['torch']}; overall: "
              f"{'pass' if result['passed'] else 'FAIL'} (raw errors and speed-ups), "
              f"{'pass' if result['passed_anchored'] else 'FAIL'} (anchored errors and speed-ups) "
              f"({result['time_s']:.0f} s)."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--models", default=None, help=f"comma-separated (default {','.join(MODELS)})")
    parser.add_argument("--runtimes", default=None, help="comma-separated (default: every runtime this machine has)")
    parser.add_argument("--plans", type=int, default=20)
    parser.add_argument("--compile-plans", type=int, default=None, help="random plans under compile (default --plans)")
    parser.add_argument("--input-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--out", default=None)
    parser.add_argument("--summarise", default=None, metavar="JSON",
                        help="recompute the verdicts of a stored result and print its tables (no measuring)")
    args = parser.parse_args(argv)
    if args.summarise:
        print(markdown(summarise_again(args.summarise)))
        return
    result = run(args.quick, args.device, args.models.split(",") if args.models else None,
                 args.runtimes.split(",") if args.runtimes else None, args.plans, args.compile_plans,
                 args.input_size, args.batch_size, args.out)
    print(markdown(result))


if __name__ == "__main__":
    main()
