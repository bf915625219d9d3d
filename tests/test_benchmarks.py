"""The benchmark entry point and the GPU check run their smallest configurations (smoke tests, no timing asserts)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.__main__ import update_docs

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
DRY_STEPS = ["measurement", "lut", "prune_search", "retnet_decode", "fla", "train_memory"]  # runtimes: a slow test


def test_entry_point_runs_quick_suites(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "run", "zoo_vs_timm", "prune_speedup", "export_parity",
                           "--quick",
                           "--out", str(tmp_path), "--device", "cpu"], capture_output=True, text=True, cwd=ROOT,
                          env={**ENV, "WANDB_DIR": str(tmp_path)}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "## zoo_vs_timm" in proc.stdout and "## prune_speedup" in proc.stdout
    rows = json.loads((tmp_path / "prune_speedup.json").read_text())["rows"]
    assert {r["search"] for r in rows} == {"dp", "greedy", "random"} and all(r["speedup"] > 0 for r in rows)
    parity = json.loads((tmp_path / "export_parity.json").read_text())
    assert {(r["model"], r["form"], r["format"]) for r in parity["rows"]} == {
        ("mobilenetv2_035", "forward", "onnx"), ("mobilenetv2_035", "forward", "torch_export"),
        *(("retnet_tiny", form, fmt) for form in ("parallel", "recurrent") for fmt in ("onnx", "torch_export"))}
    assert parity["passed"] == all(r["max_rel_diff"] <= 1e-4 for r in parity["rows"])
    listing = subprocess.run([sys.executable, "-m", "benchmarks", "run", "nope"], capture_output=True, text=True,
                             cwd=ROOT)
    assert listing.returncode == 2 and "unknown suite" in listing.stderr


def test_gpu_check_dry_run_on_cpu(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--device", "cpu", "--steps",
                           *DRY_STEPS], capture_output=True, text=True,
                          env={**ENV, "OUT": str(tmp_path), "TMPDIR": str(tmp_path)}, timeout=600)
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    steps = report["steps"]
    assert set(steps) == set(DRY_STEPS)
    assert not [name for name, step in steps.items() if step["status"] == "error"], proc.stderr[-3000:]
    assert report["environment"]["device"] == "cpu (dry run)" and report["environment"]["timm"]
    label = "mobilenetv2_035/float32/contiguous/b2/auto"
    lut = steps["lut"][label]
    assert lut["entries"] > 0 and lut["n_plans"] == 2
    # every verdict is the recorded number against its target, recomputed here independently
    assert steps["lut"]["verdicts"][f"{label} max error <= 5%"] == (lut["max_abs_error_raw"] <= 0.05)
    assert steps["lut"]["status"] == ("passed" if lut["max_abs_error_raw"] <= 0.05 else "failed")
    prune = steps["prune_search"][label]
    for target in (1.5, 2.0):
        ok = prune[f"target_{target}"]["measured_speedup"] >= 0.9 * target
        assert steps["prune_search"]["verdicts"][f"{label} target_{target} >= 0.9 x target"] == ok
    outputs = steps["measurement"]["outputs"]
    assert all(steps["measurement"]["verdicts"][f"output {m} within {o['tolerance']:g}"] == (
        o["max_rel_diff"] <= o["tolerance"]) for m, o in outputs.items())
    assert steps["fla"]["status"] == "skipped"  # skipped is never passed
    memory = steps["train_memory"]["tresnet_m"]
    check = next(k for k in steps["train_memory"]["verdicts"] if k.startswith("tresnet_m checkpointing"))
    assert steps["train_memory"]["verdicts"][check] == any(
        memory[f"{k}_reduction"] >= 0.40 and memory[f"{k}_cost"] <= 0.35 for k in ("ckpt", "ckpt_half"))
    failed = any(step["status"] == "failed" for step in steps.values())
    assert proc.returncode == (1 if failed else 3), proc.stdout[-2000:]
    assert steps["retnet_decode"]["batch_1"]["decode"]
    assert f"prune {label} target 1.5: measured" in proc.stdout


@pytest.mark.slow
def test_gpu_check_dry_run_of_the_runtimes_step(tmp_path):
    """The deploy-runtime table check, in onnxruntime's CPU EP: its verdict is its numbers against its limits."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--device", "cpu", "--steps",
                           "runtimes"], capture_output=True, text=True,
                          env={**ENV, "OUT": str(tmp_path), "TMPDIR": str(tmp_path)}, timeout=600)
    steps = json.loads((tmp_path / "gpu_check.json").read_text())["steps"]
    assert steps["runtimes"]["status"] != "error", proc.stderr[-3000:]
    ort = steps["runtimes"]["mobilenetv2_035/float32/contiguous/b2/auto/onnxruntime"]
    assert ort["condition"]["runtime"] == "onnxruntime" and ort["n_plans"] == 2
    limits = (max(0.05, 1.5 * ort["noise_floor"]), max(0.10, 1.5 * ort["noise_floor"]))
    assert list(steps["runtimes"]["verdicts"].values()) == [ort["mean_abs_error_raw"] <= limits[0]
                                                             and ort["max_abs_error_raw"] <= limits[1]]


