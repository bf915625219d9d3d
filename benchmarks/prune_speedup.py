"""Pruned vs unpruned: measured speed-up, metric and table prediction error per model and target, plus DP vs
greedy vs random at the same budget. ``python -m benchmarks.prune_speedup [--quick] [--device cpu|cuda]``.

Every run is a real ``prune.py`` run (the library entry :func:`zoo.jobs.prune.run` on a composed config): baseline
trained once per model on the embedded data (digits, bytes), table on the device, search, fine-tune, measure.
Every declared family runs (``zoo.list_families()``): the member and overrides tuned for it here, else its reference
on its task's data. Target: the measured speed-up >= 0.9 x target.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import (
    Check,
    CommandLine,
    compose,
    families,
    family_of,
    markdown_table,
    model_name,
    out_folder,
    positive,
    smoke_model,
    write_result,
)
from zoo.errors import run_command

SPEEDUP_SHARE = 0.9
TASK_DATA = {"classification": ["data=digits"], "language_model": ["data=bytes"]}  # the embedded data per task
HEAVY = ["data.batch_size=32", "trainer.max_epochs=3", "prune.batch_size=8", "finetune.epochs=1"]
TUNED = {  # family: (the member run, overrides that make it fit the embedded data and this machine)
    "mobilenetv2": ("mobilenetv2_050", ["data=digits"]),
    "tresnet": ("tresnet_m", ["data=digits", *HEAVY]),
    "bit": ("resnetv2_50x1_bit", ["data=digits", *HEAVY]),
    "retnet": ("retnet_small", ["data=bytes", "trainer.max_epochs=2", "prune.batch_size=8", "finetune.epochs=1"]),
}
SEARCHES = {"mobilenetv2": ("dp", "greedy", "random")}  # tuning: the family compared across searches; others: dp


def overrides_of(model: str) -> list[str]:
    """A model's overrides: its family's tuning when it is the tuned member, else its task's data."""
    family = family_of(model)
    member, tuned = TUNED.get(family.name, (None, None))
    return tuned if member == model else TASK_DATA[family.task]


def default_models() -> list[str]:
    """Every declared family's member: the one tuned here, else its reference."""
    return [TUNED.get(f.name, (f.reference,))[0] for f in families()]
QUICK = ["data.image_size=16", "trainer.max_epochs=1", "trainer.limit_train_batches=3", "finetune.epochs=1",
         "prune.batch_size=2", "prune.calib_batches=1", "++prune.table={warmup_s: 0.2, min_rounds: 3, max_rounds: 5}",
         "++prune.measure={warmup_s: 0.2, min_rounds: 3, max_rounds: 5}"]


def prune_once(model: str, target: float, method: str, extra: list[str], root: Path) -> dict[str, Any]:
    """One prune run; returns the row of its results."""
    from zoo.jobs.prune import run

    out = root / f"{model}-{target}-{method}"
    cfg = compose([f"model={model}", *extra, f"prune.target_speedup={target}", f"prune.search={method}",
                   "logger=none", "trainer.progress=false", f"paths.log_dir={root}", f"prune.cache_dir={root}/cache"],
                  out)
    results = run(cfg)
    metric = next(k for k in ("val/acc1", "val/ppl") if k in results["pruned"]["metrics"])
    return {"model": model, "target": target, "search": method, "device": results["device"],
            "dtype": results["condition"]["dtype"], "batch": results["condition"]["batch_size"],
            "threads": results["condition"]["threads"], "torch": results["condition"]["torch"],
            "baseline_ms": results["baseline"]["latency_ms"], "pruned_ms": results["pruned"]["latency_ms"],
            "speedup": results["measured_speedup"], "predicted_ms": results["predicted_latency_ms"],
            "prediction_error": results["prediction_error"], "metric": metric,
            "before": results["baseline"]["metrics"][metric], "after": results["pruned"]["metrics"][metric],
            "damage": (results["search_result"] or {}).get("damage"), "removed": len(results["plan"]["remove"])}


def run(quick: bool = False, device: str = "auto", models: list[str] | None = None,
        targets: tuple[float, ...] = (1.25, 1.5, 2.0), out: str | None = None, workdir: str | None = None
        ) -> dict[str, Any]:
    models = models or ([smoke_model()] if quick else default_models())
    targets = (1.5,) if quick else targets
    root = Path(workdir or tempfile.mkdtemp(prefix="prune_speedup-"))
    rows = []
    for model in models:
        extra = [*overrides_of(model), f"prune.device={device}", *(QUICK if quick else [])]
        methods = SEARCHES.get(family_of(model).name, ("dp",))
        for target in targets:
            for method in methods:
                rows.append(prune_once(model, target, method, extra, root))
    result = {"suite": "prune_speedup", "rows": rows, "workdir": str(root)}
    write_result("prune_speedup", result, out)
    return result


def checks(result: dict[str, Any]) -> list[Check]:
    """Every prune run: its measured speed-up >= 0.9 x its target."""
    return [Check(f"{r['model']} {r['search']} at {r['target']}x: measured speed-up", r["speedup"], ">=",
                  SPEEDUP_SHARE * r["target"]) for r in result["rows"]]


def markdown(result: dict[str, Any]) -> str:
    return markdown_table(result["rows"], ["model", "target", "search", "baseline_ms", "pruned_ms", "speedup",
                                           "prediction_error", "metric", "before", "after", "removed", "device",
                                           "dtype", "batch", "threads", "torch"])


def command_line() -> CommandLine:
    parser = CommandLine("benchmarks.prune_speedup", __doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--device", choices=("cpu", "cuda", "auto"), default="auto")
    parser.add_argument("--models", type=model_name, nargs="+", default=None)
    parser.add_argument("--targets", type=speedup, nargs="+", default=[1.25, 1.5, 2.0])
    parser.add_argument("--out", type=out_folder, default=None)
    parser.add_argument("--workdir", type=out_folder, default=None,
                        help="where baselines, caches and runs go (default: a temp dir)")
    return parser


def speedup(text: str) -> float:
    """A target speed-up: a finite number above 1."""
    value = positive(text)
    if value <= 1:
        raise argparse.ArgumentTypeError(f"{text} is not above 1; a target speed-up is a number above 1, e.g. 1.5")
    return value


def main(argv: list[str] | None = None) -> None:
    args = command_line().parse_args(argv)
    print(markdown(run(args.quick, args.device, args.models, tuple(args.targets), args.out, args.workdir)))


if __name__ == "__main__":
    raise SystemExit(run_command(main))
