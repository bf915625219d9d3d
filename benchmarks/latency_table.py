"""Latency lookup tables, run after run: N cold builds per model and the distribution of their prediction errors.

For each model and each of `repeats` repetitions, in a fresh process (as each ``prune.py`` run is): build the table
into a fresh cache (cold), build it again (cached: nothing measured), then measure the original (twice: the noise
floor), a few calibration plans and `plans` other random plans end to end in one interleaved session; fit a
correction on the calibration plans and compare the table's raw, anchored and corrected predictions with the other
plans' measurements.
A build passes when its raw error stays within the target, max(3 %, 1.5 x that build's noise floor), for the mean
and for the worst plan; a model passes when at least 9 in 10 of its builds do.

    python -m benchmarks.latency_table [--quick] [--device cpu] [--models a,b] [--batch-size 1] [--repeats 10]

The models are every declared family's reference member (``zoo.list_families()``) unless ``--models`` names them.

In the GPU check (``python -m benchmarks run --set gpu_check``) the suite runs its *conditions* form instead: one
cold build per condition (model, batch, dtype, layout, CUDA timing protocol, CUDA graphs), 8 random plans each,
target: raw max error <= 5 %. The conditions: every classification family's member at batch 128 fp32, and
MobileNetV2-1.4 also in bf16 channels_last (queued, isolated, CUDA graphs) and at batch 1.

The tables are built exactly as ``prune.py`` builds them (``TableSettings()``: in-context entries on the CPU, the
wall clock, one thread, the p10 estimator); ``--clock``/``--entries`` change that for comparisons.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
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
    exact_rounds,
    families,
    names_from,
    out_folder,
    smoke_model,
    whole,
    within_budget,
)
from zoo.errors import run_command
from zoo.files import write_json
from zoo.latency import NetworkTimingSettings, TableSettings, build_table, correct, prediction_error, random_plans
from zoo.latency.measure import ROUND_ORDERS
from zoo.latency.table import fit_correction

RESULTS = Path(__file__).parent / "results" / "latency_table.json"
TARGET_ABS, TARGET_NOISE, PASS_SHARE = 0.03, 1.5, 0.9


def target(noise_floor: float) -> float:
    """The error a build must stay within: max(3 %, 1.5 x its noise floor)."""
    return max(TARGET_ABS, TARGET_NOISE * noise_floor)


def one_build(name: str, device: str, batch_size: int, size: Any, settings: TableSettings, calib: NetworkTimingSettings,
              n_plans: int, n_calib: int, repeat: int) -> dict[str, Any]:
    """One cold build (fresh cache), a cached build, then one measuring session of the original (twice), `n_calib`
    calibration plans and `n_plans` held-out plans: the correction is fitted on the first (as ``prune.py`` fits it
    right before its search) and judged on the others."""
    with tempfile.TemporaryDirectory() as cache_dir:
        kwargs = dict(batch_size=batch_size, input_size=size, device=device, cache_dir=cache_dir, settings=settings)
        cold = build_table(name, **kwargs)
        cached = build_table(name, **kwargs)
    calib_plans = random_plans(cold.segments, n_calib, seed=100 + repeat)
    evaluation = prediction_error(cold, calib_plans + random_plans(cold.segments, n_plans, seed=2), calib)
    fitted, held_out = evaluation.results[:1 + n_calib], evaluation.results[1 + n_calib:]
    correction, loo = fit_correction([r.predicted_raw_ms for r in fitted], [r.measured_ms for r in fitted],
                                     evaluation.noise_floor)
    errors = {"raw": [abs(r.error(False)) for r in held_out], "anchored": [abs(r.anchored_error()) for r in held_out],
              "corrected": [abs(correction.apply(r.predicted_raw_ms) / r.measured_ms - 1) for r in held_out]}
    stats = {f"{stat}_abs_error_{kind}": fn(values) for kind, values in errors.items()
             for stat, fn in (("mean", statistics.fmean), ("max", max))}
    limit = target(evaluation.noise_floor)
    return {"repeat": repeat, "input_size": cold.condition["input_size"], "cold_build_s": cold.build_s,
            "cold_measured": cold.n_measured, "cached_build_s": cached.build_s, "cached_measured": cached.n_measured,
            "entries": cold.n_records, "correction": asdict(correction), "calibration_loo_error": loo,
            "original_ms": evaluation.results[0].measured_ms, "noise_floor": evaluation.noise_floor,
            "drift": evaluation.drift, "n_plans": n_plans, "target": limit, **stats,
            "passed": max(stats["mean_abs_error_raw"], stats["max_abs_error_raw"]) <= limit,
            "passed_anchored": max(stats["mean_abs_error_anchored"], stats["max_abs_error_anchored"]) <= limit,
            "corrected_no_worse": stats["mean_abs_error_corrected"] <= stats["mean_abs_error_raw"] + 1e-12,
            "session_s": evaluation.time_s, "pid": os.getpid(), "plans": [plan_record(r) for r in held_out]}


def plan_record(result: Any) -> dict[str, Any]:
    """One held-out plan's measurement and errors: the same plans (seed 2) in every build, so a plan that is off in
    every build (a table error) can be told from one that is off in a single session (measurement noise;
    ``python -m studies.table_error_parts``)."""
    return {"label": result.label, "remove": list(result.plan["remove"]), "predicted_raw_ms": result.predicted_raw_ms,
            "measured_ms": result.measured_ms, "rel_uncertainty": result.rel_uncertainty,
            "error_raw": result.error(False), "error_anchored": result.anchored_error()}


def in_fresh_process(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` in a new Python process (spawned), as a user's ``prune.py`` run builds its table: cold builds
    that share one process inherit its allocator state and predict slower and slower networks."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def bench_model(name: str, device: str, batch_size: int, input_size: int | None, settings: TableSettings,
                n_plans: int, n_calib: int, repeats: int, quick: bool, session_rounds: int = 0) -> dict[str, Any]:
    """`repeats` cold builds of one model's table and the distribution of their errors. `session_rounds`: every
    measured network exactly this many rounds (0: 20-60, each until its median converged: ``SESSION_TIMING``)."""
    calib = NetworkTimingSettings(warmup_s=0.2, min_rounds=3, max_rounds=5) if quick else SESSION_TIMING
    if session_rounds:
        calib = exact_rounds(calib, session_rounds)
    # whole networks are timed as the table's were
    calib = replace(calib, warm_calls=settings.warm_calls, round_order=settings.round_order)
    size = None if zoo.get_entry(name).task == "language_model" else input_size
    builds = [in_fresh_process(one_build, name, device, batch_size, size, settings, calib, n_plans, n_calib, r)
              for r in range(repeats)]
    passed, anchored = sum(b["passed"] for b in builds), sum(b["passed_anchored"] for b in builds)

    def dist(key: str) -> dict[str, float]:
        values = [b[key] for b in builds]
        return {"median": statistics.median(values), "worst": max(values)}

    return {"model": name, "batch_size": batch_size, "input_size": builds[0]["input_size"], "device": device,
            "clock": settings.clock, "entries_timing": settings.entries, "estimator": settings.estimator,
            "threads": settings.threads, "probe_spacing": settings.probe_spacing,
            "table_rounds": [settings.min_rounds, settings.max_rounds],
            "warm_calls": settings.warm_calls, "round_order": settings.round_order,
            "session_rounds": [calib.min_rounds, calib.max_rounds], "repeats": repeats,
            "n_plans": n_plans,
            "mean_error_raw": dist("mean_abs_error_raw"), "max_error_raw": dist("max_abs_error_raw"),
            "mean_error": dist("mean_abs_error_corrected"), "max_error": dist("max_abs_error_corrected"),
            "mean_error_anchored": dist("mean_abs_error_anchored"),
            "max_error_anchored": dist("max_abs_error_anchored"),
            "drift": {"median": statistics.median(b["drift"] for b in builds),
                      "worst": max((b["drift"] for b in builds), key=abs)},
            "noise_floor": dist("noise_floor"), "target": dist("target"),
            "corrections": [b["correction"]["kind"] for b in builds],
            "corrected_no_worse": sum(b["corrected_no_worse"] for b in builds),
            "builds_passed": passed, "passed": passed >= PASS_SHARE * repeats,
            "builds_passed_anchored": anchored, "passed_anchored": anchored >= PASS_SHARE * repeats,
            "cold_build_s": dist("cold_build_s"), "cached_build_s": dist("cached_build_s"),
            "original_ms": dist("original_ms"), "builds": builds}


def run(quick: bool = False, device: str = "cpu", models: list[str] | None = None, batch_size: int = 1,
        input_size: int = 224, threads: int = 1, clock: str | None = None, entries: str | None = None,
        n_plans: int = 20, n_calib: int = 5, repeats: int = 10, out: str | Path | None = RESULTS,
        probe_spacing: int | None = None, warm_calls: int | None = None, round_order: str | None = None,
        session_rounds: int = 0, table_rounds: int | None = None, gpu_check: bool = False,
        budget: Budget | None = None) -> dict[str, Any]:
    """Benchmark every family's reference model (``quick``: the smoke model at 64 px, 3 plans, 2 builds); write JSON
    to `out`. `gpu_check`: the conditions form instead (:func:`run_conditions`)."""
    if gpu_check:
        return run_conditions(quick, device, out, budget)
    if quick:
        models, input_size, n_plans, n_calib, repeats = models or [smoke_model()], 64, 3, 2, 2
    models = [m for m in (models or [f.reference for f in families()]) if zoo.is_model(m)]
    settings = TableSettings(threads=threads)
    if quick:
        settings = replace(settings, warmup_s=0.5, min_rounds=5, max_rounds=10)
    settings = replace(settings, **{k: v for k, v in (("clock", clock), ("entries", entries), ("probe_spacing",
                                                      probe_spacing), ("warm_calls", warm_calls),
                                                     ("round_order", round_order), ("min_rounds", table_rounds))
                                  if v is not None})
    settings = replace(settings, max_rounds=max(settings.max_rounds, settings.min_rounds))
    start = time.perf_counter()
    rows = [bench_model(m, device, batch_size, input_size, settings, n_plans, n_calib, repeats, quick, session_rounds)
            for m in models]
    result = {"benchmark": "latency_table", "quick": quick, "torch": torch.__version__, "rows": rows,
              "passed": all(r["passed"] for r in rows), "passed_anchored": all(r["passed_anchored"] for r in rows),
              "total_s": time.perf_counter() - start,
              "device_name": zoo.latency.device.device_name(zoo.latency.resolve_device(device))}
    write(result, out)
    return result


def write(result: dict[str, Any], out: str | Path | None) -> None:
    if out:
        path = Path(out) if Path(out).suffix == ".json" else Path(out) / "latency_table.json"
        write_json(path, result)


def builds_within(row: dict[str, Any], kind: str) -> int:
    """How many of a row's builds have their mean and max `kind` (raw / anchored) error within their target,
    recomputed from the stored errors and noise floors."""
    return sum(max(b[f"mean_abs_error_{kind}"], b[f"max_abs_error_{kind}"]) <= target(b["noise_floor"])
               for b in row["builds"])


def checks(result: dict[str, Any]) -> list[Check]:
    """Builds form: per model and batch, the share of builds within max(3 %, 1.5 x noise floor), raw and anchored,
    at least 9 in 10. Conditions form: each table's raw max error <= 5 % (None: the condition did not run)."""
    if result.get("form") == "conditions":
        return [Check(f"{label} max error <= {GPU_ERROR_TARGET:.0%}", t.get("max_abs_error_raw"), "<=",
                      GPU_ERROR_TARGET) for label, t in result["conditions"].items()]
    return [Check(f"{r['model']} b{r['batch_size']}: share of builds within max(3 %, 1.5 x noise floor), {kind}",
                  builds_within(r, kind) / len(r["builds"]) if r.get("builds") else None, ">=", PASS_SHARE)
            for r in result["rows"] for kind in ("raw", "anchored")]


