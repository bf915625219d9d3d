"""Latency tables in the runtime you deploy with: prediction error per runtime, and the same plans across runtimes.

For each model, in every runtime (eager, compile, onnxruntime; tensorrt and onnxruntime's CUDA EP on a GPU):

1. build the model's table in that runtime into a fresh cache (compile/export cost included in the build time);
2. choose the plan for each target speed-up (1.5x, 2.0x) with the DP on that runtime's table (damage = units removed,
   so the DP removes as little as the budget allows: this suite measures speed, not accuracy);
3. measure, in one interleaved session per runtime, the original (twice: the noise floor), `plans` random plans and
   every runtime's chosen plans: the table's raw prediction error over the random plans, and each chosen plan's
   measured speed-up in every runtime (the plan chosen in eager, measured under onnxruntime, and so on).

Targets (:func:`checks`): a runtime's table has a raw error of at most mean 5 % / max 10 % over the random plans
(or 1.5x the noise floor, if larger); a chosen plan's measured speed-up in the runtime it was chosen in is at least
0.9x its target. Beside the raw errors, the same limits apply to the anchored error (the prediction scaled by the
original network measured in the same session: the error of the predicted speed-up, which is what a
``target_speedup`` search uses); the two differ by the machine's drift between the table's build and the session.

The models: every classification family's reference member (``zoo.list_families(task="classification")``).
In the GPU check (``python -m benchmarks run --set gpu_check``): onnxruntime (CUDA EP) and TensorRT at batch 32, 8
plans; a runtime the machine lacks is recorded as skipped with its reason (its targets: not measured).

    python -m benchmarks.runtime_tables [--quick] [--device cpu] [--models a,b] [--runtimes eager,compile,onnxruntime]
        [--plans 20] [--compile-plans N] [--input-size 224] [--batch-size 1] [--out DIR]
    python -m benchmarks judge RESULT.json --suite runtime_tables   # verdicts recomputed from stored errors
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

import zoo
from benchmarks.common import (
    SESSION_TIMING,
    Budget,
    Check,
    CommandLine,
    count,
    environment,
    families,
    judge,
    names_from,
    out_folder,
    smoke_model,
    speed_plan,
    verdicts,
    write_result,
)
from zoo.errors import run_command
from zoo.latency import (
    NetworkTimingSettings,
    TableSettings,
    build_table,
    prediction_error,
    random_plans,
    resolve_device,
)
from zoo.latency.runtime import RUNTIMES, RuntimeFailure, check_runtime, tensorrt_backend

TARGETS = (1.5, 2.0)
GPU_RUNTIMES = ("onnxruntime", "tensorrt")  # the GPU check's deploy runtimes (its dry run: onnxruntime's CPU EP)
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


def limits(noise_floor: float) -> tuple[float, float]:
    """The mean and max error limits of a table measured with `noise_floor`."""
    return max(MEAN_LIMIT, NOISE_FACTOR * noise_floor), max(MAX_LIMIT, NOISE_FACTOR * noise_floor)


def table_row(table: Any, evaluation: Any, n_random: int) -> dict[str, Any]:
    """The table's raw and anchored errors over the random plans (results 1..n_random)."""
    random_results = evaluation.results[1:1 + n_random]
    errors = [abs(r.error(False)) for r in random_results]
    anchored = [abs(r.anchored_error()) for r in random_results]
    noise = evaluation.noise_floor
    return {"entries": table.n_records, "build_s": round(table.build_s, 1),
            "runtime_build_s": round(table.runtime_build_s, 1), "runtime_version": table.condition["runtime_version"],
            "original_ms": evaluation.results[0].measured_ms, "predicted_original_ms": table.predict(corrected=False),
            "n_plans": n_random, "mean_error": statistics.fmean(errors), "max_error": max(errors),
            "mean_error_anchored": statistics.fmean(anchored), "max_error_anchored": max(anchored),
            "noise_floor": noise, "drift": evaluation.drift, "limits": list(limits(noise)),
            "session_s": round(evaluation.time_s, 1),
            "plans": [{"removed": len(r.plan["remove"]), "measured_ms": r.measured_ms,
                       "predicted_raw_ms": r.predicted_raw_ms, "error": r.error(False)} for r in random_results]}


def checks(result: dict[str, Any]) -> list[Check]:
    """Per model and runtime: raw and anchored error, mean and max, within the limits of its noise floor; per chosen
    plan: its speed-up in its own runtime >= 0.9x target. A runtime or model that did not run: not measured."""
    runtimes = [*result["runtimes"], *result.get("skipped_runtimes", {})]
    out = []
    for r in result["models"]:
        for runtime in runtimes:
            t = r.get("tables", {}).get(runtime, {})
            mean_limit, max_limit = limits(t.get("noise_floor", 0.0))
            for kind, suffix in (("raw", ""), ("anchored", "_anchored")):
                name = f"{r['model']} {runtime}: {kind} error"
                out += [Check(f"{name} mean", t.get(f"mean_error{suffix}"), "<=", mean_limit),
                        Check(f"{name} max", t.get(f"max_error{suffix}"), "<=", max_limit)]
        speedups = {(s["runtime"], s["target"]): s for s in r.get("speedups", [])}
        for runtime in runtimes:
            for target in TARGETS:
                s = speedups.get((runtime, target), {})
                out.append(Check(f"{r['model']} {target}x plan chosen in {runtime}: measured speed-up",
                                 s.get("measured_speedup"), ">=", SPEEDUP_SHARE * target))
    return out


