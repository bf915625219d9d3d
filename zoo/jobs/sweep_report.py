"""Turn a pruning sweep into one table and one plot: ``python -m zoo report <sweep_dir>``.

Collects every job's ``results.json`` under the sweep directory, lists jobs that failed (``failed.json``) or
have no result yet, and writes ``report.csv``, ``report.md`` (a table per model) and ``pareto.png``
(measured latency vs metric, one curve per model and search method, baselines marked). Jobs that repeat one
config over seeds (``trainer.seed``, ``prune.seed``: the same ``config_group`` in results.json) are one row: the
mean and the sample standard deviation over the seeds, and error bars of one standard deviation in the plot.
Latencies from different devices or measurement conditions are never put on one curve unless
``--allow-mixed-devices``.
Also usable at the end of a sweep as a Hydra callback (:class:`ReportCallback`).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from ..errors import ReportError, run_command
from ..files import atomic_write
from .cli import SweepCallback

COLUMNS = ("model", "search", "importance", "target_speedup", "device", "baseline_ms", "predicted_ms", "measured_ms",
           "measured_speedup", "prediction_error", "params", "baseline_params", "metric", "baseline_metric",
           "pruned_metric", "job", "seed", "group")
SPREAD = ("measured_ms", "measured_speedup", "prediction_error", "baseline_metric", "pruned_metric", "params")
SUMMARY_COLUMNS = ("model", "search", "importance", "target_speedup", "device", "n", "seeds", "baseline_ms",
                   *(f"{k}_{stat}" for k in SPREAD for stat in ("mean", "std")), "metric", "jobs")


def _metric_name(results: dict[str, Any]) -> str:
    metrics = results["pruned"]["metrics"]
    return next((k for k in ("val/acc1", "val/ppl", "val/loss") if k in metrics), next(iter(metrics), ""))


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ReportError(f"{what} is {value!r}, not a number")
    return float(value)


def row_of(results: Any, job: str) -> dict[str, Any]:
    """One report row from one job's ``results.json``; raises ReportError naming what is missing or malformed."""
    if not isinstance(results, dict):
        raise ReportError(f"results.json holds a {type(results).__name__}, not an object")
    try:
        metric = _metric_name(results)
        if not metric:
            raise ReportError("results.json has no validation metric (pruned.metrics is empty)")
        return {
            "model": results["model"], "search": results.get("search", "dp"), "importance": results.get("importance"),
            "target_speedup": results.get("target_speedup"), "device": results["device"],
            "condition": json.dumps(results.get("condition", {}), sort_keys=True),
            "baseline_ms": _number(results["baseline"]["latency_ms"], "baseline.latency_ms"),
            "predicted_ms": _number(results["predicted_latency_ms"], "predicted_latency_ms"),
            "measured_ms": _number(results["pruned"]["latency_ms"], "pruned.latency_ms"),
            "measured_speedup": _number(results["measured_speedup"], "measured_speedup"),
            "prediction_error": _number(results["prediction_error"], "prediction_error"),
            "params": results["pruned"]["params"], "baseline_params": results["baseline"]["params"], "metric": metric,
            "baseline_metric": _number(results["baseline"]["metrics"].get(metric), f"baseline {metric}"),
            "pruned_metric": _number(results["pruned"]["metrics"].get(metric), f"pruned {metric}"), "job": job,
            "seed": (results.get("seeds") or {}).get("trainer.seed"), "group": results.get("config_group") or job,
            "baseline_trained": (results["baseline"].get("health") or {}).get("trained", True),
        }
    except (KeyError, TypeError, AttributeError) as exc:
        raise ReportError(f"results.json lacks {exc}") from None


def _failure(path: Path) -> dict[str, str]:
    """What a job's ``failed.json`` says: its one-line error and overrides (or that the file is unreadable)."""
    try:
        failed = json.loads(path.read_text())
        if not isinstance(failed, dict):
            raise ValueError("not an object")
    except (OSError, ValueError) as exc:
        return {"status": "failed", "reason": f"failed.json is unreadable ({exc})", "overrides": ""}
    reason = f"{failed.get('error', 'error')}: {failed.get('message', '')}"
    return {"status": "failed", "reason": reason[:300], "overrides": " ".join(map(str, failed.get("overrides", [])))}


