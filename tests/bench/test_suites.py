"""The benchmark runner runs its smallest configurations (smoke tests, no timing asserts); the GPU check is the same
runner over a named set (its CPU dry run here), and every status is its suites' targets against stored numbers."""

from __future__ import annotations

import copy
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
    return bool(getattr(zoo.registry.model_class(name), "recurrent", False))


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


def test_confirmatory_result_is_the_declared_run():
    """The committed confirmatory result (complete or in part) is the run declared in ``CONFIRMATORY`` before it
    ran: its families in the declared order, its seeds, device, default and the suite's rules, targets and protocol;
    a part is judged incomplete, never passed; the whole run's verdicts are the ones its targets compute today."""
    from benchmarks.prune_quality import CONFIRMATORY, PROTOCOL, TARGETS, TEST_RULES, overrides_of
    from benchmarks.prune_quality_report import overall

    path = ROOT / "results" / f"{CONFIRMATORY['name']}.json"
    if not path.is_file():
        pytest.skip("the confirmatory run has not committed a family yet")
    stored = json.loads(path.read_text())
    names = [f["family"] for f in stored["families"]]
    assert names == CONFIRMATORY["families"][:len(names)] and names
    assert stored["requested"] == CONFIRMATORY["families"]
    assert (stored["first_seed"], stored["seeds"]) == (CONFIRMATORY["first_seed"], CONFIRMATORY["seeds"])
    assert stored["default"] == CONFIRMATORY["default"] and not stored["quick"]
    seeds = list(range(CONFIRMATORY["first_seed"], CONFIRMATORY["first_seed"] + CONFIRMATORY["seeds"]))
    for family in stored["families"]:
        inputs = family["inputs"]
        assert (inputs["seeds"], inputs["rules"], inputs["targets"]) == (seeds, list(TEST_RULES), list(TARGETS))
        assert (inputs["device"], inputs["default"], inputs["protocol"]) == ("cpu", CONFIRMATORY["default"], PROTOCOL)
        assert family["overrides"] == [*overrides_of(family["family"]), f"prune.device={CONFIRMATORY['device']}"]
        assert sorted({c["seed"] for c in family["cells"]}) == seeds
    if len(names) < len(CONFIRMATORY["families"]):
        assert stored.get("status") != "passed" and overall(stored)["requested"] == len(CONFIRMATORY["families"])
    else:  # complete: its stored verdicts and status are what the suite's targets compute from its data today
        from benchmarks.common import judge

        judged = judge("prune_quality", copy.deepcopy(stored))  # judge writes its verdicts into what it is given
        assert (judged["status"], judged["verdicts"]) == (stored["status"], stored["verdicts"])


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


def test_the_stored_h200_report_is_judged_again_with_todays_targets(tmp_path):
    """results/gpu_check_h200.json (written by the former benchmarks/gpu_check.py) judged by today's suites."""
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
    assert "python -m benchmarks judge results/gpu_check_h200.json" in docs and "latency_table: failed" in docs


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


def test_gpu_check_skips_work_past_its_time_budget(tmp_path):
    proc = run_benchmarks(tmp_path, "run", "--set", "gpu_check", "--device", "cpu", "--quick", "--budget-s", "-1",
                          "--out", str(tmp_path), timeout=300)
    assert proc.returncode == 3, proc.stderr[-3000:]  # nothing failed, but nothing passed either
    suites = json.loads((tmp_path / "gpu_check.json").read_text())["suites"]
    assert list(suites) == GPU_SET and all("time budget" in s["skipped"] for s in suites.values())
    assert {s["status"] for s in suites.values()} == {"skipped"}


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


