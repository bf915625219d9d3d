"""The GPU check: the benchmark runner over the ``gpu_check`` set, its CPU dry run here, and its stored H200 reports
judged again from their numbers."""

from __future__ import annotations

import json

import zoo

from .test_runner import GPU_SET, run_benchmarks


def test_gpu_check_dry_run_on_cpu_and_its_report_judged_again(tmp_path):
    """The GPU check is ``python -m benchmarks run --set gpu_check``; its CPU dry run (tiny sizes) records every
    suite's status from its verdicts, and ``python -m benchmarks judge`` on the report it wrote gives the same."""
    from benchmarks.common import exit_code
    from benchmarks.report import judge_report

    proc = run_benchmarks(tmp_path, "run", "--set", "gpu_check", "--device", "cpu", "--quick", "--out", str(tmp_path))
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    suites = report["suites"]
    assert list(suites) == GPU_SET and report["set"] == "gpu_check" and report["environment"]["timm"]
    assert not [name for name, s in suites.items() if s["status"] == "error"], proc.stderr[-3000:]
    assert proc.returncode == exit_code(s["status"] for s in suites.values()), proc.stdout[-2000:]
    label = "mobilenetv2_035/float32/contiguous/b2/auto"
    lut = suites["latency_table"]["result"]
    table = lut["conditions"][label]
    assert table["entries"] > 0 and table["n_plans"] == 2
    # every verdict is the recorded number against its target, recomputed here independently
    assert lut["verdicts"] == {f"{label} max error <= 5%": table["max_abs_error_raw"] <= 0.05}
    assert suites["latency_table"]["status"] == ("passed" if table["max_abs_error_raw"] <= 0.05 else "failed")
    prune = suites["prune_search"]["result"]
    for target in (1.5, 2.0):
        measured = prune["conditions"][label][f"target_{target}"].get("measured_speedup")
        assert prune["verdicts"][f"{label} target_{target} >= 0.9 x target"] == (
            None if measured is None else measured >= 0.9 * target)
    outputs = suites["measurement"]["result"]["outputs"]
    assert suites["measurement"]["result"]["verdicts"] == {
        f"output {m} within {o['tolerance']:g}": o["max_rel_diff"] <= o["tolerance"] for m, o in outputs.items()}
    assert suites["fla"]["status"] == "skipped"  # no CUDA: skipped, never passed
    assert suites["fla"]["result"]["verdicts"] == {"fla: not run": None}
    memory = {r["model"]: r for r in suites["train_memory"]["result"]["rows"]}
    assert set(memory) == {f.reference for f in zoo.list_families("grad_checkpointing")}
    for model, row in memory.items():
        judged = {k: v for k, v in suites["train_memory"]["result"]["verdicts"].items() if k.startswith(model)}
        met = any(row[f"{k}_reduction"] >= 0.40 and row[f"{k}_cost"] <= 0.35 for k in ("ckpt", "ckpt_half"))
        assert all(judged.values()) == met and len(judged) == 2
    decode = suites["retnet_decode"]["result"]["batches"]["batch_1"]
    assert decode["decode"] and any(k.startswith("batch_1 decode step") for k in
                                    suites["retnet_decode"]["result"]["verdicts"])
    runtimes = suites["runtime_tables"]["result"]
    assert runtimes["runtimes"] == ["onnxruntime"] and runtimes["models"][0]["tables"]["onnxruntime"]["n_plans"] == 2
    assert "## prune_search" in proc.stdout and "latency_table: " in proc.stdout
    # re-judging the stored report gives the same statuses and verdicts, on the command line and in-process
    again = run_benchmarks(tmp_path, "judge", str(tmp_path / "gpu_check.json"), "--out", str(tmp_path / "again.json"))
    assert again.returncode == proc.returncode, again.stderr[-2000:]
    for judged in (json.loads((tmp_path / "again.json").read_text()), judge_report(json.loads(
            (tmp_path / "gpu_check.json").read_text()))):
        assert {n: s["status"] for n, s in judged["suites"].items()} == {n: s["status"] for n, s in suites.items()}
        assert {n: s.get("result", {}).get("verdicts") for n, s in judged["suites"].items()} == {
            n: s.get("result", {}).get("verdicts") for n, s in suites.items()}


def test_gpu_check_skips_work_past_its_time_budget(tmp_path):
    proc = run_benchmarks(tmp_path, "run", "--set", "gpu_check", "--device", "cpu", "--quick", "--budget-s", "1e-9",
                          "--out", str(tmp_path), timeout=300)
    assert proc.returncode == 3, proc.stderr[-3000:]  # nothing failed, but nothing passed either
    suites = json.loads((tmp_path / "gpu_check.json").read_text())["suites"]
    assert list(suites) == GPU_SET and all("time budget" in s["skipped"] for s in suites.values())
    assert {s["status"] for s in suites.values()} == {"skipped"}
