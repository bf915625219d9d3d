"""The benchmark runner runs its smallest configurations (smoke tests, no timing asserts); the GPU check is the same
runner over a named set (its CPU dry run here), and every status is its suites' targets against stored numbers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ..helpers import env_for

ROOT = Path(__file__).resolve().parents[2]


def test_runtime_tables_quick_computes_its_verdicts(tmp_path):
    from benchmarks.runtime_tables import table_verdicts

    proc = subprocess.run([sys.executable, "-m", "benchmarks.runtime_tables", "--quick", "--runtimes",
                           "eager,onnxruntime", "--out", str(tmp_path)], capture_output=True, text=True, cwd=ROOT,
                          env=env_for(tmp_path), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "runtime_tables_quick.json").read_text())
    (model,) = result["models"]
    assert set(model["tables"]) == {"eager", "onnxruntime"} and result["complete"]
    tables = table_verdicts(result)
    for runtime, table in model["tables"].items():  # each verdict is its numbers against its limits
        mean_limit, max_limit = max(0.05, 1.5 * table["noise_floor"]), max(0.10, 1.5 * table["noise_floor"])
        assert tables[(model["model"], runtime)]["raw"] == (table["mean_error"] <= mean_limit
                                                           and table["max_error"] <= max_limit)
        assert tables[(model["model"], runtime)]["anchored"] == (table["mean_error_anchored"] <= mean_limit
                                                                and table["max_error_anchored"] <= max_limit)
    for s in model["speedups"]:
        own = [c for c in model["cross"] if c["chosen_in"] == c["measured_in"] == s["runtime"]
               and c["target"] == s["target"]]
        label = f"{model['model']} {s['target']}x plan chosen in {s['runtime']}: measured speed-up"
        assert result["verdicts"][label] == (own[0]["measured_speedup"] >= 0.9 * s["target"] if own else None)
    assert result["status"] in ("passed", "failed", "incomplete")
    assert "| mobilenetv2_035 | onnxruntime |" in proc.stdout


def test_runtime_diagnosis_times_the_same_network_whole_and_segment_by_segment(tmp_path):
    """The diagnosis runs each plan's network as one onnxruntime program and as one program per segment (checked
    inside to compute the plan's output) and reports both beside the table's anchored prediction."""
    proc = subprocess.run([sys.executable, "-m", "studies.runtime_diagnosis", "--model", "mobilenetv2_035",
                           "--runtime", "onnxruntime", "--input-size", "32", "--plans", "0,1", "--rounds", "3",
                           "--out", str(tmp_path)], capture_output=True, text=True, cwd=ROOT, env=env_for(tmp_path),
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "runtime_diagnosis_mobilenetv2_035_onnxruntime.json").read_text())
    assert [r["network"] for r in result["rows"]] == ["original", "plan 0", "plan 1"]
    for row in result["rows"]:
        assert row["whole_ms"] > 0 and row["segmented_ms"] > 0
        assert row["anchored_error"] == pytest.approx(row["predicted_anchored_ms"] / row["whole_ms"] - 1)
    assert result["rows"][0]["anchored_error"] == pytest.approx(0.0, abs=1e-9)
    assert "| plan 1 |" in proc.stdout