# -- the conditions form (the GPU check) ----------------------------------------------------------------------
CACHE_DIR = str(Path(os.environ.get("TMPDIR", "/tmp")) / "gpu_check")  # shared with prune_search: tables reused
GPU_ERROR_TARGET = 0.05  # the target for a table's raw prediction error on a GPU
GPU_BATCH, GPU_SIZE, GPU_PLANS = 128, 224, 8
GPU_MEMBER = {"mobilenetv2": "mobilenetv2_140"}  # tuning: the member the published depth-compression results use


@dataclass(frozen=True)
class Condition:
    """One network under one measurement condition (CUDA timing protocol: see ``TableSettings.cuda_timing``)."""

    model: str
    batch: int
    dtype: str = "float32"
    channels_last: bool = False
    cuda_timing: str = "auto"
    cuda_graph: bool = False
    runtime: str = "eager"

    @property
    def label(self) -> str:
        layout = "channels_last" if self.channels_last else "contiguous"
        return (f"{self.model}/{self.dtype}/{layout}/b{self.batch}/{self.cuda_timing}"
                f"{'+graph' if self.cuda_graph else ''}{'' if self.runtime == 'eager' else '/' + self.runtime}")


def gpu_member(family: str) -> str:
    """The member of `family` the GPU check times (its reference unless tuned here)."""
    return GPU_MEMBER.get(family, zoo.get_family(family).reference)