def table_verdicts(result: dict[str, Any]) -> dict[tuple[str, str], dict[str, bool | None]]:
    """Per (model, runtime): whether its raw and its anchored errors are within their limits (from :func:`checks`)."""
    judged = verdicts(checks(result))
    out = {}
    for r in result["models"]:
        for runtime in r.get("tables", {}):
            both = {kind: [judged[f"{r['model']} {runtime}: {kind} error {s}"] for s in ("mean", "max")]
                    for kind in ("raw", "anchored")}
            out[(r["model"], runtime)] = {kind: None if None in v else all(v) for kind, v in both.items()}
    return out


def bench_model(name: str, device: str, runtimes: list[str], n_plans: dict[str, int], input_size: int,
                batch_size: int, settings: TableSettings, calib: NetworkTimingSettings) -> dict[str, Any]:
    """Tables, chosen plans and the cross-runtime measurements of one model."""
    tables, chosen = {}, {}
    with tempfile.TemporaryDirectory() as cache_dir:
        for runtime in runtimes:
            start = time.perf_counter()
            tables[runtime] = build_table(name, batch_size=batch_size, input_size=input_size, device=device,
                                          cache_dir=cache_dir, settings=replace(settings, runtime=runtime))
            print(f"{name} {runtime}: table of {tables[runtime].n_records} entries in {time.perf_counter() - start:.0f}"
                  " s", flush=True)
            for target in TARGETS:
                chosen[(runtime, target)] = speed_plan(tables[runtime], target)
    plans = [(key, plan) for key, plan in chosen.items() if plan is not None]
    rows, cross = {}, []
    for runtime in runtimes:
        table = tables[runtime]
        randoms = random_plans(table.segments, n_plans[runtime], seed=1, merge=table.merge)
        evaluation = prediction_error(table, randoms + [plan for _, plan in plans], calib)
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
                             "measured_speedup": own["measured_speedup"] if own else None})
    return {"model": name, "input_size": input_size, "batch_size": batch_size, "tables": rows, "cross": cross,
            "speedups": speedups}


def run(quick: bool = False, device: str = "cpu", models: list[str] | None = None, runtimes: list[str] | None = None,
        plans: int = 20, compile_plans: int | None = None, input_size: int = 224, batch_size: int = 1,
        out: str | Path | None = None, gpu_check: bool = False, budget: Budget | None = None) -> dict[str, Any]:
    """Every model in every runtime; writes ``runtime_tables.json`` (``runtime_tables_quick.json`` with quick).
    `gpu_check`: the GPU check's runtimes, batch 32, 8 plans; a runtime missing here is skipped, not an error."""
    dev = resolve_device(device)
    skipped: dict[str, str] = {}
    if gpu_check:
        runtimes, batch_size, plans = list(GPU_RUNTIMES if dev.type == "cuda" else GPU_RUNTIMES[:1]), 32, 8
        for runtime in list(runtimes):
            try:
                check_runtime(runtime, dev)
            except RuntimeFailure as exc:
                skipped[runtime] = f"unavailable here: {exc}"
                runtimes.remove(runtime)
    runtimes = runtimes if runtimes is not None else runtimes_here(dev)
    for runtime in runtimes:
        check_runtime(runtime, dev)
    if quick:
        models, plans, compile_plans, input_size = models or [smoke_model()], 2 if gpu_check else 3, 2, 32
        batch_size = 2 if gpu_check else batch_size
        settings = TableSettings(warmup_s=0.2, entry_warmup_s=0.0, min_rounds=3, max_rounds=5)
        calib = NetworkTimingSettings(warmup_s=0.2, net_warmup_s=0.0, min_rounds=3, max_rounds=5)
    else:
        settings = TableSettings()
        calib = SESSION_TIMING
    models = models or [f.reference for f in families(task="classification")]
    n_plans = {r: compile_plans if r == "compile" and compile_plans is not None else plans for r in runtimes}
    start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for name in models:  # the file is rewritten after each model: a long run keeps what it measured
        if budget is not None and not budget.allows():
            rows.append({"model": name, "skipped": budget.reason()})
        elif runtimes:
            rows.append(bench_model(name, str(dev), runtimes, n_plans, input_size, batch_size, settings, calib))
        else:
            rows.append({"model": name, "skipped": "no runtime to measure in"})
        result = {"suite": "runtime_tables", "quick": quick, "runtimes": runtimes, "skipped_runtimes": skipped,
                  "tensorrt_backend": tensorrt_backend(), "env": environment(dev, torch.float32, batch_size,
                                                                             settings.threads),
                  "batch_size": batch_size, "input_size": input_size, "models": rows,
                  "complete": len(rows) == len(models), "time_s": round(time.perf_counter() - start, 1)}
        judge("runtime_tables", result)
        write_result("runtime_tables_quick" if quick else "runtime_tables", result, out)
    return result


