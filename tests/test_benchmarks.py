"""The benchmark entry point and the GPU check run their smallest configurations (smoke tests, no timing asserts)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.__main__ import update_docs

from .helpers import env_for

ROOT = Path(__file__).resolve().parents[1]
DRY_STEPS = ["measurement", "lut", "prune_search", "retnet_decode", "fla", "train_memory"]  # runtimes: a slow test


def test_entry_point_runs_quick_suites(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "run", "zoo_vs_timm", "prune_speedup", "export_parity",
                           "--quick",
                           "--out", str(tmp_path), "--device", "cpu"], capture_output=True, text=True, cwd=ROOT,
                          env=env_for(tmp_path), timeout=600)
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
                          env=env_for(tmp_path, OUT=str(tmp_path), TMPDIR=str(tmp_path)), timeout=600)
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
    # re-judging the stored report (what --verdicts does) gives the same verdicts as the run's own
    from benchmarks.gpu_check import judge

    again = judge(json.loads((tmp_path / "gpu_check.json").read_text()))["steps"]
    assert {n: (st["status"], st.get("verdicts")) for n, st in again.items()} == {
        n: (st["status"], st.get("verdicts")) for n, st in steps.items()}
    assert any(k.startswith("batch_1 decode step") or k.startswith("batch_1 parallel form")
               for k in again["retnet_decode"]["verdicts"])  # the batch-1 decode targets are judged, not left out


@pytest.mark.slow
def test_gpu_check_dry_run_of_the_runtimes_step(tmp_path):
    """The deploy-runtime table check, in onnxruntime's CPU EP: its verdict is its numbers against its limits."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--device", "cpu", "--steps",
                           "runtimes"], capture_output=True, text=True,
                          env=env_for(tmp_path, OUT=str(tmp_path), TMPDIR=str(tmp_path)), timeout=600)
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
                          env=env_for(tmp_path, OUT=str(tmp_path), TMPDIR=str(tmp_path)), timeout=300)
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
                          env=env_for(tmp_path), timeout=900)
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


def quality_family(task: str, values: dict[str, list[float]], baseline: float, samples: int = 4) -> dict:
    """A prune_quality family whose cells hold `values[rule]` (one per seed) at 2.0x in both stages, each seed's
    per-sample values all equal to it (so the per-sample mean is the metric)."""
    metric = "acc1" if task == "classification" else "loss"
    cells = [{"rule": r, "target": 2.0, "seed": s, "at_target": True, "interpolated": False, "speedup": 2.0,
              "session_speedup": 2.0,
              "removed": 3.0, "search_s": 0.1, "used": [{"name": f"{r}{s}", "weight": 1.0, "plan_score": v,
                                                       "surrogate": -v, "one_shot_loss": v}],
              **{stage: {metric: v, "loss": v, "ppl": 2.0, "acc1": v, "agreement": 90.0, "kl": 0.1,
                         "samples": [v] * samples} for stage in ("one_shot", "short")}}
             for r, seeds in values.items() for s, v in enumerate(seeds)]
    base = {"acc1": baseline} if task == "classification" else {"loss": baseline, "ppl": 2.0 ** baseline}
    return {"family": "f", "task": task, "metric": metric, "baseline": base, "cells": cells}