def test_prune_quality_refuses_development_seeds(tmp_path):
    """--first-seed gives fresh seeds for a confirmatory run; seeds the selection used are refused (exit 2, the
    reason and what is allowed), before anything runs."""
    from benchmarks.prune_quality import DEV_SEEDS, seed_problem

    assert seed_problem(6, 6) is None and seed_problem(0, 5) is None and "count" in seed_problem(0, -3)
    assert "development seeds" in seed_problem(DEV_SEEDS[0] - 2, 5)
    proc = subprocess.run([sys.executable, "-m", "benchmarks.prune_quality", "--first-seed", str(DEV_SEEDS[1]),
                           "--seeds", "2", "--workdir", str(tmp_path / "w")], capture_output=True, text=True,
                          cwd=ROOT, env=env_for(tmp_path), timeout=300)
    assert proc.returncode == 2 and f"seeds [{DEV_SEEDS[1]}, {DEV_SEEDS[2]}]" in proc.stderr, proc.stderr[-2000:]
    assert "allowed: a first seed of 0 or more" in proc.stderr and not (tmp_path / "w").exists()


def test_prune_quality_resume_refuses_what_is_not_its_result(tmp_path):
    """--resume takes only a prune_quality result: anything else is refused before any work, with exit 2 and what is
    allowed; a stored family is kept only when every input matches (:func:`differing` names those that do not)."""
    from benchmarks.prune_quality import differing

    other = tmp_path / "other.json"
    other.write_text(json.dumps({"suite": "latency_table", "families": []}))
    for path in (other, tmp_path / "missing.json"):
        proc = subprocess.run([sys.executable, "-m", "benchmarks.prune_quality", "--resume", str(path), "--workdir",
                               str(tmp_path / "w")], capture_output=True, text=True, cwd=ROOT, env=env_for(tmp_path),
                              timeout=300)
        assert proc.returncode == 2 and f"--resume {path}" in proc.stderr, proc.stderr[-2000:]
        assert "allowed: a prune_quality.json" in proc.stderr and not (tmp_path / "w").exists()
    for extra in (["--seeds", "3"], ["--select"], ["--device", "cuda"], ["--first-seed", "0"]):
        proc = subprocess.run([sys.executable, "-m", "benchmarks.prune_quality", "--confirmatory", *extra,
                               "--workdir", str(tmp_path / "w")], capture_output=True, text=True, cwd=ROOT,
                              env=env_for(tmp_path), timeout=300)
        assert proc.returncode == 2 and f"not with {' '.join(extra[:1 + (extra[0] == '--device')])};" in proc.stderr
        assert not (tmp_path / "w").exists()
    wanted = {"seeds": [6, 7], "code": "a", "rules": ["x"]}
    assert differing(dict(wanted), wanted) == [] and differing(None, wanted) == ["code", "rules", "seeds"]
    assert differing({**wanted, "seeds": [6], "extra": 1}, wanted) == ["extra", "seeds"]


