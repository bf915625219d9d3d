"""Time each test tier as CI runs it and write the evidence the README and tests/README.md cite.

    python .ci/test_times.py [--out results/test_times_cpu.json] [--tiers unit e2e bench serial] [--no-main]
    python .ci/test_times.py --readme main|test --command "$(python .ci/readme_command.py main|test)" [--append]

Times the README's main job (``python prune.py``, cold), then runs each tier's command (the same as ``.ci/run``) with
a JUnit report, and writes one JSON: the main job's time; per tier the command, its wall time, the exit status, the
day it ran (``--append`` may keep entries of earlier days), the count of tests by outcome and the 10 slowest tests;
the machine and versions.
Run it in a fresh clone after the README's install so that no cache of an earlier run is reused.

``--readme main`` / ``--readme test`` run the README's set-up command given by ``--command`` (as ``.ci/run`` read it
from the README: ``.ci/readme_command.py``) exactly as written instead, install included (CI's first steps, in a
fresh virtual environment), recorded as the main job and the unit tier; ``--append`` adds to the file ``--out``
already holds, so that CI times each test once.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIERS = {  # the commands of .ci/run and tests/README.md
    "unit": ["-q"],
    "e2e": ["-q", "tests/e2e", "-m", "not serial", "-n", "2"],
    "bench": ["-q", "tests/bench", "-m", "not serial", "-n", "2"],
    "serial": ["-q", "tests/e2e", "tests/bench", "-m", "serial", "-n", "0"],
}


def run_tier(name: str, folder: Path) -> dict:
    report = folder / f"{name}.xml"
    args = [sys.executable, "-m", "pytest", *TIERS[name], "-p", "no:cacheprovider", "--durations=20",
            f"--junitxml={report}"]
    start = time.perf_counter()
    proc = subprocess.run(args, cwd=ROOT, env={**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"})
    wall = time.perf_counter() - start
    return {"command": "python -m pytest " + " ".join(TIERS[name]), "wall_s": round(wall, 1), "exit": proc.returncode,
            "date": time.strftime("%Y-%m-%d"), **junit_summary(report)}


def run_readme(name: str, command: str, folder: Path) -> dict:
    """The README's ``ci:NAME`` `command` in bash, as written (its install included); the test command's pytest also
    writes a JUnit report and its 20 slowest tests (``PYTEST_ADDOPTS``), so that the unit tier runs once."""
    report = folder / f"readme_{name}.xml"
    env = {**os.environ, "DEPTHZOO_CACHE": str(folder / "cache")}  # cold, as on a fresh machine
    if name == "test":
        env["PYTEST_ADDOPTS"] = f"{env.get('PYTEST_ADDOPTS', '')} --durations=20 --junitxml={report}".strip()
    start = time.perf_counter()
    proc = subprocess.run(["bash", "-c", f"set -eo pipefail; {command}"], cwd=ROOT, env=env)
    entry = {"command": command, "wall_s": round(time.perf_counter() - start, 1), "exit": proc.returncode,
             "includes_install": True, "date": time.strftime("%Y-%m-%d")}
    return {**entry, **junit_summary(report)} if name == "test" else entry


def junit_summary(report: Path) -> dict:
    """The count of tests by outcome and the 10 slowest, from a JUnit report (none when pytest stopped early)."""
    cases = []
    for case in ET.parse(report).iter("testcase") if report.is_file() else ():  # none: pytest stopped before tests
        outcome = next((child.tag for child in case if child.tag in ("failure", "error", "skipped")), "passed")
        cases.append({"test": f"{case.get('classname')}::{case.get('name')}", "s": float(case.get("time") or 0),
                      "outcome": outcome})
    counts: dict[str, int] = {}
    for case in cases:
        counts[case["outcome"]] = counts.get(case["outcome"], 0) + 1
    slowest = sorted(cases, key=lambda c: -c["s"])[:10]
    return {"tests": counts, "slowest": [{k: c[k] for k in ("test", "s")} for c in slowest]}


def run_main(folder: Path) -> dict:
    """The README's main job after the install, ``python prune.py``, cold: its own outputs and latency cache."""
    args = [sys.executable, "prune.py", f"paths.log_dir={folder / 'main'}", f"hydra.run.dir={folder / 'main' / 'run'}"]
    env = {**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1", "DEPTHZOO_CACHE": str(folder / "cache")}
    start = time.perf_counter()
    proc = subprocess.run(args, cwd=ROOT, env=env)
    return {"command": "python prune.py", "wall_s": round(time.perf_counter() - start, 1), "exit": proc.returncode,
            "date": time.strftime("%Y-%m-%d")}


def installed_torch() -> str | None:
    """The torch version this Python has now (the README's install may have just put it there), None without one."""
    proc = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                          text=True)
    return proc.stdout.strip() if proc.returncode == 0 else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "results" / "test_times_cpu.json"))
    parser.add_argument("--tiers", nargs="*", choices=list(TIERS), help="default: every tier (none with --readme)")
    parser.add_argument("--no-main", action="store_true", help="skip timing the README's main job (python prune.py)")
    parser.add_argument("--readme", choices=["main", "test"],
                        help="run --command, the README's set-up command (main: the main job; test: the unit tier)")
    parser.add_argument("--command", help="with --readme: the command, as .ci/readme_command.py prints it")
    parser.add_argument("--append", action="store_true", help="add to what --out holds (one CI, several steps)")
    args = parser.parse_args()
    if bool(args.readme) != bool(args.command):
        parser.error("--readme and --command go together")
    out = Path(args.out)
    result = json.loads(out.read_text()) if args.append and out.is_file() else {}
    result.setdefault("tiers", {})
    result.setdefault("commands", []).append(shlex.join(["python", ".ci/test_times.py", *sys.argv[1:]]))
    result.update(date=time.strftime("%Y-%m-%d"),
                  machine={"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()})
    with tempfile.TemporaryDirectory() as folder:
        if args.readme:
            entry = run_readme(args.readme, args.command, Path(folder))
            if args.readme == "main":
                result["main"] = entry
            else:
                result["tiers"]["unit"] = entry
            print(f"README {args.readme}: {entry['wall_s']} s, exit {entry['exit']}", flush=True)
        if not args.no_main and not args.readme:
            result["main"] = run_main(Path(folder))
            print(f"main: {result['main']['wall_s']} s, exit {result['main']['exit']}", flush=True)
        for name in args.tiers if args.tiers is not None else [] if args.readme else list(TIERS):
            result["tiers"][name] = run_tier(name, Path(folder))
            print(f"{name}: {result['tiers'][name]['wall_s']} s, exit {result['tiers'][name]['exit']}", flush=True)
    result["versions"] = {"python": platform.python_version(), "torch": installed_torch()}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    os.replace(tmp, out)
    exits = [t["exit"] for t in result["tiers"].values()] + [result.get("main", {}).get("exit", 0)]
    return max(exits)  # a job or tier that failed, or a tier that collected nothing (pytest's 5), fails


if __name__ == "__main__":
    sys.exit(main())
