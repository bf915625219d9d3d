"""What the default search costs: the whole default ``python prune.py``, cold, with today's default search and
measured-target loop against the previous default (``prune.search=dp prune.importance=loss
prune.target_corrections=0``), run in turns.

Each run is the README's command in a fresh directory (baseline trained, table built, nothing cached), timed as a
whole (wall clock, the process from start to exit) and per phase (``results.json``'s ``timings_s``). Runs alternate
(previous, today, previous, today, ...) so the machine's drift hits both alike; the verdict compares the medians:
today's default at most ``LIMIT`` times the previous one.

    python -m studies.prune_cost [--pairs 2] [--quick]
"""

from __future__ import annotations

import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    Check,
    CommandLine,
    count,
    judge,
    markdown_table,
    out_folder,
    write_result,
)
from studies.jobs import job_command, offline_env
from zoo.errors import run_command
from zoo.files import read_sealed_json

LIMIT = 1.5
PREVIOUS = ["prune.search=dp", "prune.importance=loss", "prune.target_corrections=0"]
QUICK = ["data.image_size=16", "trainer.max_epochs=1", "trainer.limit_train_batches=3", "finetune.epochs=1",
         "prune.batch_size=2", "prune.calib_batches=1", "++prune.table={warmup_s: 0.2, min_rounds: 3, max_rounds: 5}",
         "++prune.measure={warmup_s: 0.2, min_rounds: 3, max_rounds: 5}"]


def prune_run(overrides: list[str], directory: Path) -> dict[str, Any]:
    """One cold ``python prune.py`` in `directory`: wall seconds, phases, search and measured speed-up."""
    env = {**offline_env(), "WANDB_DIR": str(directory)}
    places = [f"hydra.run.dir={directory / 'run'}", f"paths.log_dir={directory / 'outputs'}",
              f"prune.cache_dir={directory / 'cache'}"]
    command = job_command("prune.py", [*overrides, *places])
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, cwd=directory, env=env)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"prune.py {' '.join(overrides)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    results = read_sealed_json(directory / "run" / "results.json")
    metric = next(k for k in ("val/acc1", "val/ppl") if k in results["pruned"]["metrics"])
    return {"seconds": round(seconds, 1), "phases": results["timings_s"], "search": results["search"],
            "measured_speedup": results["measured_speedup"], "metric": metric,
            "after": results["pruned"]["metrics"][metric], "before": results["baseline"]["metrics"][metric],
            "target_check": {k: v for k, v in (results.get("target_check") or {}).items() if k != "corrections"},
            "plans_tried": len((results.get("target_check") or {}).get("corrections") or [])}


def run(quick: bool = False, pairs: int = 2, out: str | None = None) -> dict[str, Any]:
    """`pairs` alternating runs of the previous and today's default; the ratio of their median wall times."""
    extra = QUICK if quick else []
    rows = []
    with tempfile.TemporaryDirectory(prefix="prune_cost-") as scratch:
        for pair in range(pairs):
            for name, overrides in (("previous", PREVIOUS), ("today", [])):
                directory = Path(scratch) / f"{name}{pair}"
                directory.mkdir()
                rows.append({"default": name, "pair": pair, **prune_run([*overrides, *extra], directory)})
    median = {name: statistics.median(r["seconds"] for r in rows if r["default"] == name)
              for name in ("previous", "today")}
    ratio = median["today"] / median["previous"]
    phases = {name: {phase: statistics.median(r["phases"].get(phase, 0.0) for r in rows if r["default"] == name)
                     for phase in rows[0]["phases"] | rows[1]["phases"]} for name in ("previous", "today")}
    result = {"suite": "prune_cost", "quick": quick, "pairs": pairs, "rows": rows, "median_s": median,
              "median_phases_s": phases, "ratio": ratio, "limit": LIMIT}
    judge("prune_cost", result)
    write_result("prune_cost", result, out)
    return result


def checks(result: dict[str, Any]) -> list[Check]:
    return [Check("today's default / the previous one, median wall time", result["ratio"], "<=", LIMIT)]


def markdown(result: dict[str, Any]) -> str:
    rows = [{"default": r["default"], "search": r["search"], "wall s": r["seconds"],
             "search s": r["phases"].get("search"), "target check s": r["phases"].get("target_check", 0.0),
             "plans timed": r["plans_tried"], "measured speed-up": r["measured_speedup"],
             r["metric"]: f"{r['before']:.2f} -> {r['after']:.2f}"} for r in result["rows"]]
    metric = result["rows"][0]["metric"]
    table = markdown_table(rows, ["default", "search", "wall s", "search s", "target check s", "plans timed",
                                  "measured speed-up", metric])
    return (f"{table}\n\nMedian wall time: previous {result['median_s']['previous']:.1f} s, today "
            f"{result['median_s']['today']:.1f} s: **{result['ratio']:.2f}x** (limit {result['limit']}x): "
            f"**{judge('prune_cost', result)['status']}**.")


def command_line() -> CommandLine:
    parser = CommandLine("studies.prune_cost", __doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--pairs", type=count, default=2)
    parser.add_argument("--out", type=out_folder, default=None)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = command_line().parse_args(argv)
    print(markdown(run(args.quick, args.pairs, args.out)))


if __name__ == "__main__":
    raise SystemExit(run_command(main))