def test_prune_quality_quick_computes_its_verdicts(tmp_path):
    """The suite end to end on the smallest task: every rule and stage has its numbers, the plans were measured at
    the target (or marked off it), the verdicts follow them, a second run takes its finished cells from the work
    directory (tied to their inputs), and a run resumed from the stored result keeps its family only while the
    family's inputs match."""
    from benchmarks.prune_quality import RULES, default_rule

    default = default_rule()  # the rule whose settings conf/prune.yaml has
    assert RULES[default]["search"] == "interaction" and RULES[default]["recovery_steps"] == "0"
    rules = [default, "dp_loss", "random", "sleb"]
    command = [sys.executable, "-m", "benchmarks.prune_quality", "--quick", "--seeds", "2", "--rules",
               ",".join(rules), "--out", str(tmp_path / "out"), "--workdir", str(tmp_path / "work")]
    proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env_for(tmp_path), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "out" / "prune_quality.json").read_text())
    (family,) = result["families"]
    done = [c for c in family["cells"] if "used" in c]
    assert {c["rule"] for c in done} == set(rules) and result["default"] == default
    for cell in done:
        assert {"one_shot", "short"} <= set(cell) and 0 <= cell["short"]["agreement"] <= 100
        assert cell["speedup"] > 0 and all(u["name"] in family["plans"] for u in cell["used"])
        assert sum(u["weight"] for u in cell["used"]) == pytest.approx(1.0) and cell["tried"]
        closest = min(abs(t["measured_speedup"] / cell["target"] - 1) for t in cell["tried"])
        faster = cell["rule"] == result["default"] and all(t["measured_speedup"] > cell["target"]
                                                           for t in cell["tried"])
        assert cell["at_target"] == (closest <= 0.02 or cell["interpolated"] or faster)
        assert cell.get("faster", False) == (faster and closest > 0.02)
    v = family["verdicts"]
    assert len(v["comparisons"]) == v["comparisons"][0]["family_size"] and v["scorer"][0]["plans"] >= 2
    assert (tmp_path / "out" / "prune_quality.png").is_file()
    cells = sorted((tmp_path / "work" / "cells").glob("*.json"))
    stamps = [p.stat().st_mtime_ns for p in cells]
    again = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env_for(tmp_path), timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert [p.stat().st_mtime_ns for p in sorted((tmp_path / "work" / "cells").glob("*.json"))] == stamps
    # resumed from the stored result in a fresh work directory: the family is kept, nothing is computed
    stored = tmp_path / "out" / "prune_quality.json"
    fresh = [*command[:command.index("--out")], "--out", str(tmp_path / "kept"), "--workdir", str(tmp_path / "fresh"),
             "--resume", str(stored)]
    kept = subprocess.run(fresh, capture_output=True, text=True, cwd=ROOT, env=env_for(tmp_path), timeout=900)
    assert kept.returncode == 0, kept.stderr[-3000:]
    resumed = json.loads((tmp_path / "kept" / "prune_quality.json").read_text())
    assert resumed["resumed"] == [family["family"]] and not (tmp_path / "fresh" / "cells").exists()
    assert resumed["families"][0]["cells"] == json.loads(stored.read_text())["families"][0]["cells"]
    # a stored family computed by other code is recomputed, and the result says in what it differed
    changed = json.loads(stored.read_text())
    changed["families"][0]["inputs"]["code"] = "other"
    stored.write_text(json.dumps(changed))
    redone = subprocess.run([*fresh[:fresh.index("--workdir")], "--workdir", str(tmp_path / "work"), "--resume",
                             str(stored)], capture_output=True, text=True, cwd=ROOT, env=env_for(tmp_path),
                            timeout=900)
    assert redone.returncode == 0, redone.stderr[-3000:]
    again_result = json.loads((tmp_path / "kept" / "prune_quality.json").read_text())
    assert again_result["recomputed"] == {family["family"]: ["code"]} and again_result["resumed"] == []
    assert again_result["families"][0]["inputs"]["code"] != "other"


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


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_int8_depth_quick_times_five_forms_side_by_side_and_resumes(tmp_path, device):
    """The INT8 + depth suite on the smallest task: five forms timed in one session (speed-ups against the float32
    baseline), the INT8-table and float32-table plans really planned in those runtimes (onnxruntime's on the CPU,
    TensorRT's on a GPU), verdicts recomputed from the numbers, and a second run keeps what the first measured."""
    from benchmarks.int8_depth import FORMS, NOISE_FACTOR, platform_of, result_path, runtimes_on

    kind, why_not = platform_of(device)
    if kind is None:
        pytest.skip(why_not)
    command = [sys.executable, "-m", "benchmarks.int8_depth", "--quick", "--out", str(tmp_path / "out"),
               "--workdir", str(tmp_path / "work"), "--device", device]
    proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env_for(tmp_path), timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    path = result_path(True, tmp_path / "out", kind)
    result = json.loads(path.read_text())
    ((model, row),) = result["models"].items()
    (seed,) = row["quality"]["seeds"]
    for session in (row["speed"]["session"], seed["session"]):
        assert set(session["ms"]) == set(FORMS) and all(ms > 0 for ms in session["ms"].values())
        for form, ms in session["ms"].items():
            assert session["speedup"][form] == pytest.approx(session["ms"]["fp32_baseline"] / ms)
    runtimes = runtimes_on(kind)
    for planner, runtime in runtimes.items():
        run = json.loads((Path(seed["runs"][planner]["dir"]) / "results.json").read_text())
        assert run["condition"]["runtime"] == runtime and set(run["runtimes"]) == set(runtimes.values())
        assert run["runtimes"][runtime]["chosen_here"] and 0 <= run["int8"]["pruned"]["metrics"]["val/acc1"] <= 100
    errors = row["speed"]["table_errors"]
    label = f"{model}: INT8 table's anchored mean error within the float32 table's"
    limit = max(errors["fp32"]["mean_error_anchored"],
                NOISE_FACTOR * max(errors["fp32"]["noise_floor"], errors["int8"]["noise_floor"]))
    assert result["verdicts"][label] == (errors["int8"]["mean_error_anchored"] <= limit)
    assert result["status"] in ("passed", "failed", "incomplete")
    again = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env_for(tmp_path), timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"{model} speed: kept (same inputs)" in again.stdout
    assert json.loads(path.read_text())["models"][model]["quality"]["seeds"] \
        == row["quality"]["seeds"]  # the seed's runs were not repeated