def test_gpu_check_skips_work_past_its_time_budget(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--device", "cpu",
                           "--steps", "lut", "retnet_decode", "--budget-s", "-1"], capture_output=True, text=True,
                          env={**ENV, "OUT": str(tmp_path), "TMPDIR": str(tmp_path)}, timeout=300)
    assert proc.returncode == 3, proc.stderr[-3000:]  # nothing failed, but nothing passed either
    steps = json.loads((tmp_path / "gpu_check.json").read_text())["steps"]
    assert set(steps) == {"lut", "retnet_decode"} and all("time budget" in s["skipped"] for s in steps.values())
    assert {s["status"] for s in steps.values()} == {"skipped"}


def test_docs_sections_are_replaced_in_place(tmp_path):
    docs = tmp_path / "benchmarks.md"
    docs.write_text("# Benchmarks\n\nintro\n")
    update_docs("zoo_vs_timm", "| a |\n|---|\n| 1 |", "python -m benchmarks run zoo_vs_timm", docs)
    update_docs("zoo_vs_timm", "| a |\n|---|\n| 2 |", "python -m benchmarks run zoo_vs_timm", docs)
    text = docs.read_text()
    assert text.count("<!-- suite:zoo_vs_timm -->") == 1 and "| 2 |" in text and "| 1 |" not in text
    assert text.startswith("# Benchmarks\n\nintro")


def test_runtime_tables_verdicts_are_raw_and_anchored_errors_against_their_limits(tmp_path):
    from benchmarks.runtime_tables import summarise_again

    def table(mean, worst, mean_anchored, worst_anchored):
        return {"limits": [0.05, 0.10], "mean_error": mean, "max_error": worst, "mean_error_anchored": mean_anchored,
                "max_error_anchored": worst_anchored, "passed": None, "passed_anchored": None}

    drifted = table(0.06, 0.07, 0.01, 0.02)      # the machine's drift: raw fails, anchored passes
    bad = table(0.02, 0.12, 0.03, 0.11)          # one plan off: both fail on the max
    good = table(0.02, 0.04, 0.02, 0.04)
    result = {"models": [{"tables": {"compile": drifted, "eager": good}, "speedups": [{"passed": True}]}]}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(result))
    again = summarise_again(path)
    tables = again["models"][0]["tables"]
    assert (tables["compile"]["passed"], tables["compile"]["passed_anchored"]) == (False, True)
    assert (tables["eager"]["passed"], tables["eager"]["passed_anchored"]) == (True, True)
    assert (again["passed"], again["passed_anchored"]) == (False, True)
    result["models"][0]["tables"]["eager"] = bad
    path.write_text(json.dumps(result))
    again = summarise_again(path)
    assert (again["models"][0]["tables"]["eager"]["passed_anchored"], again["passed_anchored"]) == (False, False)
    result["models"][0]["tables"]["eager"] = good
    result["models"][0]["speedups"] = [{"passed": False}]
    path.write_text(json.dumps(result))
    assert summarise_again(path)["passed_anchored"] is False


