"""How much does one side-by-side measurement of a speed-up move between repeats? ``prune.py`` times a plan beside
its baseline to decide whether it meets the target (the measured-target loop) and times the result again at the end;
if one measurement moves by more than the tolerance between repeats, a plan accepted in the loop can miss at the end.

This takes a finished prune run (its baseline checkpoint, plan and timing condition), applies the plan one shot and
times the pair `repeats` times at each round count, alternating the round counts, with ``prune.py``'s own timing
(:func:`zoo.jobs.final_timing.measure_side_by_side`, the table's estimator). It reports per round count the mean,
standard deviation and range of the measured speed-up.

    python prune.py hydra.run.dir=outputs/default
    python -m studies.measure_repeat --run outputs/default --out results      # about 3 minutes
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import (
    CommandLine,
    at_least,
    count,
    machine,
    out_folder,
    results_dir,
    run_folder,
    write_result,
)
from zoo.errors import ZooError, run_command
from zoo.files import read_sealed_json


def read_run(run: Path) -> dict[str, Any]:
    """The finished run's sealed results (refused when the folder holds none; CorruptFileError when not intact)."""
    path = run / "results.json"
    if not path.is_file():
        raise ZooError(f"--run {run}: no results.json there; give the folder of a finished prune.py run.")
    return read_sealed_json(path)


def run(run_dir: str, rounds: tuple[int, ...] = (20, 200), repeats: int = 8, out: str | None = None
        ) -> dict[str, Any]:
    """Time the run's plan beside its baseline `repeats` times at each of `rounds`; write ``measure_repeat``."""
    import zoo
    from zoo.jobs.final_timing import measure_side_by_side
    from zoo.latency import build_table
    from zoo.latency.settings import NetworkTimingSettings, TableSettings

    results = read_run(Path(run_dir))
    condition = results["condition"]
    baseline = zoo.load(results["baseline"]["source"]).eval()
    pruned = zoo.apply_plan(baseline, results["plan"], inplace=False).eval()
    with tempfile.TemporaryDirectory() as cache:  # the table gives the timing condition; its entries are not used
        table = build_table(baseline, batch_size=condition["batch_size"], input_size=tuple(condition["input_size"]),
                            device="cpu", cache_dir=cache, settings=TableSettings(threads=condition["threads"]))
    estimate = f"{table.settings.estimator}_ms"
    speedups: dict[int, list[float]] = {n: [] for n in rounds}
    for _ in range(repeats):
        for n in rounds:
            settings = NetworkTimingSettings(min_rounds=n, max_rounds=n)
            timed = measure_side_by_side(table, {"baseline": baseline, "pruned": pruned}, settings, unfused=False)
            speedups[n].append(timed["baseline"][estimate] / timed["pruned"][estimate])
    rows = [{"rounds": n, "speedups": [round(s, 4) for s in values], "mean": round(statistics.mean(values), 4),
             "sd_relative": round(statistics.stdev(values) / statistics.mean(values), 4),
             "low": round(min(values), 4), "high": round(max(values), 4)} for n, values in speedups.items()]
    result = {"suite": "measure_repeat", "run": str(run_dir), "model": results["model"], "plan": results["plan"],
              "condition": {k: condition[k] for k in ("batch_size", "input_size", "threads", "dtype", "runtime")},
              "estimator": table.settings.estimator, "repeats": repeats, "machine": machine("cpu"), "rows": rows}
    write_result("measure_repeat", result, out)
    return result


def command_line() -> CommandLine:
    parser = CommandLine("studies.measure_repeat", __doc__)
    parser.add_argument("--run", type=run_folder, required=True, help="the folder of a finished prune.py run")
    parser.add_argument("--rounds", type=count, nargs="+", default=[20, 200])
    parser.add_argument("--repeats", type=at_least(2), default=8)
    parser.add_argument("--out", type=out_folder, default=None)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = command_line().parse_args(argv)
    torch.set_num_threads(1)
    result = run(args.run, tuple(args.rounds), args.repeats, args.out)
    for row in result["rows"]:
        print(f"{row['rounds']:>4} rounds: {row['mean']:.3f}x mean, sd {100 * row['sd_relative']:.1f} %, "
              f"range {row['low']:.3f}-{row['high']:.3f}x")
    print(f"result: {results_dir(args.out)}")


if __name__ == "__main__":
    raise SystemExit(run_command(main))