def test_paired_statistics_against_hand_computed_values():
    """The t test by hand (df 2: p = 1 - t / sqrt(2 + t^2)), Holm's adjusted p values, the bootstrap when the seeds do
    not vary, and the verdict words."""
    from benchmarks.stats import compare, holm, paired_t, verdicts

    t = paired_t([10.0, 8.0, 12.0])  # mean 10, sd 2, se 2/sqrt(3), t = 5 sqrt(3)
    assert (t["mean"], t["sd"], t["se"]) == (pytest.approx(10.0), pytest.approx(2.0), pytest.approx(2 / 3 ** 0.5))
    assert t["t"] == pytest.approx(5 * 3 ** 0.5) and t["df"] == 2
    assert t["p"] == pytest.approx(1 - 75 ** 0.5 / 77 ** 0.5, rel=1e-9)
    assert t["t_critical"] == pytest.approx(4.302653, rel=1e-6)  # t(0.975, 2)
    assert [h["p_holm"] for h in holm([0.01, 0.04, 0.03])] == pytest.approx([0.03, 0.06, 0.06])
    assert [h["rejected"] for h in holm([0.01, 0.04, 0.03])] == [True, False, False]
    constant = compare([2.0, 2.0, 2.0], [[1.0, 3.0, 2.0, 2.0] * 25] * 3)  # the seeds measured nothing
    assert constant["test"] == "paired_bootstrap" and constant["p"] < 0.01 and constant["mean"] == pytest.approx(2.0)
    noise = compare([0.5, 0.5], [[1.0, -1.0] * 20 + [1.0], [1.0, -1.0] * 20 + [1.0]])
    assert noise["test"] == "paired_bootstrap" and noise["p"] > 0.5
    assert compare([0.0, 0.0, 0.0], [[0.0] * 10] * 3)["p"] == 1.0  # the same plans: a tie, not a win
    judged = verdicts([{"p": 0.001, "mean": 1.0}, {"p": 0.001, "mean": -1.0}, {"p": 0.2, "mean": 3.0}])
    assert [j["verdict"] for j in judged] == ["better", "worse", "tie"] and judged[0]["family_size"] == 3


def test_prune_quality_at_target_and_interpolation_by_hand():
    """A plan within 2 % is used alone; else the closest plans below and above the target, weighted linearly in
    measured speed-up (1.44 and 1.54 around 1.5: 0.4 and 0.6), per sample too; else the closest, off target."""
    import numpy as np

    from benchmarks.prune_quality import at_target, combine

    tried = [{"measured_speedup": 1.44, "plan": "a"}, {"measured_speedup": 1.54, "plan": "b"},
             {"measured_speedup": 1.70, "plan": "c"}]
    chosen = at_target(tried, 1.5)
    assert chosen["at_target"] and chosen["interpolated"]
    assert [(u["plan"], u["weight"]) for u in chosen["used"]] == [("a", pytest.approx(0.4)), ("b", pytest.approx(0.6))]
    near = at_target([*tried, {"measured_speedup": 1.51, "plan": "d"}], 1.5)
    assert [u["plan"] for u in near["used"]] == ["d"] and not near["interpolated"]
    short = at_target([{"measured_speedup": 1.3, "plan": "a"}, {"measured_speedup": 1.4, "plan": "b"}], 1.5)
    assert not short["at_target"] and [u["plan"] for u in short["used"]] == ["b"]
    stage = {"a": {"short": {"acc1": 50.0, "loss": 1.0, "agreement": 60.0, "kl": 0.5, "correct": "0101"}},
             "b": {"short": {"acc1": 75.0, "loss": 0.5, "agreement": 80.0, "kl": 0.3, "correct": "1101"}}}
    used = [{"name": "a", "weight": 0.4}, {"name": "b", "weight": 0.6}]
    mixed = combine(used, stage, "short", "acc1")
    assert mixed["acc1"] == pytest.approx(65.0) and mixed["loss"] == pytest.approx(0.7)
    assert mixed["samples"] == pytest.approx([60.0, 100.0, 0.0, 100.0])
    assert np.mean(mixed["samples"]) == pytest.approx(mixed["acc1"])


