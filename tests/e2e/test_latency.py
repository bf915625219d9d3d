"""Latency measurement, lookup tables, cache safety, prediction error and correction, CLI and benchmark smoke test
(CPU, tiny sizes). How entries are timed (CUDA protocols, in-context timing, drift) is in test_latency_timing.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from zoo.latency import LatencyCacheWarning

from ..helpers import ROOT, small_table
from ..helpers import TABLE_MODEL as MODEL


def test_two_processes_building_at_once_leave_a_valid_table(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import json, sys
        from zoo.latency import TableSettings, build_table
        table = build_table("{MODEL}", input_size=32, device="cpu", cache_dir=sys.argv[1],
                            settings=TableSettings(warmup_s=0.1, entry_warmup_s=0.0, min_rounds=3, max_rounds=3))
        print(json.dumps(sorted(table.records)))
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                              env=env, cwd=ROOT) for _ in range(2)]
    outputs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    keys = [set(json.loads(out.strip().splitlines()[-1])) for out in outputs]
    assert keys[0] == keys[1]
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1
    entries = json.loads(files[0].read_text())["entries"]
    assert keys[0] <= set(entries)


def test_cli_runs_on_a_tiny_config(tmp_path: Path) -> None:
    out = tmp_path / "summary.json"
    cmd = [sys.executable, "-m", "zoo.latency", f"model={MODEL}", "input_size=32", "device=cpu", "warmup_s=0.1",
           "min_rounds=3", "max_rounds=3", f"cache_dir={tmp_path}", "correct=2", f"json={out}"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=240)
    assert done.returncode == 0, done.stderr
    assert "measured now" in done.stdout and "noise floor" in done.stdout
    assert json.loads(out.read_text())["correction"]["n_plans"] == 2
    bad = subprocess.run([sys.executable, "-m", "zoo.latency", "device=tpu", "model=mobilenetv2_035"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert bad.returncode == 2 and "Allowed devices" in bad.stderr


def test_corrupt_and_stale_cache_files_are_remeasured(tmp_path: Path) -> None:
    first = small_table(tmp_path)
    path = next(tmp_path.glob("*.json"))
    path.write_text('{"format": 1, "entries": {"trunc')
    with pytest.warns(LatencyCacheWarning, match="not readable JSON"):
        rebuilt = small_table(tmp_path)
    assert rebuilt.n_measured == first.n_measured + first.n_cached
    data = json.loads(path.read_text())
    assert len(data["entries"]) == rebuilt.n_measured
    data["format"] = 0
    path.write_text(json.dumps(data))
    with pytest.warns(LatencyCacheWarning, match="stale"):
        assert small_table(tmp_path).n_measured == rebuilt.n_measured
