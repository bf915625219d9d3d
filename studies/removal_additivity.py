"""Do removal savings add up? A latency table predicts a plan by adding its units' costs; this times, side by side
in one session, a network intact, with each named unit removed alone and with the named groups removed together, and
puts the sums of the single savings beside the measured joint savings and the table's predictions.

The question behind it: ConvNeXt-atto at 32 px missed the measured 1.5x (``studies.timm_prune``) because a plan the
table predicted at 1.53x measured 1.96x. Every network is timed as ``prune.py`` times its two
(:func:`zoo.jobs.final_timing.measure_side_by_side`: the deploy form, interleaved rounds, one thread, the table's
estimator), all in one session; the noise floor is the spread between two copies of the intact network.

    python -m studies.removal_additivity --arch convnext_atto --out results     # about a minute
"""

from __future__ import annotations

import tempfile
from typing import Any

import torch

from benchmarks.common import (
    CommandLine,
    count,
    machine,
    out_folder,
    results_dir,
    write_result,
)
from zoo.errors import run_command

GROUPS = {  # arch: named plans (every unit of a joint plan is also timed alone)
    "convnext_atto": {"stage 3, both blocks": ["stages.3.blocks.0", "stages.3.blocks.1"],
                      "stage 2, four blocks": ["stages.2.blocks.0", "stages.2.blocks.3", "stages.2.blocks.4",
                                               "stages.2.blocks.5"],
                      "the 1.53x plan": ["stages.3.blocks.0", "stages.2.blocks.0", "stages.2.blocks.3",
                                         "stages.2.blocks.4"]},
}


def run(arch: str = "convnext_atto", size: int = 32, batch: int = 32, rounds: int = 200, out: str | None = None,
        **_: Any) -> dict[str, Any]:
    """Time the plans of :data:`GROUPS` for `arch` and its table's predictions; write ``removal_additivity_<arch>``."""
    import zoo
    from zoo.jobs.final_timing import measure_side_by_side
    from zoo.latency import NetworkTimingSettings, TableSettings, build_table

    torch.set_num_threads(1)
    groups = GROUPS[arch]
    singles = sorted({unit for units in groups.values() for unit in units})
    plans = {"intact": [], "intact again": [], **{unit: [unit] for unit in singles}, **groups}
    model = zoo.create_model(f"timm/{arch}", num_classes=10).eval()
    networks = {name: zoo.apply_plan(model, {"remove": units}, inplace=False).eval() for name, units in plans.items()}
    with tempfile.TemporaryDirectory() as cache:  # measured now, not taken from an earlier run's cache
        table = build_table(model, batch_size=batch, input_size=size, device="cpu", cache_dir=cache,
                            settings=TableSettings(threads=1))
        every_round = NetworkTimingSettings(min_rounds=rounds, max_rounds=rounds, max_time_s=3600.0)
        stats = measure_side_by_side(table, networks, every_round, unfused=False)
    ms = {name: stats[name][f"{table.settings.estimator}_ms"] for name in networks}
    base = ms["intact"]
    saving = {name: base - value for name, value in ms.items()}
    whole = table.predict({"remove": []})
    predicted = {name: whole - table.predict({"remove": units}) for name, units in plans.items()}
    rows = [{"plan": name, "removed": units, "ms": round(ms[name], 3), "measured_saving_ms": round(saving[name], 3),
             "sum_of_single_savings_ms": round(sum(saving[u] for u in units), 3),
             "table_saving_ms": round(predicted[name], 3), "measured_speedup": round(base / ms[name], 3),
             "table_speedup": round(whole / table.predict({"remove": units}), 3)}
            for name, units in plans.items() if name not in ("intact", "intact again")]
    result = {"suite": "removal_additivity", "arch": arch, "input_size": size, "batch_size": batch, "rounds": rounds,
              "estimator": table.settings.estimator,
              "machine": machine("cpu"), "intact_ms": round(base, 3),
              "noise_floor": round(abs(ms["intact again"] / base - 1.0), 4), "rows": rows}
    write_result(f"removal_additivity_{arch}", result, out)
    return result


def markdown(result: dict[str, Any]) -> str:
    lines = [f"{result['arch']} at {result['input_size']} px, batch {result['batch_size']}: intact "
             f"{result['intact_ms']} ms (noise floor {100 * result['noise_floor']:.1f} %)", "",
             "| removed | measured saving ms | sum of single savings ms | table saving ms | speed-up (table) |",
             "|---|---:|---:|---:|---|"]
    lines += [f"| {r['plan']} | {r['measured_saving_ms']:.2f} | {r['sum_of_single_savings_ms']:.2f} | "
              f"{r['table_saving_ms']:.2f} | {r['measured_speedup']:.2f} ({r['table_speedup']:.2f}) |"
              for r in result["rows"]]
    return "\n".join(lines)


def command_line() -> CommandLine:
    parser = CommandLine("studies.removal_additivity", __doc__)
    parser.add_argument("--arch", default="convnext_atto", choices=sorted(GROUPS))
    parser.add_argument("--rounds", type=count, default=200, help="rounds of the side-by-side timing (prune.py's: "
                        "200-400)")
    parser.add_argument("--out", type=out_folder, default=None)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = command_line().parse_args(argv)
    print(markdown(run(args.arch, rounds=args.rounds, out=args.out)))
    print(f"result: {results_dir(args.out)}")


if __name__ == "__main__":
    raise SystemExit(run_command(main))