@pytest.mark.slow
def test_runtime_tables_quick_computes_its_verdicts(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "benchmarks.runtime_tables", "--quick", "--runtimes",
                           "eager,onnxruntime", "--out", str(tmp_path)], capture_output=True, text=True, cwd=ROOT,
                          env=ENV, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "runtime_tables_quick.json").read_text())
    (model,) = result["models"]
    assert set(model["tables"]) == {"eager", "onnxruntime"} and result["complete"]
    for table in model["tables"].values():  # each verdict is its numbers against its limits
        mean_limit, max_limit = max(0.05, 1.5 * table["noise_floor"]), max(0.10, 1.5 * table["noise_floor"])
        assert table["passed"] == (table["mean_error"] <= mean_limit and table["max_error"] <= max_limit)
        assert table["passed_anchored"] == (table["mean_error_anchored"] <= mean_limit
                                            and table["max_error_anchored"] <= max_limit)
    for s in model["speedups"]:
        own = [c for c in model["cross"] if c["chosen_in"] == c["measured_in"] == s["runtime"]
               and c["target"] == s["target"]]
        assert s["passed"] == bool(own and own[0]["measured_speedup"] >= 0.9 * s["target"])
    assert result["passed"] == (all(t["passed"] for t in model["tables"].values())
                                and all(s["passed"] for s in model["speedups"]))
    assert result["passed_anchored"] == (all(t["passed_anchored"] for t in model["tables"].values())
                                         and all(s["passed"] for s in model["speedups"]))
    assert "| mobilenetv2_035 | onnxruntime |" in proc.stdout


def quality_family(task: str, values: dict[str, list[float]], baseline: float) -> dict:
    """A prune_quality family result whose cells hold `values[method]` (one per seed) at 2.0x in every stage."""
    metric = "acc1" if task == "classification" else "ppl"
    cells = [{"method": m, "target": 2.0, "seed": s, "plan": f"{m}{s}", "removed": 3, "speedup": 2.0,
              "latency_ms": 5.0, **{stage: {metric: v, "agreement": 90.0, "kl": 0.1}
                                    for stage in ("one_shot", "short", "full")}}
             for m, seeds in values.items() for s, v in enumerate(seeds)]
    base = {metric: baseline, **({"bpb": 2.0} if task == "lm" else {})}
    return {"family": "f", "task": task, "metric": metric, "baseline": base, "cells": cells}


def test_prune_quality_statistics_against_hand_computed_values():
    """Paired differences, their spread and seed-sd size, the win rule, the best DP and the task verdicts."""
    from benchmarks.prune_quality import paired, with_statistics

    family = with_statistics(quality_family("classification", {
        "dp_loss": [80.0, 82.0, 84.0], "dp_similarity": [70.0, 71.0, 72.0], "random": [70.0, 74.0, 72.0],
        "greedy": [79.0, 83.0, 82.0]}, baseline=90.0))
    pair = paired(family, "dp_loss", "random", 2.0, "short")
    # diffs 10, 8, 12: mean 10, sd 2, se 2/sqrt(3); pooled sd of (80,82,84) and (70,74,72) = 2
    assert pair["diff_mean"] == pytest.approx(10.0) and pair["diff_sd"] == pytest.approx(2.0)
    assert pair["diff_se"] == pytest.approx(2.0 / 3 ** 0.5) and pair["in_seed_sds"] == pytest.approx(5.0)
    assert pair["wins"] is True
    greedy = paired(family, "dp_loss", "greedy", 2.0, "short")  # diffs 1, -1, 2: mean 2/3, sd 1.528 -> no win
    assert greedy["diff_mean"] == pytest.approx(2 / 3) and greedy["wins"] is False
    row = next(r for r in family["rows"] if r["method"] == "random" and r["stage"] == "one_shot")
    assert (row["acc1_mean"], row["acc1_sd"], row["seeds"]) == (pytest.approx(72.0), pytest.approx(2.0), 3)
    v = family["verdicts"]
    assert v["best_dp"] == "dp_loss" and v["baseline_below_ceiling"] is True
    assert v["random_one_shot_cost"] == pytest.approx(18.0) and v["separates"] is True
    assert v["dp_wins_short"] == {"random": True, "greedy": False}
    assert {(p["method"], p["stage"]) for p in family["pairs"]} >= {("dp_similarity", "short"), ("greedy", "full")}
    saturated = with_statistics(quality_family("classification", {"dp_loss": [98.0, 98.5], "random": [97.0, 96.0]},
                                               baseline=98.5))
    assert saturated["verdicts"]["baseline_below_ceiling"] is False and saturated["verdicts"]["separates"] is False
    lm = with_statistics(quality_family("lm", {"dp_loss": [12.0, 13.0, 14.0], "random": [15.0, 18.0, 16.0]},
                                        baseline=10.0))
    lm_pair = paired(lm, "dp_loss", "random", 2.0, "one_shot")  # lower perplexity is better: diffs 3, 5, 2
    assert lm_pair["diff_mean"] == pytest.approx(10 / 3) and lm["verdicts"]["random_one_shot_cost"] == \
        pytest.approx((49 / 3) / 10.0 - 1.0) and lm["verdicts"]["separates"] is True