def bf16_channels_last(model: str) -> Condition:
    return Condition(model, GPU_BATCH, "bfloat16", True)


EXTRA_CONDITIONS = {  # tuning: the family studied in depth on a GPU, in more conditions than batch 128 fp32
    "mobilenetv2": lambda model: [bf16_channels_last(model), replace(bf16_channels_last(model), cuda_timing="isolated"),
                                  replace(bf16_channels_last(model), cuda_graph=True),
                                  *(Condition(model, 1, cuda_timing=t) for t in ("isolated", "auto"))]}


def gpu_conditions(quick: bool, extra: dict[str, Any] | None = None) -> list[Condition]:
    """Every classification family at batch 128 fp32 and the `extra` conditions tuned per family (default: this
    suite's); `quick`: the smoke model at batch 2 (the CPU dry run)."""
    if quick:
        return [Condition(smoke_model(), 2)]
    extra = EXTRA_CONDITIONS if extra is None else extra
    out = []
    for family in families(task="classification"):
        model = gpu_member(family.name)
        out += [Condition(model, GPU_BATCH), *extra.get(family.name, lambda m: [])(model)]
    return out


def gpu_settings(quick: bool) -> tuple[TableSettings, NetworkTimingSettings, int]:
    """Table and whole-network timing settings, and the input size, of the GPU check (`quick`: its dry run)."""
    if quick:
        return (TableSettings(warmup_s=0.2, entry_warmup_s=0.01, min_rounds=3, max_rounds=5),
                NetworkTimingSettings(warmup_s=0.2, net_warmup_s=0.02, min_rounds=3, max_rounds=5), 64)
    return TableSettings(max_time_s=60.0), replace(SESSION_TIMING, max_rounds=100, max_time_s=30.0), GPU_SIZE