def collect(sweep_dir: str | Path) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """(rows of finished jobs, problems: failed, unreadable or unfinished jobs with the reason)."""
    root = Path(sweep_dir)
    if not root.is_dir():
        raise ReportError(f"Sweep directory {root} does not exist. Give the directory a `prune.py -m` run wrote "
                          f"(it holds one subdirectory per job).")
    rows, problems = [], []
    found = {p.parent for p in root.rglob(".hydra")} | {p.parent for p in root.rglob("results.json")} | {
        p.parent for p in root.rglob("failed.json")}
    for job in sorted(found):
        name = str(job.relative_to(root)) or "."
        results, failed = job / "results.json", job / "failed.json"
        if results.is_file():
            try:
                rows.append(row_of(json.loads(results.read_text()), name))
            except (ValueError, ReportError) as exc:
                problems.append({"job": name, "status": "unreadable", "reason": str(exc), "overrides": ""})
        elif failed.is_file():
            problems.append({"job": name, **_failure(failed)})
        else:
            problems.append({"job": name, "status": "missing", "reason": "no results.json (still running or killed)",
                             "overrides": ""})
    return rows, problems


def check_devices(rows: list[dict[str, Any]], allow_mixed: bool) -> None:
    """Refuse to compare latencies measured under different conditions on one curve."""
    by_model: dict[str, set[str]] = defaultdict(set)
    for row in rows:
        by_model[row["model"]].add(row["condition"])
    mixed = sorted(m for m, conditions in by_model.items() if len(conditions) > 1)
    if mixed and not allow_mixed:
        raise ReportError(
            f"Latencies of {', '.join(mixed)} were measured under different devices or conditions (device, dtype, "
            f"batch, input size, threads); they cannot share a curve. Report those jobs separately, or pass "
            f"--allow-mixed-devices to plot them anyway."
        )


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (model, config group): the jobs that repeat a config over seeds, with the mean and the sample
    standard deviation (0 for one job) of every measured quantity."""
    import statistics

    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[(row["model"], row["group"])].append(row)
    summaries = []
    for jobs in groups.values():
        first = jobs[0]
        summary = {k: first[k] for k in ("model", "search", "importance", "target_speedup", "device", "condition",
                                         "metric", "baseline_ms", "baseline_params")}
        summary.update(n=len(jobs), seeds=" ".join(str(j["seed"]) for j in jobs), jobs=" ".join(j["job"] for j in jobs))
        for key in SPREAD:
            values = [float(j[key]) for j in jobs]
            summary[f"{key}_mean"] = statistics.fmean(values)
            summary[f"{key}_std"] = statistics.stdev(values) if len(values) > 1 else 0.0
        summaries.append(summary)
    return sorted(summaries, key=lambda r: (r["model"], r["search"], str(r["importance"]), r["target_speedup"] or 0))


def _spread(summary: dict[str, Any], key: str, fmt: str) -> str:
    mean, std = summary[f"{key}_mean"], summary[f"{key}_std"]
    return format(mean, fmt) if summary["n"] == 1 else f"{format(mean, fmt)} ± {format(std, fmt)}"


def markdown(rows: list[dict[str, Any]], problems: list[dict[str, str]]) -> str:
    """A table per model (one row per config; mean ± standard deviation over its seeds), then the problem jobs."""
    lines = ["# Pruning study report", "",
             "Each row is one config; `n` jobs repeat it over seeds, shown as mean ± sample standard deviation.", ""]
    untrained = {row["model"] for row in rows if not row.get("baseline_trained", True)}
    by_model: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for summary in summarize(rows):
        by_model[summary["model"]].append(summary)
    for model, summaries in sorted(by_model.items()):
        first = summaries[0]
        lines += [f"## {model} on {first['device']}", "",
                  f"Baseline: {first['baseline_ms']:.3f} ms, {first['baseline_params']:,} params, "
                  f"{first['metric']} {_spread(first, 'baseline_metric', '.3f')}", "",
                  *([f"> **Warning: a baseline of {model} did not learn** (its top-1 is within 5 points of chance; "
                     f"`results.json` `baseline.health`): the accuracy columns say nothing about pruning.", ""]
                    if model in untrained else []),
                  "| search | importance | target | n | measured ms | speed-up | pred. error | params | "
                  f"{first['metric']} before | after |", "|---|---|---|---|---|---|---|---|---|---|"]
        for row in summaries:
            lines.append(f"| {row['search']} | {row['importance']} | {row['target_speedup']} | {row['n']} | "
                         f"{_spread(row, 'measured_ms', '.3f')} | {_spread(row, 'measured_speedup', '.2f')}x | "
                         f"{_spread(row, 'prediction_error', '+.1%')} | {row['params_mean']:,.0f} | "
                         f"{_spread(row, 'baseline_metric', '.3f')} | {_spread(row, 'pruned_metric', '.3f')} |")
        front = pareto_front(summaries)
        lines += ["", f"Pareto front (measured): {len(front)} of {len(summaries)} configs are beaten by no other on "
                  f"both latency and {first['metric']}:", "", f"| measured ms | {first['metric']} | jobs |",
                  "|---|---|---|"]
        lines += [f"| {_spread(row, 'measured_ms', '.3f')} | {_spread(row, 'pruned_metric', '.3f')} | "
                  f"{row['jobs']} |" for row in front]
        lines.append("")
    if problems:
        lines += ["## Jobs without results", "", "| job | status | overrides | reason |", "|---|---|---|---|"]
        lines += [f"| {p['job']} | {p['status']} | {p.get('overrides', '')} | {p['reason'].replace('|', '/')} |"
                  for p in problems]
        lines.append("")
    return "\n".join(lines)


def higher_is_better(metric: str) -> bool:
    return metric.endswith(("acc1", "acc5"))


def pareto_front(summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The configs no other config beats on both measured latency and metric (per model), fastest first: what a
    study found, whatever its sweeper (a grid, or Optuna's multi-objective search)."""
    front = []
    for model in sorted({s["model"] for s in summaries}):
        points = sorted((s for s in summaries if s["model"] == model), key=lambda s: s["measured_ms_mean"])
        sign = 1.0 if higher_is_better(points[0]["metric"]) else -1.0
        best = -float("inf")
        for point in points:
            value = sign * point["pruned_metric_mean"]
            if value > best:
                front.append(point)
                best = value
    return front


