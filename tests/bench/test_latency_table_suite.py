"""Latency measurement, lookup tables, cache safety, prediction error and correction, CLI and benchmark smoke test
(CPU, tiny sizes). How entries are timed (CUDA protocols, in-context timing, drift) is in test_latency_timing.py."""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path


def test_benchmark_quick_smoke(tmp_path: Path) -> None:
    from benchmarks.latency_table import markdown, run

    result = run(quick=True, out=tmp_path / "latency_table.json")
    row = result["rows"][0]
    assert row["repeats"] == len(row["builds"]) == 2 and row["clock"] == "wall" and row["entries_timing"] == "auto"
    assert len({build["pid"] for build in row["builds"]} | {os.getpid()}) == 3  # every build in a process of its own
    for build in row["builds"]:
        assert build["cached_measured"] == 0 and build["entries"] > 0
        limit = max(0.03, 1.5 * build["noise_floor"])  # the verdict is computed from the target
        assert build["target"] == limit
        assert build["passed"] == (build["mean_abs_error_raw"] <= limit and build["max_abs_error_raw"] <= limit)
    assert row["passed"] == (row["builds_passed"] >= 0.9 * row["repeats"]) and result["passed"] == row["passed"]
    assert "| mobilenetv2_035 |" in markdown(result)
    assert f"| {row['builds_passed']}/2 {'passed' if row['passed'] else 'failed'} |" in markdown(result)
    for build in row["builds"]:  # the anchored verdict, too, is computed from the target
        anchored = max(build["mean_abs_error_anchored"], build["max_abs_error_anchored"])
        assert build["passed_anchored"] == (anchored <= build["target"])
    for build in row["builds"]:  # per-plan records are the ones the verdicts were computed from
        assert len(build["plans"]) == row["n_plans"]
        assert max(abs(p["error_anchored"]) for p in build["plans"]) == build["max_abs_error_anchored"]
    from studies.table_error_parts import parts

    plans = parts(result)[0]["plans"]  # the study reads the suite's run: the same held-out plans in every build
    assert len(plans) == row["n_plans"]
    for summary in plans:
        i = next(j for j, p in enumerate(row["builds"][0]["plans"]) if p["label"] == summary["label"])
        assert len({tuple(b["plans"][i]["remove"]) for b in row["builds"]}) == 1
        errors = [b["plans"][i]["error_anchored"] for b in row["builds"]]
        assert (summary["min"], summary["median"], summary["max"]) == (min(errors), statistics.median(errors),
                                                                      max(errors))
        assert summary["same_sign"] == sum((e > 0) == (summary["median"] > 0) for e in errors) / len(errors)
    assert json.loads((tmp_path / "latency_table.json").read_text())["rows"]