def table_for(cond: Condition, device: str, quick: bool) -> Any:
    """The table of `cond` (cached under ``$TMPDIR/gpu_check``)."""
    settings, _, size = gpu_settings(quick)
    settings = replace(settings, cuda_timing=cond.cuda_timing, cuda_graph=cond.cuda_graph, runtime=cond.runtime)
    return build_table(zoo.create_model(cond.model).eval(), batch_size=cond.batch, input_size=size, device=device,
                       dtype=cond.dtype, channels_last=cond.channels_last, settings=settings, cache_dir=CACHE_DIR)


def condition_build(cond: Condition, device: str, quick: bool) -> dict[str, Any]:
    """One cold build of `cond`'s table and its errors over random plans, beside the noise floor."""
    table = table_for(cond, device, quick)
    _, timing, _ = gpu_settings(quick)
    evaluation = correct(table, 2 if quick else GPU_PLANS, settings=timing)
    capped = sum(bool(table.records[k].get("cap_hit")) for k in table.records)
    return {"entries": table.n_records, "measured": table.n_measured, "build_s": table.build_s,
            "entries_capped": capped, "condition": table.condition, "summary": table.summary(),
            "protocol": table.condition["protocol"], **evaluation.summary(), "table": evaluation.format()}


def run_conditions(quick: bool, device: str, out: str | Path | None, budget: Budget | None) -> dict[str, Any]:
    """Every GPU condition's table (one cold build each) and its errors; conditions past the budget: skipped."""
    device = "cuda" if device == "auto" and torch.cuda.is_available() else "cpu" if device == "auto" else device
    result = {"suite": "latency_table", "form": "conditions", "quick": quick, "device": device,
              "error_target": GPU_ERROR_TARGET,
              "conditions": within_budget(gpu_conditions(quick), lambda c: c.label,
                                          lambda c: condition_build(c, device, quick), budget)}
    write(result, out)
    return result


