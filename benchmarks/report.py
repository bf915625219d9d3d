"""A run of several suites as one report: each suite run in turn within a time budget, its status recorded whatever
the others do, and the report judged again later from its stored numbers (``python -m benchmarks judge``).

Report (``<out>/<set>.json``, ``run.json`` for suites named one by one)::

    {"set": "gpu_check" | null, "requested": [NAME, ...], "device": ..., "quick": ..., "budget_s": ...,
     "environment": {...},
     "suites": {NAME: {"status": ..., "seconds": ..., "result": {... "verdicts": {...}, "status": ...}}
                       | {"status": "error", "error": ..., "traceback": ...}
                       | {"status": "skipped", "skipped": REASON}}}

A suite's verdicts and status come from :func:`benchmarks.common.judge` (its ``checks``: stated targets against
measured numbers); judging a stored report runs the same function on the stored results with today's targets.
"""

from __future__ import annotations

import copy
import inspect
import logging
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from benchmarks.common import (
    BenchmarkInputError,
    Budget,
    exit_code,
    judge,
    machine,
    read_json,
    results_dir,
    suite_module,
)
from zoo.files import write_json

SETS = {  # named sets of suites: the GPU check is the same runner over suites that own their targets
    "gpu_check": ("measurement", "latency_table", "prune_search", "retnet_decode", "fla", "train_memory",
                  "runtime_tables"),
}
DEFAULT_BUDGET_S = 360.0  # the GPU check: new work starts within 6 minutes, so a run ends within 8 on an H200
MIN_START_S = 60.0  # on a GPU, a suite (or one condition of it) starts only with this much of the budget left


def call_suite(name: str, **given: Any) -> dict[str, Any]:
    """A suite's ``run`` with the arguments it accepts of `given`."""
    module = suite_module(name)
    accepted = inspect.signature(module.run).parameters
    return module.run(**{k: v for k, v in given.items() if k in accepted})


def run_suites(names: list[str], set_name: str | None, quick: bool, device: str, out: str | None,
               budget_s: float | None) -> dict[str, Any]:
    """Run `names` in turn, each recorded (and the report rewritten) when it ends; a suite that raises is an error,
    one that would start past the budget is skipped, and neither stops the others."""
    on_gpu = device == "cuda" and not quick
    budget = Budget(float("inf") if budget_s is None else budget_s, MIN_START_S if on_gpu else 0.0)
    path = results_dir(out) / f"{set_name or 'run'}.json"
    report: dict[str, Any] = {"set": set_name, "requested": names, "device": device, "quick": quick,
                              "budget_s": budget_s, "environment": machine(device), "suites": {}}
    if set_name:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for name in names:
        start = time.perf_counter()
        if not budget.allows():
            section: dict[str, Any] = {"skipped": budget.reason()}
        else:
            try:
                section = {"result": call_suite(name, quick=quick, device=device, out=out, budget=budget,
                                                gpu_check=set_name == "gpu_check")}
            except Exception as exc:  # noqa: BLE001 - a failing suite is recorded and the others still run
                section = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
                print(section["traceback"], file=sys.stderr, flush=True)
        section["seconds"] = round(time.perf_counter() - start, 1)
        report["suites"][name] = judge_section(name, section)
        print(f"[{set_name or 'run'}] {name}: {section['status']} ({section['seconds']} s)", flush=True)
        write_json(path, report)  # atomically, after every suite: a reader never sees half a report
    report["path"] = str(path)
    return report


def judge_section(name: str, section: dict[str, Any]) -> dict[str, Any]:
    """A report's section with its status (and its result's verdicts) computed now; a result that is not of the
    shape its suite writes raises :class:`~benchmarks.common.BenchmarkInputError`."""
    if not isinstance(section, dict):
        raise BenchmarkInputError(f"the section of suite {name!r} is not an object")
    if "result" in section:
        if not isinstance(section["result"], dict):
            raise BenchmarkInputError(f"the result of suite {name!r} is not an object")
        try:
            section["status"] = judge(name, section["result"])["status"]
        except (KeyError, TypeError, AttributeError, IndexError) as exc:
            raise BenchmarkInputError(f"the result of suite {name!r} is not one that suite writes (its targets cannot "
                                      f"be read: {type(exc).__name__} {exc})") from None
    else:
        section["status"] = "error" if "error" in section else "skipped"
    return section


