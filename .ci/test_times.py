"""Time each test tier as CI runs it and write the evidence the README and tests/README.md cite.

    python .ci/test_times.py [--out results/test_times_cpu.json] [--tiers unit e2e bench serial] [--no-main]

Times the README's main job (``python prune.py``, cold), then runs each tier's command (the same as ``.ci/run``) with
a JUnit report, and writes one JSON: the main job's time; per tier the command,
its wall time, the exit status, the count of tests by outcome and the 10 slowest tests; the machine and versions.
Run it in a fresh clone after the README's install so that no cache of an earlier run is reused.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
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
    cases = []
    for case in ET.parse(report).iter("testcase") if report.is_file() else ():  # none: pytest stopped before tests
        outcome = next((child.tag for child in case if child.tag in ("failure", "error", "skipped")), "passed")
        cases.append({"test": f"{case.get('classname')}::{case.get('name')}", "s": float(case.get("time") or 0),
                      "outcome": outcome})
    counts: dict[str, int] = {}
    for case in cases:
        counts[case["outcome"]] = counts.get(case["outcome"], 0) + 1
    slowest = sorted(cases, key=lambda c: -c["s"])[:10]
    return {"command": "python -m pytest " + " ".join(TIERS[name]), "wall_s": round(wall, 1), "exit": proc.returncode,
            "tests": counts, "slowest": [{k: c[k] for k in ("test", "s")} for c in slowest]}


def run_main(folder: Path) -> dict:
    """The README's main job after the install, ``python prune.py``, cold: its own outputs and latency cache."""
    args = [sys.executable, "prune.py", f"paths.log_dir={folder / 'main'}", f"hydra.run.dir={folder / 'main' / 'run'}"]
    env = {**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1", "DEPTHZOO_CACHE": str(folder / "cache")}
    start = time.perf_counter()
    proc = subprocess.run(args, cwd=ROOT, env=env)
    return {"command": "python prune.py", "wall_s": round(time.perf_counter() - start, 1), "exit": proc.returncode}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "results" / "test_times_cpu.json"))
    parser.add_argument("--tiers", nargs="+", default=list(TIERS), choices=list(TIERS))
    parser.add_argument("--no-main", action="store_true", help="skip timing the README's main job (python prune.py)")
    args = parser.parse_args()
    import torch

    result = {"command": "python .ci/test_times.py " + " ".join(sys.argv[1:]), "date": time.strftime("%Y-%m-%d"),
              "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()},
              "versions": {"python": platform.python_version(), "torch": torch.__version__}, "tiers": {}}
    with tempfile.TemporaryDirectory() as folder:
        if not args.no_main:
            result["main"] = run_main(Path(folder))
            print(f"main: {result['main']['wall_s']} s, exit {result['main']['exit']}", flush=True)
        for name in args.tiers:
            result["tiers"][name] = run_tier(name, Path(folder))
            print(f"{name}: {result['tiers'][name]['wall_s']} s, exit {result['tiers'][name]['exit']}", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    os.replace(tmp, out)
    exits = [t["exit"] for t in result["tiers"].values()] + [result.get("main", {}).get("exit", 0)]
    return max(exits)  # a job or tier that failed, or a tier that collected nothing (pytest's 5), fails


if __name__ == "__main__":
    sys.exit(main())