def markdown(result: dict[str, Any]) -> str:
    """Per model: the median and worst build's errors (raw, anchored, corrected), noise floor, drift and verdicts."""
    if result.get("form") == "conditions":
        return markdown_conditions(result)
    lines = ["| model | batch | input | clock, entries | builds | raw error mean / max: median build | worst build "
             "| anchored mean / max: median build | worst build | corrected mean: median / worst | noise floor: median "
             "/ worst | drift: median / worst | corrections | raw within target | anchored within target |",
             "|" + "---|" * 15]
    for r in result["rows"]:
        size = "x".join(map(str, r["input_size"])) if isinstance(r["input_size"], (list, tuple)) else (
            r["input_size"] or "default")
        def pair(a: str, b: str, k: str, r: dict[str, Any] = r) -> str:
            return f"{r[a][k]:.1%} / {r[b][k]:.1%}"

        def verdict(n: int, ok: bool, r: dict[str, Any] = r) -> str:
            return f"{n}/{r['repeats']} {'passed' if ok else 'failed'}"

        kinds = {k: r["corrections"].count(k) for k in dict.fromkeys(r["corrections"])}
        lines.append(
            f"| {r['model']} | {r['batch_size']} | {size} | {r['clock']}, {r['entries_timing']} | {r['repeats']} "
            f"| {pair('mean_error_raw', 'max_error_raw', 'median')} "
            f"| {pair('mean_error_raw', 'max_error_raw', 'worst')} "
            f"| {pair('mean_error_anchored', 'max_error_anchored', 'median')} "
            f"| {pair('mean_error_anchored', 'max_error_anchored', 'worst')} "
            f"| {r['mean_error']['median']:.1%} / {r['mean_error']['worst']:.1%} "
            f"| {r['noise_floor']['median']:.1%} / {r['noise_floor']['worst']:.1%} "
            f"| {r['drift']['median']:+.1%} / {r['drift']['worst']:+.1%} "
            f"| {', '.join(f'{k} {n}' for k, n in kinds.items())}; no worse than raw in {r['corrected_no_worse']}"
            f"/{r['repeats']} | {verdict(r['builds_passed'], r['passed'])} "
            f"| {verdict(r['builds_passed_anchored'], r['passed_anchored'])} |")
    n_plans = result["rows"][0]["n_plans"] if result["rows"] else 0
    lines.append(f"\nEach build: a cold table (fresh cache), a correction fitted on 5 calibration plans, errors over "
                 f"{n_plans} other random plans, all measured end to end in one interleaved session. Raw: the "
                 f"table's ms against the measured ms; "
                 f"anchored: the table's prediction scaled by the original network measured in the same session (the "
                 f"error of the predicted speed-up); drift: the raw prediction of the original against its "
                 f"measurement. Target per build: mean and max error within max(3 %, 1.5 x the build's noise floor); "
                 f"a model passes with >= 9 in 10 builds within it. Device {result.get('device_name', '?')}; total "
                 f"{result['total_s']:.0f} s; raw: {'passed' if result['passed'] else 'failed'}, anchored: "
                 f"{'passed' if result['passed_anchored'] else 'failed'}.")
    return "\n".join(lines)


