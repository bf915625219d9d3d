"""Turn a pruning sweep into one table and one plot: ``python -m zoo.report <sweep_dir>``.

Collects every job's ``results.json`` under the sweep directory, lists jobs that failed (``failed.json``) or
have no result yet, and writes ``report.csv``, ``report.md`` (a table per model) and ``pareto.png``
(measured latency vs metric, one curve per model and search method, baselines marked). Latencies from
different devices or measurement conditions are never put on one curve unless ``--allow-mixed-devices``.
Also usable at the end of a sweep as a Hydra callback (:class:`ReportCallback`).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

from .checkpoint import atomic_write
from .errors import ZooError

COLUMNS = ("model", "search", "importance", "target_speedup", "device", "baseline_ms", "predicted_ms", "measured_ms",
           "measured_speedup", "prediction_error", "params", "baseline_params", "metric", "baseline_metric",
           "pruned_metric", "job")


class ReportError(ZooError):
    """A sweep directory that cannot be reported."""


def _metric_name(results: dict[str, Any]) -> str:
    metrics = results["pruned"]["metrics"]
    return next((k for k in ("val/acc1", "val/ppl", "val/loss") if k in metrics), next(iter(metrics), ""))


def row_of(results: dict[str, Any], job: str) -> dict[str, Any]:
    """One report row from one job's ``results.json``."""
    metric = _metric_name(results)
    return {
        "model": results["model"], "search": results.get("search", "dp"), "importance": results.get("importance"),
        "target_speedup": results.get("target_speedup"), "device": results["device"],
        "condition": json.dumps(results.get("condition", {}), sort_keys=True),
        "baseline_ms": results["baseline"]["latency_ms"], "predicted_ms": results["predicted_latency_ms"],
        "measured_ms": results["pruned"]["latency_ms"], "measured_speedup": results["measured_speedup"],
        "prediction_error": results["prediction_error"], "params": results["pruned"]["params"],
        "baseline_params": results["baseline"]["params"], "metric": metric,
        "baseline_metric": results["baseline"]["metrics"].get(metric),
        "pruned_metric": results["pruned"]["metrics"].get(metric), "job": job,
    }


def collect(sweep_dir: str | Path) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """(rows of finished jobs, problems: failed or unfinished jobs with the reason)."""
    root = Path(sweep_dir)
    if not root.is_dir():
        raise ReportError(f"Sweep directory {root} does not exist. Give the directory a `prune.py -m` run wrote "
                          f"(it holds one numbered subdirectory per job).")
    rows, problems = [], []
    job_dirs = sorted({p.parent for p in root.rglob(".hydra")} | {p.parent for p in root.rglob("results.json")})
    for job in job_dirs:
        name = str(job.relative_to(root)) or "."
        results, failed = job / "results.json", job / "failed.json"
        if results.is_file():
            try:
                rows.append(row_of(json.loads(results.read_text()), name))
            except (ValueError, KeyError) as exc:
                problems.append({"job": name, "status": "unreadable", "reason": f"{type(exc).__name__}: {exc}"})
        elif failed.is_file():
            reason = json.loads(failed.read_text()).get("message", "")
            problems.append({"job": name, "status": "failed", "reason": reason[:300]})
        else:
            problems.append({"job": name, "status": "missing", "reason": "no results.json (still running or killed)"})
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


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)

    atomic_write(path, write)


