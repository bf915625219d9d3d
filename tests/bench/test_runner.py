"""The benchmark runner runs its smallest configurations (smoke tests, no timing asserts); the GPU check is the same
runner over a named set (its CPU dry run here), and every status is its suites' targets against stored numbers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import zoo

from ..helpers import env_for

ROOT = Path(__file__).resolve().parents[2]
GPU_SET = ["measurement", "latency_table", "prune_search", "retnet_decode", "fla", "train_memory", "runtime_tables"]


def run_benchmarks(tmp_path: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env_for(tmp_path, TMPDIR=str(tmp_path)), timeout=timeout)


def recurrent(name: str) -> bool:
    return bool(getattr(zoo.models.registry.model_class(name), "recurrent", False))


def test_entry_point_runs_quick_suites(tmp_path):
    from benchmarks.common import exit_code

    proc = run_benchmarks(tmp_path, "run", "zoo_vs_timm", "prune_speedup", "export_parity", "--quick", "--out",
                          str(tmp_path), "--device", "cpu", timeout=900)
    report = json.loads((tmp_path / "run.json").read_text())
    assert {n: s["status"] for n, s in report["suites"].items() if s["status"] == "error"} == {}, proc.stderr[-3000:]
    assert proc.returncode == exit_code(s["status"] for s in report["suites"].values())
    assert "## zoo_vs_timm" in proc.stdout and "## prune_speedup" in proc.stdout
    rows = json.loads((tmp_path / "prune_speedup.json").read_text())["rows"]
    assert {r["search"] for r in rows} == {"dp", "greedy", "random"} and all(r["speedup"] > 0 for r in rows)
    parity = report["suites"]["export_parity"]["result"]
    families = zoo.list_families()  # every declared family, its small member (a new family needs no list edited)
    assert {(r["model"], r["form"], r["format"]) for r in parity["rows"]} == {
        (f.small, form, fmt) for f in families for fmt in ("onnx", "torch_export")
        for form in (("parallel", "recurrent") if recurrent(f.small) else ("forward",))}
    assert list(parity["verdicts"].values()) == [r["max_rel_diff"] <= 1e-4 for r in parity["rows"]]
    listing = subprocess.run([sys.executable, "-m", "benchmarks", "run", "nope"], capture_output=True, text=True,
                             cwd=ROOT)
    assert listing.returncode == 2 and "unknown suite" in listing.stderr
    listed = subprocess.run([sys.executable, "-m", "benchmarks", "list"], capture_output=True, text=True, cwd=ROOT)
    assert all(f"{name} " in listed.stdout for name in GPU_SET) and "[gpu_check]" in listed.stdout


def test_the_stored_h200_report_is_judged_again_with_todays_targets(tmp_path):
    """results/gpu_check_h200.json (converted from the former benchmarks/gpu_check.py's report) judged by today's
    suites."""
    from benchmarks.report import judge_file

    report, code = judge_file(ROOT / "results" / "gpu_check_h200.json")
    assert {n: s["status"] for n, s in report["suites"].items()} == {
        "measurement": "passed", "latency_table": "failed", "prune_search": "passed",
        "retnet_decode": "incomplete",  # its batch-1 decode targets came later: not measured, listed
        "fla": "passed", "train_memory": "skipped", "runtime_tables": "skipped"}  # not in that run
    decode = report["suites"]["retnet_decode"]["result"]["verdicts"]
    assert decode["batch_1 RetNet latency ratio <= 1.2"] is True and decode["batch_16 RetNet latency ratio <= 1.2"]
    assert decode["batch_1 graph step >= 3.0x faster than the Transformer's at context 8192"] is None
    failing = [c for c, ok in report["suites"]["latency_table"]["result"]["verdicts"].items() if ok is False]
    assert len(failing) == 3 and all("b1" in c or "isolated" in c for c in failing)
    assert code == 1
    proc = run_benchmarks(tmp_path, "judge", str(ROOT / "results" / "gpu_check_h200.json"), timeout=300)
    assert proc.returncode == 1 and "latency_table: failed" in proc.stdout, proc.stderr[-2000:]
    docs = (ROOT / "docs" / "benchmarks.md").read_text()
    assert "`gpu_check_h200.json`: the first GPU check" in docs  # cited as what it is


def split_merged(report: dict) -> list[tuple[str, dict]]:
    """The calls a merged report was made of, each with the suites it ran (and a skip for the others)."""
    calls = []
    for call in report["merged_from"]:
        suites = {n: ({k: v for k, v in s.items() if k != "from"} if s.get("from") == call["report"] and
                      n in call["ran"] else {"skipped": "time budget", "seconds": 0.0})
                  for n, s in report["suites"].items()}
        calls.append((call["report"], {"set": call["set"], "requested": list(suites), "device": report["device"],
                                       "environment": dict(report["environment"]), "suites": suites}))
    return calls


def test_a_set_run_over_several_calls_merges_into_one_judged_report(tmp_path):
    """results/h200_suites_2026-12-04.json was merged from three short device calls (the first as the set gpu_check,
    the others by name): split into its calls again, it merges back to the same suites and statuses, labelled with no
    set because not every call ran as one; --set where a call did not, calls of another version, quick beside full
    runs, a suite run twice and a report that is not one are refused (exit 2, nothing written)."""
    from benchmarks.report import merge_reports, ran, statuses

    stored = json.loads((ROOT / "results" / "h200_suites_2026-12-04.json").read_text())
    assert [c["ran"] for c in stored["merged_from"]] == [["measurement", "latency_table"],
                                                         ["prune_search", "retnet_decode"], ["fla", "train_memory"]]
    calls = split_merged(stored)
    merged = merge_reports(calls)
    assert statuses(merged) == statuses(stored) == {
        "measurement": "passed", "latency_table": "failed", "prune_search": "passed", "retnet_decode": "passed",
        "fla": "passed", "train_memory": "failed", "runtime_tables": "skipped"}
    assert merged["set"] is None and stored["set"] is None  # calls 2 and 3 ran their suites outside the set
    assert (merged["suites"]["measurement"]["as"], merged["suites"]["prune_search"]["as"]) == ("gpu_check", None)
    assert merged["suites"]["prune_search"]["from"] == "call2.json"
    assert merged["suites"]["prune_search"]["result"] == stored["suites"]["prune_search"]["result"]
    with pytest.raises(ValueError, match="call2.json, call3.json did not run as the set gpu_check"):
        merge_reports(calls, "gpu_check")
    twice = [calls[0], (calls[1][0], {**calls[1][1], "suites": {**calls[1][1]["suites"],
                                                                "measurement": calls[0][1]["suites"]["measurement"]}})]
    with pytest.raises(ValueError, match="measurement ran in more than one report"):
        merge_reports(twice)
    itself = {"result": {"skipped": "flash-linear-attention is not installed"}, "seconds": 0.1}
    assert not ran(itself) and ran({"error": "boom"})  # a suite that skipped itself did not run
    quick = (calls[2][0], {**calls[2][1], "quick": True})
    with pytest.raises(ValueError, match="quick and full runs are not merged"):
        merge_reports([calls[0], quick])
    other = (calls[2][0], {**calls[2][1], "environment": {**calls[2][1]["environment"], "torch": "2.14.1"}})
    with pytest.raises(ValueError, match="torch='2.14.1'"):
        merge_reports([calls[0], other])
    for name, bad in {"other": [calls[0][1], other[1]], "not_a_report": [{"set": None}]}.items():
        paths = []
        for i, report in enumerate(bad):
            paths.append(str(tmp_path / f"{name}{i}.json"))
            Path(paths[-1]).write_text(json.dumps(report))
        proc = run_benchmarks(tmp_path, "merge", *paths, "--out", str(tmp_path / "merged.json"), timeout=300)
        assert proc.returncode == 2 and proc.stderr.startswith("error: "), proc.stderr[-2000:]
        assert not (tmp_path / "merged.json").exists()
    assert "one version of its libraries" in proc.stderr or "not a run report" in proc.stderr