def markdown_conditions(result: dict[str, Any]) -> str:
    """One row per condition: entries, build time, raw / anchored / in-sample corrected errors, noise floor."""
    lines = ["| condition | entries | built in s | raw error mean / max | anchored mean / max | corrected (in-sample) "
             "mean | noise floor | protocol |", "|---|---:|---:|---|---|---:|---:|---|"]
    for label, t in result["conditions"].items():
        if "skipped" in t:
            lines.append(f"| {label} | skipped: {t['skipped']} ||||||")
            continue
        anchored = (f"{t['mean_abs_error_anchored']:.1%} / {t['max_abs_error_anchored']:.1%}"
                    if "mean_abs_error_anchored" in t else "-")
        lines.append(f"| {label} | {t['entries']} | {t['build_s']:.0f} | {t['mean_abs_error_raw']:.1%} / "
                     f"{t['max_abs_error_raw']:.1%} | {anchored} | {t['mean_abs_error']:.1%} | {t['noise_floor']:.1%} "
                     f"| {t.get('protocol', '-')} |")
    return "\n".join(lines)


def command_line() -> CommandLine:
    parser = CommandLine("benchmarks.latency_table", __doc__)
    parser.add_argument("--quick", action="store_true", help="one tiny model, a few plans, 2 builds (smoke test)")
    parser.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu")
    parser.add_argument("--out", type=out_folder, default=str(RESULTS))
    parser.add_argument("--models", type=names_from(zoo.list_models(), "model"), default=None,
                        help="comma-separated model names (default: every family's reference member)")
    parser.add_argument("--batch-size", type=count, default=1)
    parser.add_argument("--input-size", type=count, default=224)
    parser.add_argument("--threads", type=count, default=1)
    parser.add_argument("--clock", choices=("wall", "thread"), default=None, help="default: prune.py's (wall)")
    parser.add_argument("--entries", choices=("auto", "context", "isolated"), default=None,
                        help="how entries are timed; default: prune.py's (auto: in context on the CPU)")
    parser.add_argument("--probe-spacing", type=count, default=None,
                        help="TableSettings.probe_spacing (in-context probe networks); default: prune.py's")
    parser.add_argument("--warm-calls", type=whole, default=None,
                        help="TableSettings.warm_calls, also for the measured networks; default: prune.py's (0)")
    parser.add_argument("--round-order", choices=ROUND_ORDERS, default=None,
                        help="TableSettings.round_order, also for the measured networks; default: prune.py's")
    parser.add_argument("--session-rounds", type=whole, default=0, metavar="ROUNDS",
                        help="every measured network exactly this many rounds (default: 20-60, until converged)")
    parser.add_argument("--table-rounds", type=count, default=None, metavar="ROUNDS",
                        help="TableSettings.min_rounds: every network (entry) of the build at least this many rounds; "
                             "default: prune.py's (TableSettings.min_rounds)")
    parser.add_argument("--plans", type=count, default=20)
    parser.add_argument("--repeats", type=count, default=10, help="cold builds per model")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = command_line().parse_args(argv)
    models = args.models.split(",") if args.models else None
    result = run(args.quick, args.device, models, args.batch_size, args.input_size, args.threads, args.clock,
                 args.entries, args.plans, repeats=args.repeats, out=args.out, probe_spacing=args.probe_spacing,
                 warm_calls=args.warm_calls, round_order=args.round_order, session_rounds=args.session_rounds,
                 table_rounds=args.table_rounds)
    print(markdown(result))
    raise SystemExit(0 if result["passed"] else 1)


if __name__ == "__main__":
    raise SystemExit(run_command(main))
