"""The sweep report (`python -m zoo report`) groups the jobs that repeat one config over seeds: mean and sample
standard deviation in report.md and report.csv, error bars in pareto.png (checked against hand-computed numbers)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from zoo.jobs.sweep_report import make_report, pareto_figure, summarize


def write_job(root: Path, name: str, group: str, seed: int, search: str, ms: float, acc: float) -> None:
    job = root / name
    job.mkdir(parents=True)
    results = {"model": "mobilenetv2_035", "device": "cpu", "condition": {"device": "cpu"}, "search": search,
               "importance": "loss", "target_speedup": 1.5, "predicted_latency_ms": ms, "prediction_error": 0.0,
               "measured_speedup": 10.0 / ms, "config_group": group, "seeds": {"trainer.seed": seed, "prune.seed": 0},
               "baseline": {"latency_ms": 10.0, "params": 1000, "metrics": {"val/acc1": 90.0}},
               "pruned": {"latency_ms": ms, "params": 800, "metrics": {"val/acc1": acc}}}
    (job / "results.json").write_text(json.dumps(results))


def test_seeds_of_one_config_are_one_row_with_mean_and_spread(tmp_path):
    # dp over three seeds: accuracies 80, 82, 84 -> mean 82, sample std 2; latencies 5, 5, 6.5 -> mean 5.5, std 0.866
    for seed, (ms, acc) in enumerate([(5.0, 80.0), (5.0, 82.0), (6.5, 84.0)]):
        write_job(tmp_path, f"dp_{seed}", "A", seed, "dp", ms, acc)
    write_job(tmp_path, "random_0", "B", 0, "random", 5.0, 70.0)
    result = make_report(tmp_path)
    summaries = {s["search"]: s for s in summarize(result["rows"])}
    dp = summaries["dp"]
    assert dp["n"] == 3 and dp["seeds"] == "0 1 2"
    assert dp["pruned_metric_mean"] == pytest.approx(82.0) and dp["pruned_metric_std"] == pytest.approx(2.0)
    assert dp["measured_ms_mean"] == pytest.approx(5.5) and dp["measured_ms_std"] == pytest.approx(0.8660254)
    assert summaries["random"]["n"] == 1 and summaries["random"]["pruned_metric_std"] == 0.0
    report = (tmp_path / "report.md").read_text()
    assert "| dp | loss | 1.5 | 3 | 5.500 ± 0.866 |" in report and "82.000 ± 2.000 |" in report
    assert "| random | loss | 1.5 | 1 | 5.000 |" in report
    table = list(csv.DictReader((tmp_path / "report.csv").open()))
    assert len(table) == 2 and {r["n"] for r in table} == {"3", "1"}
    row = next(r for r in table if r["search"] == "dp")
    assert float(row["pruned_metric_std"]) == pytest.approx(2.0)
    figure = pareto_figure(result["rows"])  # one error-bar curve per method, the bars one standard deviation
    bars = figure.axes[0].containers
    assert len(bars) == 2
    dp_bars = next(c for c in bars if "dp" in c.get_label())
    ((low, high),) = [(seg[0][1], seg[1][1]) for seg in dp_bars.lines[2][1].get_segments()]
    assert (low, high) == pytest.approx((80.0, 84.0))
    assert (tmp_path / "pareto.png").stat().st_size > 0


def test_jobs_without_a_group_stay_separate(tmp_path):
    """Results written before config_group existed: every job its own row."""
    for seed in range(2):
        write_job(tmp_path, f"old_{seed}", "x", seed, "dp", 5.0, 80.0 + seed)
        data = json.loads((tmp_path / f"old_{seed}" / "results.json").read_text())
        del data["config_group"]
        (tmp_path / f"old_{seed}" / "results.json").write_text(json.dumps(data))
    result = make_report(tmp_path)
    assert [s["n"] for s in summarize(result["rows"])] == [1, 1]


def test_the_report_draws_the_measured_pareto_front(tmp_path):
    """Five configs (one job each): (ms, acc) = (4, 70) (5, 80) (6, 75) (7, 85) (8, 85). The front, fastest first, is
    the configs no other beats on both: 4/70, 5/80, 7/85 (6/75 is beaten by 5/80, 8/85 by 7/85)."""
    from zoo.jobs.sweep_report import pareto_front

    points = [(4.0, 70.0), (5.0, 80.0), (6.0, 75.0), (7.0, 85.0), (8.0, 85.0)]
    for i, (ms, acc) in enumerate(points):
        write_job(tmp_path, f"job{i}", f"g{i}", 0, "dp", ms, acc)
    result = make_report(tmp_path)
    front = pareto_front(summarize(result["rows"]))
    assert [(p["measured_ms_mean"], p["pruned_metric_mean"]) for p in front] == [(4.0, 70.0), (5.0, 80.0), (7.0, 85.0)]
    assert "Pareto front (measured): 3 of 5 configs" in (tmp_path / "report.md").read_text()
    (line,) = [ln for ln in pareto_figure(result["rows"]).axes[0].lines if "Pareto front" in ln.get_label()]
    assert list(line.get_xdata()) == [4.0, 5.0, 7.0] and list(line.get_ydata()) == [70.0, 80.0, 85.0]


def test_the_report_warns_where_a_baseline_did_not_learn(tmp_path):
    """A job whose results.json says its baseline did not learn (baseline.health) puts a warning above its model's
    table; results without health (written before it existed) count as trained."""
    write_job(tmp_path, "ok_0", "A", 0, "dp", 5.0, 80.0)
    make_report(tmp_path)
    assert "did not learn" not in (tmp_path / "report.md").read_text()
    data = json.loads((tmp_path / "ok_0" / "results.json").read_text())
    data["baseline"]["health"] = {"trained": False, "top1": 10.0, "chance": 10.0, "why": "top-1 at chance"}
    (tmp_path / "ok_0" / "results.json").write_text(json.dumps(data))
    make_report(tmp_path)
    assert "Warning: a baseline of mobilenetv2_035 did not learn" in (tmp_path / "report.md").read_text()