def judge_report(report: dict[str, Any]) -> dict[str, Any]:
    """Every suite of a stored report judged again from its stored numbers with today's targets. A suite the run
    was asked for (the whole set, for a report that does not say) that the report lacks is listed as skipped (its
    targets not measured), never left out."""
    for name, section in report["suites"].items():
        judge_section(name, section)
    for name in report.get("requested") or SETS.get(report.get("set") or "", ()):
        if name not in report["suites"]:
            report["suites"][name] = {"skipped": "not in this report", "status": "skipped", "seconds": None}
    return report


def statuses(report: dict[str, Any]) -> dict[str, str]:
    return {name: section["status"] for name, section in report["suites"].items()}


# ------------------------------------------------------------------------------------------------------ merging
SAME_MACHINE = ("device", "torch", "cuda", "python", "timm", "fla")  # the calls of one merged report agree on these


def ran(section: dict[str, Any]) -> bool:
    """Whether a report's section holds a run of its suite (a result or an error); a skip, also one the suite's
    result states itself (a missing package, say), is not a run."""
    return "error" in section or ("result" in section and "skipped" not in (section["result"] or {}))


def checked(name: str, report: Any) -> dict[str, Any]:
    """A copy of `report` in today's form, or ValueError saying what is wrong with it."""
    if not isinstance(report, dict):
        raise BenchmarkInputError(f"{name} is not a run report: it must be a JSON object with 'suites'")
    suites = report.get("suites")
    if not isinstance(suites, dict) or not all(isinstance(s, dict) for s in suites.values()):
        raise BenchmarkInputError(f"{name} is not a run report: 'suites' must map each suite's name to its section")
    for suite in suites:
        try:
            suite_module(suite)
        except ImportError:
            raise BenchmarkInputError(f"{name} names an unknown suite {suite!r}") from None
    return copy.deepcopy(report)


def merge_reports(reports: list[tuple[str, Any]], set_name: str | None = None) -> dict[str, Any]:
    """One report from the reports of several calls (``(name, report)`` in call order), as when suites are run over
    several short device leases: each suite's section is the one call that ran it (``from``, and ``as``: the set it
    ran as, whose configuration it used); a suite no call ran keeps the last call's skip. The merged report is a
    set's only when every call ran as that set. Refused (ValueError): calls on different machines or versions
    (``SAME_MACHINE``), quick beside full runs, ``set_name`` where a call did not run as it, a suite run by more than
    one call (which run counts would be a choice made after seeing both)."""
    if not reports:
        raise BenchmarkInputError("no reports to merge")
    reports = [(name, checked(name, r)) for name, r in reports]
    first_name, first = reports[0]
    for name, report in reports[1:]:
        for key in SAME_MACHINE:
            mine, theirs = first.get("environment", {}).get(key), report.get("environment", {}).get(key)
            if mine != theirs:
                raise BenchmarkInputError(f"{name} ran with {key}={theirs!r} but {first_name} with {mine!r}; only "
                                          f"reports of one machine and one version of its libraries "
                                          f"({', '.join(SAME_MACHINE)}) are merged")
    if len({bool(r.get("quick")) for _, r in reports}) > 1:
        raise BenchmarkInputError("quick and full runs are not merged: their suites ran in different configurations")
    sets = {r.get("set") for _, r in reports}
    if set_name is not None:
        if set_name not in SETS:
            raise BenchmarkInputError(f"unknown set {set_name!r}; allowed: {', '.join(SETS)}")
        outside = [name for name, r in reports if r.get("set") != set_name]
        if outside:
            raise BenchmarkInputError(f"{', '.join(outside)} did not run as the set {set_name} (its suites ran in "
                                      "their own configuration); merge without --set")
    elif len(sets) == 1:
        set_name = sets.pop()
    requested = list(SETS[set_name]) if set_name else list(dict.fromkeys(
        n for _, r in reports for n in (r.get("requested") or r["suites"])))
    suites: dict[str, Any] = {}
    for suite in requested:
        runs = [name for name, r in reports if ran(r["suites"].get(suite, {}))]
        if len(runs) > 1:
            raise BenchmarkInputError(f"suite {suite} ran in more than one report ({', '.join(runs)}); merge one run "
                                      "of it")
        sections = [(name, r) for name, r in reports if suite in r["suites"]]
        name, report = next(((n, r) for n, r in sections if ran(r["suites"][suite])),
                            sections[-1] if sections else (None, None))
        suites[suite] = ({**report["suites"][suite], "from": name, "as": report.get("set")} if report else
                         {"skipped": "in none of the merged reports", "seconds": None})
    calls = [{"report": name, "set": r.get("set"), "budget_s": r.get("budget_s"),
              "ran": [n for n, s in r["suites"].items() if ran(s)]} for name, r in reports]
    return judge_report({"set": set_name, "requested": requested, "device": first.get("device"),
                         "quick": bool(first.get("quick")), "budget_s": None,
                         "environment": first.get("environment", {}), "merged_from": calls, "suites": suites})


