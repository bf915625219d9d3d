"""Latency lookup tables: build time (cold / cached), entries, and prediction error over random plans.

For each model: build the table into a fresh cache (cold), build it again (cached: nothing measured), fit a
correction on a few calibration plans, then measure the original (twice: the noise floor) and 20 other random
plans end to end, interleaved, and compare with the table's raw and corrected predictions.

    python -m benchmarks.latency_table [--quick] [--device cpu] [--models a,b] [--batch-size 1] [--input-size 224]

On this shared 2-core CPU the default is 1 thread, batch 1 at 224 px, and the thread CPU clock
(``time.thread_time``), which does not count time the OS gave to other jobs; ``--clock wall`` uses perf_counter.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import zoo
from zoo.latency import CalibrationSettings, TableSettings, build_table, evaluate, random_plans

with contextlib.suppress(ImportError):  # RetNet registers itself on import, if present
    import zoo.retnet  # noqa: F401

RESULTS = Path(__file__).parent / "results" / "latency_table.json"
MODELS = ("mobilenetv2_100", "tresnet_m", "resnetv2_50x1_bit", "retnet_small")


def bench_model(name: str, device: str, batch_size: int, input_size: int | None, threads: int, clock: str,
                n_plans: int, n_calib: int, quick: bool) -> dict[str, Any]:
    """Cold and cached build of one model's table, calibration, then the error over `n_plans` random plans."""
    settings = TableSettings(threads=threads, clock=clock, warmup_s=0.5 if quick else 3.0,
                             min_rounds=5 if quick else 30, max_rounds=10 if quick else 400)
    calib = CalibrationSettings(warmup_s=0.2, min_rounds=3, max_rounds=5) if quick else CalibrationSettings(
        max_rounds=60, max_time_s=240.0)
    size = None if zoo.get_entry(name).family == "retnet" else input_size
    with tempfile.TemporaryDirectory() as cache_dir:
        kwargs = dict(batch_size=batch_size, input_size=size, device=device, cache_dir=cache_dir, settings=settings)
        cold = build_table(name, **kwargs)
        cached = build_table(name, **kwargs)
    fit = cold.calibrate(n_calib, seed=1, settings=calib)
    evaluation = evaluate(cold, random_plans(cold.segments, n_plans, seed=2), calib)
    c = cold.condition
    return {
        "model": name, "device": c["device_name"], "dtype": c["dtype"], "batch_size": c["batch_size"],
        "input_size": c["input_size"], "threads": c["threads"], "torch": c["torch"], "clock": clock,
        "estimator": settings.estimator, "entries": cold.n_entries, "segments": len(cold.segments),
        "cold_build_s": cold.build_s, "cold_measured": cold.n_measured, "cold_cached": cold.n_cached,
        "cached_build_s": cached.build_s, "cached_measured": cached.n_measured, "cached_cached": cached.n_cached,
        "correction": fit.summary()["correction"], "calibration_loo_error": fit.loo_error,
        "calibration_original_ms": fit.results[0].measured_ms,
        "original_ms": evaluation.results[0].measured_ms, "predicted_original_raw_ms": cold.predict(corrected=False),
        **{k: v for k, v in evaluation.summary().items() if k != "correction"},
    }


def run(quick: bool = False, device: str = "cpu", models: list[str] | None = None, batch_size: int = 1,
        input_size: int = 224, threads: int = 1, clock: str | None = None, n_plans: int = 20, n_calib: int = 5,
        out: str | Path | None = RESULTS) -> dict[str, Any]:
    """Benchmark every model (``quick``: mobilenetv2_035 at 64 px, 3 plans); write JSON to `out`."""
    if quick:
        models, input_size, n_plans, n_calib = models or ["mobilenetv2_035"], 64, 3, 2
    models = [m for m in (models or MODELS) if zoo.is_model(m)]
    clock = clock or ("thread" if device == "cpu" and threads == 1 else "wall")
    start = time.perf_counter()
    rows = [bench_model(m, device, batch_size, input_size, threads, clock, n_plans, n_calib, quick) for m in models]
    result = {"benchmark": "latency_table", "quick": quick, "torch": torch.__version__, "rows": rows,
              "total_s": time.perf_counter() - start}
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(result, indent=1, default=str))
    return result


def markdown(result: dict[str, Any]) -> str:
    """The results as a markdown table (errors in %, times in s)."""
    head = ("| model | device | dtype | batch | input | threads | torch | clock | entries | cold build s (measured) "
            "| cached build s (measured/cached) | original ms | error raw mean/max | error corrected mean/max "
            "| noise floor | correction |")
    lines = [head, "|" + "---|" * 16]
    for r in result["rows"]:
        corr = r["correction"]
        corr_text = {"none": "none", "scale": f"x{corr['scale']:.3f}", "offset": f"{corr['offset_ms']:+.3f} ms"}
        lines.append(
            f"| {r['model']} | {r['device']} | {r['dtype']} | {r['batch_size']} | {'x'.join(map(str, r['input_size']))}"
            f" | {r['threads']} | {r['torch']} | {r['clock']} | {r['entries']} | {r['cold_build_s']:.1f} "
            f"({r['cold_measured']}) | {r['cached_build_s']:.1f} ({r['cached_measured']}/{r['cached_cached']}) "
            f"| {r['original_ms']:.2f} | {r['mean_abs_error_raw']:.1%} / {r['max_abs_error_raw']:.1%} "
            f"| {r['mean_abs_error']:.1%} / {r['max_abs_error']:.1%} | {r['noise_floor']:.1%} "
            f"| {corr_text[corr['kind']]} |")
    lines.append(f"\nErrors over {result['rows'][0]['n_plans'] if result['rows'] else 0} random plans (not used for "
                 f"fitting); total {result['total_s']:.0f} s.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one tiny model, a few plans (smoke test)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--models", default=None, help="comma-separated model names")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--input-size", type=int, default=224)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=("wall", "thread"), default=None,
                        help="CPU clock; default thread CPU time at 1 thread, else wall")
    parser.add_argument("--plans", type=int, default=20)
    args = parser.parse_args()
    models = args.models.split(",") if args.models else None
    result = run(args.quick, args.device, models, args.batch_size, args.input_size, args.threads, args.clock,
                 args.plans, out=args.out)
    print(markdown(result))


if __name__ == "__main__":
    main()