def _pct(value: float) -> str:
    return f"{value:.1%}"


def markdown(result: dict[str, Any]) -> str:
    """The per-runtime error table, then the speed-up of each chosen plan in every runtime (verdicts: checks)."""
    judged, tables = verdicts(checks(result)), table_verdicts(result)

    def word(value: bool | None) -> str:
        return "-" if value is None else "pass" if value else "FAIL"

    lines = ["| model | runtime | entries | build s (compile/export s) | original ms | raw error mean / max | "
             "verdict | drift | anchored error mean / max | verdict | noise floor | limit mean / max |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    measured = [r for r in result["models"] if "skipped" not in r]
    for r in measured:
        for runtime, t in r["tables"].items():
            v = tables[(r["model"], runtime)]
            mean_limit, max_limit = limits(t["noise_floor"])
            lines.append(f"| {r['model']} | {runtime} | {t['entries']} | {t['build_s']} ({t['runtime_build_s']}) | "
                         f"{t['original_ms']:.2f} | {_pct(t['mean_error'])} / {_pct(t['max_error'])} over "
                         f"{t['n_plans']} plans | {word(v['raw'])} | {t['drift']:+.1%} | "
                         f"{_pct(t['mean_error_anchored'])} / {_pct(t['max_error_anchored'])} | "
                         f"{word(v['anchored'])} | "
                         f"{_pct(t['noise_floor'])} | {_pct(mean_limit)} / {_pct(max_limit)} |")
    runtimes = result["runtimes"]
    lines += ["", "Measured speed-up of the plan chosen in one runtime (rows) in every runtime (columns); the "
              "diagonal is the target check (>= 0.9x target):", "",
              "| model | target | chosen in | " + " | ".join(f"in {rt}" for rt in runtimes) + " | verdict |",
              "|---|---|---|" + "---|" * len(runtimes) + "---|"]
    speedups_ok = []
    for r in measured:
        for s in r["speedups"]:
            cells = []
            for rt in runtimes:
                c = next((c for c in r["cross"] if c["chosen_in"] == s["runtime"] and c["target"] == s["target"]
                          and c["measured_in"] == rt), None)
                cells.append("-" if c is None else f"{c['measured_speedup']:.2f}x")
            ok = judged[f"{r['model']} {s['target']}x plan chosen in {s['runtime']}: measured speed-up"]
            speedups_ok.append(ok)
            verdict = "out of reach" if not s["reachable"] else word(ok)
            lines.append(f"| {r['model']} | {s['target']}x | {s['runtime']} | " + " | ".join(cells) + f" | {verdict} |")
    lines += [f"- {r['model']}: skipped, {r['skipped']}" for r in result["models"] if "skipped" in r]
    lines += [f"- {rt}: skipped, {why}" for rt, why in result.get("skipped_runtimes", {}).items()]
    env, first = result["env"], measured[0] if measured else {}
    overall = {kind: all(v[kind] for v in tables.values()) and all(speedups_ok) for kind in ("raw", "anchored")}
    lines += ["", f"{env['device']}, batch {first.get('batch_size', result.get('batch_size'))}, input "
              f"{first.get('input_size', result.get('input_size'))}, {env['threads']} thread(s), torch "
              f"{env['torch']}; overall: {word(overall['raw'])} (raw errors and speed-ups), "
              f"{word(overall['anchored'])} (anchored errors and speed-ups); status {result.get('status', '-')} "
              f"({result['time_s']:.0f} s)."]
    return "\n".join(lines)


def command_line() -> CommandLine:
    parser = CommandLine("benchmarks.runtime_tables", __doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu")
    parser.add_argument("--models", type=names_from(zoo.list_models(), "model"), default=None,
                        help="comma-separated (default: every classification family's reference member)")
    parser.add_argument("--runtimes", type=names_from(RUNTIMES, "runtime"), default=None,
                        help="comma-separated (default: every runtime this machine has)")
    parser.add_argument("--plans", type=count, default=20)
    parser.add_argument("--compile-plans", type=count, default=None,
                        help="random plans under compile (default --plans)")
    parser.add_argument("--input-size", type=count, default=224)
    parser.add_argument("--batch-size", type=count, default=1)
    parser.add_argument("--out", type=out_folder, default=None)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = command_line().parse_args(argv)
    result = run(args.quick, args.device, args.models, args.runtimes, args.plans, args.compile_plans,
                 args.input_size, args.batch_size, args.out)
    print(markdown(result))


if __name__ == "__main__":
    raise SystemExit(run_command(main))