def merge_files(paths: list[str], set_name: str | None, out: str | Path) -> tuple[dict[str, Any], int]:
    """``python -m benchmarks merge``: :func:`merge_reports` of stored reports, written to `out`; the report and
    its exit status."""
    reports = []
    for path in paths:
        reports.append((str(path), read_json(path)))
    from zoo.files import write_json

    report = merge_reports(reports, set_name)
    write_json(out, report)
    return report, exit_code(statuses(report).values())


# ------------------------------------------------------------------------------------------------------ digest
def _number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def digest(report: dict[str, Any]) -> str:
    """One line per suite (status, seconds, why), then each of its targets that is not met or not measured, with
    the measured number and the target."""
    env = report.get("environment", {})
    lines = [f"{report.get('set') or 'run'} on {env.get('device', report.get('device'))}, torch {env.get('torch')}"]
    for name, section in report["suites"].items():
        why = section.get("error") or section.get("skipped") or (section.get("result") or {}).get("skipped")
        lines.append(f"{name}: {section['status']} ({section.get('seconds')} s)" + (f": {why}" if why else ""))
        result = section.get("result")
        if result is None or "skipped" in result:
            continue
        for check in suite_module(name).checks(result):
            if check.verdict is not True:
                word = "not met" if check.verdict is False else "not measured"
                lines.append(f"  {word}: {check.label} (measured {_number(check.measured)}, target {check.op} "
                             f"{_number(check.limit)})")
    lines.append(f"exit status {exit_code(statuses(report).values())}")
    return "\n".join(lines)


def judge_file(path: str | Path, suite: str | None = None, out: str | Path | None = None) -> tuple[dict, int]:
    """``python -m benchmarks judge``: a stored report (or one suite's result file, named by its ``suite`` /
    ``benchmark`` key or `suite`) judged again; written to `out` when given. Returns it and the exit status. A file
    that is missing, not JSON or not of a suite's shape raises :class:`~benchmarks.common.BenchmarkInputError`."""
    stored = read_json(path)
    if not isinstance(stored, dict):
        raise BenchmarkInputError(f"{path} holds a JSON {type(stored).__name__}, not a report or a suite's result "
                                  "(an object)")
    if "suites" in stored:
        if not isinstance(stored["suites"], dict):
            raise BenchmarkInputError(f"{path}: its 'suites' is not an object of suite -> section")
        report = judge_report(stored)
    else:
        name = suite or stored.get("suite") or stored.get("benchmark")
        if name is None:
            raise BenchmarkInputError(f"{path} names no suite (no 'suite' key); pass --suite NAME")
        report = judge_report({"set": None, "suites": {name: {"result": stored, "seconds": None}}})
    if out is not None:
        write_json(out, report)
    return report, exit_code(statuses(report).values())