def test_prune_quality_verdicts_against_hand_computed_values():
    """The default against every rule, Holm-corrected over the family: clear differences win, a plan that does not
    change with the seed is tested on the samples, a language model's lower loss is better; the overall targets."""
    from benchmarks.prune_quality import overall, with_statistics

    family = with_statistics(quality_family("classification", {
        "interaction": [90.0, 91.0, 92.0, 93.0, 94.0], "random": [40.0, 45.0, 38.0, 50.0, 41.0],
        "greedy": [90.5, 90.0, 92.5, 93.5, 93.0], "dp_loss": [80.0, 80.0, 80.0, 80.0, 80.0]}, baseline=95.0),
        "interaction")
    v = family["verdicts"]
    by = {(c["reference"], c["stage"]): c for c in v["comparisons"]}
    assert by["random", "short"]["verdict"] == "better" and by["random", "short"]["test"] == "paired_t"
    assert by["greedy", "short"]["verdict"] == "tie"  # diffs -0.5, 1, -0.5, -0.5, 1: nothing to claim
    assert by["dp_loss", "short"]["test"] == "paired_t"  # 10..14 points: spread over seeds, so a t test
    assert v["by_reference"]["random"]["summary"] == "better" and v["never_worse"]
    assert v["comparisons"][0]["family_size"] == 6 and v["random_one_shot_cost"] == pytest.approx(52.2)
    assert v["scorer"][0]["plans"] == 20 and v["scorer"][0]["plan_score_spearman"] == pytest.approx(1.0)
    lm = with_statistics(quality_family("lm", {"interaction": [1.0, 1.1, 1.2, 1.0], "random": [1.6, 1.8, 1.7, 1.5]},
                                        baseline=0.9), "interaction")
    diff = next(c for c in lm["verdicts"]["comparisons"] if c["stage"] == "one_shot")
    assert diff["mean"] == pytest.approx(0.575) and diff["verdict"] == "better"  # lower loss is better
    result = overall({"families": [family, lm]})
    assert result["never_worse"] and result["better_than_random"] == 2 and result["better_than_greedy"] == 0
    assert result["passed"] is False


@pytest.mark.slow
def test_prune_quality_quick_computes_its_verdicts(tmp_path):
    """The suite end to end on the smallest task: every rule and stage has its numbers, the plans were measured at
    the target (or marked off it), the verdicts follow them, and a second run takes its finished cells from the
    work directory (tied to their inputs)."""
    command = [sys.executable, "-m", "benchmarks.prune_quality", "--quick", "--seeds", "2", "--rules",
               "interaction_one_shot,dp_loss,random,sleb",
               "--out", str(tmp_path / "out"), "--workdir", str(tmp_path / "work")]
    proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env_for(tmp_path), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "out" / "prune_quality.json").read_text())
    (family,) = result["families"]
    done = [c for c in family["cells"] if "used" in c]
    assert {c["rule"] for c in done} == {"interaction_one_shot", "dp_loss", "random", "sleb"}
    assert result["default"] == "interaction_one_shot"  # conf/prune.yaml's search, recovery_steps=0
    for cell in done:
        assert {"one_shot", "short"} <= set(cell) and 0 <= cell["short"]["agreement"] <= 100
        assert cell["speedup"] > 0 and all(u["name"] in family["plans"] for u in cell["used"])
        assert sum(u["weight"] for u in cell["used"]) == pytest.approx(1.0) and cell["tried"]
        closest = min(abs(t["measured_speedup"] / cell["target"] - 1) for t in cell["tried"])
        assert cell["at_target"] == (closest <= 0.02 or cell["interpolated"])
    v = family["verdicts"]
    assert len(v["comparisons"]) == v["comparisons"][0]["family_size"] and v["scorer"][0]["plans"] >= 2
    assert (tmp_path / "out" / "prune_quality.png").is_file()
    cells = sorted((tmp_path / "work" / "cells").glob("*.json"))
    stamps = [p.stat().st_mtime_ns for p in cells]
    again = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env_for(tmp_path), timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert [p.stat().st_mtime_ns for p in sorted((tmp_path / "work" / "cells").glob("*.json"))] == stamps


@pytest.mark.slow
def test_runtime_diagnosis_times_the_same_network_whole_and_segment_by_segment(tmp_path):
    """The diagnosis runs each plan's network as one onnxruntime program and as one program per segment (checked
    inside to compute the plan's output) and reports both beside the table's anchored prediction."""
    proc = subprocess.run([sys.executable, "-m", "benchmarks.runtime_diagnosis", "--model", "mobilenetv2_035",
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