@pytest.mark.slow
def test_prune_quality_quick_computes_its_verdicts(tmp_path):
    """The suite end to end on the smallest task: every method and stage has its numbers, the verdicts follow them,
    and a second run takes its finished cells from the work directory (tied to their inputs)."""
    command = [sys.executable, "-m", "benchmarks.prune_quality", "--quick", "--seeds", "2", "--methods",
               "dp_loss,dp_block_influence,greedy,random,sleb", "--out", str(tmp_path / "out"), "--workdir",
               str(tmp_path / "work")]
    proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "out" / "prune_quality.json").read_text())
    (family,) = result["families"]
    done = [c for c in family["cells"] if "plan" in c]
    assert {c["method"] for c in done} == {"dp_loss", "dp_block_influence", "greedy", "random", "sleb"}
    for cell in done:
        assert {"one_shot", "short", "full"} <= set(cell) and 0 <= cell["short"]["agreement"] <= 100
        assert cell["speedup"] > 0 and cell["plan"] in family["plans"]
    v = family["verdicts"]
    random_one_shot = next(r for r in family["rows"] if r["method"] == "random" and r["stage"] == "one_shot")
    assert v["random_one_shot_cost"] == pytest.approx(family["baseline"]["acc1"] - random_one_shot["acc1_mean"])
    assert v["separates"] == (v["random_one_shot_cost"] >= 5.0)
    assert (tmp_path / "out" / "prune_quality.png").is_file()
    cells = sorted((tmp_path / "work" / "cells").glob("*.json"))
    assert len(cells) == len(done)
    stamps = [p.stat().st_mtime_ns for p in cells]
    again = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert [p.stat().st_mtime_ns for p in sorted((tmp_path / "work" / "cells").glob("*.json"))] == stamps


@pytest.mark.slow
def test_runtime_diagnosis_times_the_same_network_whole_and_segment_by_segment(tmp_path):
    """The diagnosis runs each plan's network as one onnxruntime program and as one program per segment (checked
    inside to compute the plan's output) and reports both beside the table's anchored prediction."""
    proc = subprocess.run([sys.executable, "-m", "benchmarks.runtime_diagnosis", "--model", "mobilenetv2_035",
                           "--runtime", "onnxruntime", "--input-size", "32", "--plans", "0,1", "--rounds", "3",
                           "--out", str(tmp_path)], capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "runtime_diagnosis_mobilenetv2_035_onnxruntime.json").read_text())
    assert [r["network"] for r in result["rows"]] == ["original", "plan 0", "plan 1"]
    for row in result["rows"]:
        assert row["whole_ms"] > 0 and row["segmented_ms"] > 0
        assert row["anchored_error"] == pytest.approx(row["predicted_anchored_ms"] / row["whole_ms"] - 1)
    assert result["rows"][0]["anchored_error"] == pytest.approx(0.0, abs=1e-9)
    assert "| plan 1 |" in proc.stdout
