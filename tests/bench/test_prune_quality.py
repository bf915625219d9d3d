"""The benchmark runner runs its smallest configurations (smoke tests, no timing asserts); the GPU check is the same
runner over a named set (its CPU dry run here), and every status is its suites' targets against stored numbers."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.common import read_json

from ..helpers import env_for

ROOT = Path(__file__).resolve().parents[2]


def test_confirmatory_result_is_the_declared_run():
    """The committed confirmatory result (complete or in part) is the run declared in ``CONFIRMATORY`` before it
    ran: its families in the declared order, its seeds, device, default and the suite's rules, targets and protocol;
    a part is judged incomplete, never passed; the whole run's verdicts are the ones its targets compute today."""
    from studies.prune_quality import CONFIRMATORY, PROTOCOL, TARGETS, TEST_RULES, overrides_of
    from studies.prune_quality_report import overall

    path = ROOT / "results" / f"{CONFIRMATORY['name']}.json.gz"
    if not path.is_file():
        pytest.skip("the confirmatory run has not committed a family yet")
    stored = read_json(path)
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


def test_prune_quality_refuses_development_seeds(tmp_path):
    """--first-seed gives fresh seeds for a confirmatory run; seeds the selection used are refused (exit 2, the
    reason and what is allowed), before anything runs."""
    from studies.prune_quality import DEV_SEEDS, seed_problem

    assert seed_problem(6, 6) is None and seed_problem(0, 5) is None and "count" in seed_problem(0, -3)
    assert "development seeds" in seed_problem(DEV_SEEDS[0] - 2, 5)
    proc = subprocess.run([sys.executable, "-m", "studies.prune_quality", "--first-seed", str(DEV_SEEDS[1]),
                           "--seeds", "2", "--workdir", str(tmp_path / "w")], capture_output=True, text=True,
                          cwd=ROOT, env=env_for(tmp_path), timeout=300)
    assert proc.returncode == 2 and f"seeds [{DEV_SEEDS[1]}, {DEV_SEEDS[2]}]" in proc.stderr, proc.stderr[-2000:]
    assert "allowed: a first seed of 0 or more" in proc.stderr and not (tmp_path / "w").exists()


def test_prune_quality_resume_refuses_what_is_not_its_result(tmp_path):
    """--resume takes only a prune_quality result: anything else is refused before any work, with exit 2 and what is
    allowed; a stored family is kept only when every input matches (:func:`differing` names those that do not)."""
    from studies.prune_quality import differing

    other = tmp_path / "other.json"
    other.write_text(json.dumps({"suite": "latency_table", "families": []}))
    for path in (other, tmp_path / "missing.json"):
        proc = subprocess.run([sys.executable, "-m", "studies.prune_quality", "--resume", str(path), "--workdir",
                               str(tmp_path / "w")], capture_output=True, text=True, cwd=ROOT, env=env_for(tmp_path),
                              timeout=300)
        assert proc.returncode == 2 and f"argument --resume: {path}" in proc.stderr, proc.stderr[-2000:]
        assert "python -m studies.prune_quality wrote" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "w").exists()
    for declared in ("--confirmatory", "--healing", "--hf-lm"):
        for extra in (["--seeds", "3"], ["--select"], ["--device", "cuda"], ["--first-seed", "0"], ["--rules", "sleb"]):
            proc = subprocess.run([sys.executable, "-m", "studies.prune_quality", declared, *extra,
                                   "--workdir", str(tmp_path / "w")], capture_output=True, text=True, cwd=ROOT,
                                  env=env_for(tmp_path), timeout=300)
            assert proc.returncode == 2, proc.stderr[-2000:]
            assert f"{declared} runs the declared" in proc.stderr
            assert f"not with {' '.join(extra[:1 + (extra[0] == '--device')])};" in proc.stderr
            assert not (tmp_path / "w").exists()
    wanted = {"seeds": [6, 7], "code": "a", "rules": ["x"]}
    assert differing(dict(wanted), wanted) == [] and differing(None, wanted) == ["code", "rules", "seeds"]
    assert differing({**wanted, "seeds": [6], "extra": 1}, wanted) == ["extra", "seeds"]


def test_prune_quality_quick_computes_its_verdicts(tmp_path):
    """The suite end to end on the smallest task: every rule and stage has its numbers, the plans were measured at
    the target (or marked off it), the verdicts follow them, a second run takes its finished cells from the work
    directory (tied to their inputs), and a run resumed from the stored result keeps its family only while the
    family's inputs match."""
    from studies.prune_quality import RULES, default_rule

    default = default_rule()  # the rule whose settings conf/prune.yaml has
    assert RULES[default]["search"] == "interaction" and RULES[default]["recovery_steps"] == "0"
    rules = [default, "dp_loss", "random", "sleb", "interaction_healed"]
    command = [sys.executable, "-m", "studies.prune_quality", "--quick", "--seeds", "2", "--rules",
               ",".join(rules), "--out", str(tmp_path / "out"), "--workdir", str(tmp_path / "work")]
    proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env_for(tmp_path), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = read_json(tmp_path / "out" / "prune_quality.json.gz")
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
    stored = tmp_path / "out" / "prune_quality.json.gz"
    fresh = [*command[:command.index("--out")], "--out", str(tmp_path / "kept"), "--workdir", str(tmp_path / "fresh"),
             "--resume", str(stored)]
    kept = subprocess.run(fresh, capture_output=True, text=True, cwd=ROOT, env=env_for(tmp_path), timeout=900)
    assert kept.returncode == 0, kept.stderr[-3000:]
    resumed = read_json(tmp_path / "kept" / "prune_quality.json.gz")
    assert resumed["resumed"] == [family["family"]] and not (tmp_path / "fresh" / "cells").exists()
    assert resumed["families"][0]["cells"] == read_json(stored)["families"][0]["cells"]
    # a stored family computed by other code is recomputed, and the result says in what it differed
    changed = read_json(stored)
    changed["families"][0]["inputs"]["code"] = "other"
    stored = stored.with_name("changed.json")  # --resume takes a plain JSON file too
    stored.write_text(json.dumps(changed))
    redone = subprocess.run([*fresh[:fresh.index("--workdir")], "--workdir", str(tmp_path / "work"), "--resume",
                             str(stored)], capture_output=True, text=True, cwd=ROOT, env=env_for(tmp_path),
                            timeout=900)
    assert redone.returncode == 0, redone.stderr[-3000:]
    again_result = read_json(tmp_path / "kept" / "prune_quality.json.gz")
    assert again_result["recomputed"] == {family["family"]: ["code"]} and again_result["resumed"] == []
    assert again_result["families"][0]["inputs"]["code"] != "other"


def test_the_committed_results_keep_the_tasks_cell_keys():
    """The committed prune_quality results were made with today's task overrides, in the same order (the keys of
    their cells): a change to a task shows here, not as a silent recompute."""
    from studies import prune_quality

    tasks = prune_quality.tasks()
    for family in read_json(ROOT / "results" / "prune_quality_cpu.json.gz")["families"]:
        assert family["overrides"][:-1] == tasks[family["family"]]
    (retnet8,) = read_json(ROOT / "results" / "prune_quality_retnet8_cpu.json.gz")["families"]
    assert retnet8["family"] == "retnet_tiny8"
    assert retnet8["overrides"][:-1] == prune_quality.overrides_of("retnet_tiny8")