def markdown(rows: list[dict[str, Any]], problems: list[dict[str, str]]) -> str:
    """A table per model, sorted by search method and target, then the list of problem jobs."""
    lines = ["# Pruning study report", ""]
    by_model: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_model[row["model"]].append(row)
    for model, model_rows in sorted(by_model.items()):
        first = model_rows[0]
        lines += [f"## {model} on {first['device']}", "",
                  f"Baseline: {first['baseline_ms']:.3f} ms, {first['baseline_params']:,} params, "
                  f"{first['metric']} {first['baseline_metric']:.3f}", "",
                  "| search | target | predicted ms | measured ms | speed-up | pred. error | params | "
                  f"{first['metric']} before | after |", "|---|---|---|---|---|---|---|---|---|"]
        for row in sorted(model_rows, key=lambda r: (r["search"], r["target_speedup"] or 0)):
            lines.append(f"| {row['search']} | {row['target_speedup']} | {row['predicted_ms']:.3f} | "
                         f"{row['measured_ms']:.3f} | {row['measured_speedup']:.2f}x | {row['prediction_error']:+.1%} |"
                         f" {row['params']:,} | {row['baseline_metric']:.3f} | {row['pruned_metric']:.3f} |")
        lines.append("")
    if problems:
        lines += ["## Jobs without results", "", "| job | status | reason |", "|---|---|---|"]
        lines += [f"| {p['job']} | {p['status']} | {p['reason'].replace('|', '/')} |" for p in problems]
        lines.append("")
    return "\n".join(lines)


def pareto_plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Measured latency vs metric, one curve per (model, search method), each model's baseline as a star."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    curves: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        curves[(row["model"], row["search"])].append(row)
    for (model, method), points in sorted(curves.items()):
        points.sort(key=lambda r: r["measured_ms"])
        latencies, metrics = [p["measured_ms"] for p in points], [p["pruned_metric"] for p in points]
        ax.plot(latencies, metrics, "o-", label=f"{model} {method}")
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
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120))
    plt.close(fig)


def make_report(sweep_dir: str | Path, allow_mixed_devices: bool = False, log_wandb: bool = False) -> dict[str, Any]:
    """Write report.csv, report.md and pareto.png into `sweep_dir`; returns paths, rows and problems."""
    root = Path(sweep_dir)
    rows, problems = collect(root)
    if not rows:
        listed = "; ".join(f"{p['job']}: {p['status']}" for p in problems) or "no job directories found"
        raise ReportError(f"No finished job in {root} ({listed}). Nothing to report yet.")
    check_devices(rows, allow_mixed_devices)
    write_csv(rows, root / "report.csv")
    text = markdown(rows, problems)
    atomic_write(root / "report.md", lambda tmp: tmp.write_text(text))
    pareto_plot(rows, root / "pareto.png")
    paths = {name: str(root / name) for name in ("report.csv", "report.md", "pareto.png")}
    if log_wandb:
        _log_wandb(root, rows, paths)
    return {"rows": rows, "problems": problems, "paths": paths}


def _log_wandb(root: Path, rows: list[dict[str, Any]], paths: dict[str, str]) -> None:
    import wandb

    run = wandb.init(project="depthzoo", group=str(root), name="report", job_type="report", mode="offline",
                     dir=str(root), reinit="finish_previous")
    try:
        run.log({"report/table": wandb.Table(columns=list(COLUMNS), data=[[r.get(c) for c in COLUMNS] for r in rows]),
                 "report/pareto": wandb.Image(paths["pareto.png"])})
    finally:
        run.finish()


class ReportCallback(Callback):
    """Hydra callback: ``hydra.callbacks.report._target_: zoo.report.ReportCallback`` reports each sweep at its end."""

    def __init__(self, allow_mixed_devices: bool = False, log_wandb: bool = False):
        self.allow_mixed_devices, self.log_wandb = allow_mixed_devices, log_wandb

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        try:
            result = make_report(config.hydra.sweep.dir, self.allow_mixed_devices, self.log_wandb)
            print(f"report: {result['paths']['report.md']} ({len(result['rows'])} jobs, "
                  f"{len(result['problems'])} without results)")
        except ReportError as exc:
            print(f"report: {exc}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zoo.report", description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir")
    parser.add_argument("--allow-mixed-devices", action="store_true")
    parser.add_argument("--wandb", action="store_true", help="also log the table and plot to W&B (offline)")
    args = parser.parse_args(argv)
    try:
        result = make_report(args.sweep_dir, args.allow_mixed_devices, args.wandb)
    except ReportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(Path(result["paths"]["report.md"]).read_text())
    for problem in result["problems"]:
        print(f"warning: job {problem['job']} {problem['status']}: {problem['reason']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