def pareto_figure(rows: list[dict[str, Any]]) -> Any:
    """Measured latency vs metric, one curve per (model, search method), the measured Pareto front over all of them
    as a step line, each model's baseline as a star."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    curves: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for summary in summarize(rows):
        curves[(summary["model"], summary["search"], str(summary["importance"]))].append(summary)
    for (model, method, importance), points in sorted(curves.items()):
        points.sort(key=lambda r: r["measured_ms_mean"])
        ax.errorbar([p["measured_ms_mean"] for p in points], [p["pruned_metric_mean"] for p in points],
                    xerr=[p["measured_ms_std"] for p in points], yerr=[p["pruned_metric_std"] for p in points],
                    fmt="o-", capsize=3, label=f"{model} {method} ({importance})")
    front = pareto_front(summarize(rows))
    for model in sorted({p["model"] for p in front}):
        points = [p for p in front if p["model"] == model]
        ax.step([p["measured_ms_mean"] for p in points], [p["pruned_metric_mean"] for p in points], "k--",
                where="post", lw=1.5, alpha=0.6, label=f"{model} Pareto front (measured)")
    for model in sorted({r["model"] for r in rows}):
        base = next(r for r in rows if r["model"] == model)
        ax.plot(base["baseline_ms"], base["baseline_metric"], "k*", ms=12)
        ax.annotate(f"{model} baseline", (base["baseline_ms"], base["baseline_metric"]), fontsize=7, ha="right",
                    xytext=(-8, 4), textcoords="offset points")
    ax.set_xlabel(f"measured latency (ms) on {rows[0]['device']}")
    ax.set_ylabel(rows[0]["metric"])
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def csv_text(rows: list[dict[str, Any]]) -> str:
    """One line per config: its seeds, and the mean and standard deviation of each measured quantity."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=SUMMARY_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(summarize(rows))
    return out.getvalue()