def test_int8_decode_quick_measures_both_decoders_and_keeps_what_it_measured(tmp_path):
    """The INT8 decode suite on retnet_tiny: both decoders timed, each seed's perplexities recomputed here from its
    trained model, the statistics from the seeds, and a rerun keeps the finished parts (same inputs)."""
    import math

    import torch

    from benchmarks.int8_decode import decode_perplexity

    command = [sys.executable, "-m", "benchmarks.int8_decode", "--quick", "--out", str(tmp_path / "out"),
               "--workdir", str(tmp_path / "work")]
    proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env_for(tmp_path), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "out" / "int8_decode_quick.json").read_text())
    speed = result["speed"]["retnet_tiny"]
    assert speed["weight_mb"]["int8"] < speed["weight_mb"]["fp32"] / 3  # 8-bit weights: a quarter, and scales
    assert speed["speedup"] == pytest.approx(speed["ms_per_token"]["fp32"] / speed["ms_per_token"]["int8"], rel=0.5)
    seeds = result["quality"]["seeds"]
    assert [s["seed"] for s in seeds] == [0, 1]
    for s in seeds:
        assert s["relative_increase"] == pytest.approx(s["ppl_int8"] / s["ppl_fp32"] - 1)
        assert s["ppl_int8"] != s["ppl_fp32"]  # the INT8 decoder is another computation
    mean = sum(s["relative_increase"] for s in seeds) / 2
    assert result["quality"]["statistics"]["mean_increase"] == pytest.approx(mean)
    model = zoo.load(json.loads((tmp_path / "work" / "retnet_tiny-seed0" / "results.json").read_text())[
        "checkpoint"]).eval()
    windows = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(0))
    logits = model(windows, mode="parallel")  # teacher forcing through the decoder = the parallel form's loss
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), windows[:, 1:].flatten())
    assert decode_perplexity(model, windows, None) == pytest.approx(math.exp(loss.item()), rel=1e-4)
    label = "decode perplexity: relative increase with INT8 weights (upper 95 % bound over seeds)"
    assert result["verdicts"][label] == (result["quality"]["statistics"]["upper_95"] <= 0.02)
    again = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env_for(tmp_path), timeout=600)
    assert again.returncode == 0 and "speed retnet_tiny: kept (same inputs)" in again.stdout, again.stderr[-2000:]
    assert json.loads((tmp_path / "out" / "int8_decode_quick.json").read_text())["quality"]["seeds"] == seeds