def png_bytes(fig: Any) -> bytes:
    import matplotlib.pyplot as plt

    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=120)
    plt.close(fig)
    return out.getvalue()


def make_report(sweep_dir: str | Path, allow_mixed_devices: bool = False, log_wandb: bool = False) -> dict[str, Any]:
    """Write report.csv, report.md and pareto.png into `sweep_dir`; returns paths, rows and problems.

    All three are made in memory first and then written (each atomically), so a report that cannot be made
    leaves the previous files as they were.
    """
    root = Path(sweep_dir)
    rows, problems = collect(root)
    if not rows:
        listed = "; ".join(f"{p['job']}: {p['status']}" for p in problems) or "no job directories found"
        raise ReportError(f"No finished job in {root} ({listed}). Nothing to report yet.")
    check_devices(rows, allow_mixed_devices)
    contents = {"report.csv": csv_text(rows).encode(), "report.md": markdown(rows, problems).encode(),
                "pareto.png": png_bytes(pareto_figure(rows))}
    for name, data in contents.items():
        atomic_write(root / name, lambda tmp, data=data: tmp.write_bytes(data))
    paths = {name: str(root / name) for name in contents}
    if log_wandb:
        _log_wandb(root, rows, paths)
    return {"rows": rows, "problems": problems, "paths": paths}


def _log_wandb(root: Path, rows: list[dict[str, Any]], paths: dict[str, str]) -> None:
    import wandb

    from ..training.logger import finish_run

    run = wandb.init(project="depthzoo", group=str(root), name="report", job_type="report", mode="offline",
                     dir=str(root), reinit="finish_previous")
    try:
        run.log({"report/table": wandb.Table(columns=list(COLUMNS), data=[[r.get(c) for c in COLUMNS] for r in rows]),
                 "report/pareto": wandb.Image(paths["pareto.png"])})
    finally:
        finish_run(run)


class ReportCallback(SweepCallback):
    """Hydra callback (``hydra.callbacks.outcome._target_: zoo.jobs.sweep_report.ReportCallback``): at the end of each
    sweep,
    write its report, then exit with status 1 if any job of this launch failed (:class:`~zoo.jobs.cli.SweepCallback`).
    """

    def __init__(self, allow_mixed_devices: bool = False, log_wandb: bool = False):
        self.allow_mixed_devices, self.log_wandb = allow_mixed_devices, log_wandb

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        try:
            result = make_report(config.hydra.sweep.dir, self.allow_mixed_devices, self.log_wandb)
            print(f"report: {result['paths']['report.md']} ({len(result['rows'])} jobs, "
                  f"{len(result['problems'])} without results)")
        except ReportError as exc:
            print(f"report: {exc}", file=sys.stderr)
        self.finish(config.hydra.sweep.dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zoo report", description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir")
    parser.add_argument("--allow-mixed-devices", action="store_true")
    parser.add_argument("--wandb", action="store_true", help="also log the table and plot to W&B (offline)")
    args = parser.parse_args(argv)

    def command() -> int:
        result = make_report(args.sweep_dir, args.allow_mixed_devices, args.wandb)
        print(Path(result["paths"]["report.md"]).read_text())
        for problem in result["problems"]:
            print(f"warning: job {problem['job']} {problem['status']}: {problem['reason']}", file=sys.stderr)
        return 0

    return run_command(command)


if __name__ == "__main__":
    raise SystemExit(main())
