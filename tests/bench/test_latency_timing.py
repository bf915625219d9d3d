"""How latency-table entries are timed: the CUDA timing protocols (on a GPU machine; skipped elsewhere), entries timed
in context inside probe networks, the error components, drift across rounds and sessions (CPU, tiny sizes)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

import zoo

from ..helpers import FAST_TABLE as FAST
from ..helpers import ROOT
from ..helpers import TABLE_MODEL as MODEL
from ..helpers import TABLE_SIZE as SIZE


def test_diagnosis_splits_each_networks_error_into_segments_and_rest() -> None:
    from studies.latency_diagnosis import diagnose, drift_trace, hook_check, neighbour_check, report, session_check

    quick = replace(FAST, entries="isolated")
    calib = zoo.latency.NetworkTimingSettings(warmup_s=0.05, net_warmup_s=0.0, min_rounds=5, max_rounds=5)
    result = diagnose(MODEL, 1, SIZE, 2, 0, quick, calib, rebuild=False)
    assert len(result["networks"]) == 3 and result["entries"]
    for n in result["networks"]:  # in-context parts add up to the measured total, so the split is exact
        assert n["predicted_ms"] - n["measured_ms"] == pytest.approx(n["segments_gap_ms"] + n["rest_gap_ms"], abs=1e-9)
        assert n["error"] == pytest.approx(n["predicted_ms"] / n["measured_ms"] - 1)
        anchored_gap = n["predicted_ms"] * result["anchor"] - n["measured_ms"]  # exact, anchored too
        assert anchored_gap == pytest.approx(n["segments_gap_anchored_ms"] + n["rest_gap_anchored_ms"], abs=1e-9)
        assert n["anchored_error"] == pytest.approx(anchored_gap / n["measured_ms"])
        largest = [abs(gap) for _, gap in n["largest_gaps_anchored_ms"]]
        assert len(largest) == 3 and largest == sorted(largest, reverse=True)
    assert result["networks"][0]["anchored_error"] == pytest.approx(0.0)
    assert "| original |" in report(result)
    check = hook_check(MODEL, 5, 1, SIZE, replace(FAST, entries="context"))
    assert check["segments"] > 0 and 0 < check["table_ms"]
    assert check["hooked_ms"] > 0 and check["plain_ms"] > 0  # their ratio is a measurement (the diagnosis), not a test
    sessions = session_check(MODEL, 2, 2, 0, 1, SIZE, replace(FAST, entries="context"), calib)
    assert [(r["session"], r["network"]) for r in sessions] == [
        (s, n) for s in (0, 1) for n in ("original", "plan 0", "plan 1")]
    assert all(r["removed"] for r in sessions if r["network"] != "original")  # pruned plans, measured twice
    assert sessions[1]["measured_ms"] != sessions[4]["measured_ms"]  # two sessions, two measurements
    rows = drift_trace(MODEL, 1.0, window_s=0.5)
    assert rows and all(r["min_ms"] <= r["p10_ms"] <= r["median_ms"] for r in rows)
    rows = neighbour_check(MODEL, 2, 3, 1, 1, SIZE, replace(FAST, entries="context"))
    assert [(r["mode"], r["warm_calls"], r["round_order"]) for r in rows] == [
        ("alone", 0, "fixed"), ("between plans", 0, "fixed"), ("between plans", 1, "fixed"),
        ("between plans", 0, "shuffled")]
    for r in rows:
        assert len(r["copies_relative"]) == 2 and r["copies_sd"] == pytest.approx(float(np.std(r["copies_relative"])))
        assert len(r["plans_ms"]) == (0 if r["mode"] == "alone" else 2)
        assert 0.5 < r["original_ms"] / rows[0]["original_ms"] < 2  # the copies are the original in every mode


def test_part_drift_separates_a_part_that_drifts_with_the_network_from_one_that_drifts_alone() -> None:
    """Synthetic windows: the network's speed moves +-20 %, part A is always 10 % of the network, part B also moves
    on its own (+-15 %). Relative to the network A does not spread and B does; the hog windows make B 30 % slower
    and leave A's share alone. Then real traces, with and without the hog, a drift trace alternating CPUs, and the
    command line's bad input."""
    from studies.latency_diagnosis import PART_KERNELS, drift_trace, part_drift_summary, part_drift_trace

    def part(ms: float) -> dict[str, Any]:
        return {"p10_ms": ms, "halves_p10_ms": [ms * 0.99, ms * 1.01]}

    speed = [1.0, 1.2, 0.8, 1.1, 0.9, 1.0, 1.2, 0.8]
    own = [1.0, 1.0, 1.15, 1.0, 0.85, 1.0, 1.1, 1.0]
    rows = [{"window": i, "memory_hog": bool(i % 2), "network": part(20 * s), "A": part(2 * s),
             "B": part(3 * s * o * (1.3 if i % 2 else 1.0))} for i, (s, o) in enumerate(zip(speed, own))]
    summary = part_drift_summary(rows)
    quiet_speed = np.array(speed[0::2])
    assert summary["network"]["sd"] == pytest.approx(np.std(quiet_speed, ddof=1) / np.median(quiet_speed))
    assert summary["A"]["sd"] == pytest.approx(summary["network"]["sd"])  # it drifts with the machine
    assert summary["A"]["sd_relative_to_network"] == pytest.approx(0.0, abs=1e-12)  # one scale takes it out
    quiet_own = np.array(own[0::2])  # one scale leaves B's own movement in, and only that
    assert summary["B"]["sd_relative_to_network"] == pytest.approx(np.std(quiet_own, ddof=1) / np.median(quiet_own))
    assert summary["A"]["noise"] == pytest.approx(0.02 / 1.349, rel=1e-6)
    assert summary["A"]["with_hog_over_without_relative_to_network"] == pytest.approx(1.0)
    assert summary["B"]["with_hog_over_without_relative_to_network"] == pytest.approx(1.3 / np.median(quiet_own))

    rows = part_drift_trace(MODEL, 2, window_s=0.2, sweep_mb=8, min_runs=4)
    assert [r["window"] for r in rows] == [0, 1] and not any(r["memory_hog"] or r["hog_ran"] for r in rows)
    for r in rows:
        assert r["runs"] >= 4 and set(r) >= {"network", *PART_KERNELS}
        assert all(r[name]["p10_ms"] > 0 and len(r[name]["halves_p10_ms"]) == 2 for name in ("network", *PART_KERNELS))
    cpus = os.sched_getaffinity(0)
    if {0, 1} <= cpus:  # the hog streams through the second window; afterwards this process runs where it could
        hogged = part_drift_trace(MODEL, 3, window_s=0.2, memory_hog=True, sweep_mb=8, min_runs=4)
        assert [(r["memory_hog"], r["hog_ran"]) for r in hogged] == [(False, False), (True, True), (False, False)]
        assert os.sched_getaffinity(0) == cpus
        alternating = drift_trace(MODEL, 1.0, window_s=0.25, alternate_cpus=True)
        assert [r["cpu"] for r in alternating] == [0, 1, 0, 1] and os.sched_getaffinity(0) == cpus
    bad = subprocess.run([sys.executable, "-m", "studies.latency_diagnosis", "--part-drift", "1"],
                         capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "--part-drift takes 2 or more windows" in bad.stderr


def test_timed_runs_reuse_freed_memory_instead_of_page_faulting_every_call():
    """A 40 MB buffer (above glibc's largest mmap threshold, like a merged dense conv's re-laid-out weights) is a
    fresh mmap on every call in a fresh process: ~10k page faults per call. Inside the timing context freed memory
    is kept, so repeated calls fault no page; on exit glibc mmaps such buffers again. In a fresh interpreter: in a
    process with a history the buffer may come from a hole an earlier allocation left in the heap (and not fault),
    which is why a default process's time for such kernels depends on what ran before."""
    from zoo.latency.device import host_allocator

    if host_allocator() != "glibc-keep-freed":
        pytest.skip("needs glibc (Linux): other C libraries keep their own allocator")
    script = textwrap.dedent("""
        import resource, torch
        from zoo.latency.device import timing_context

        def faults_per_call():
            counts = []
            for _ in range(4):
                before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                torch.ones(10_000_000).sum()  # 40 MB, written and freed
                counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
            return min(counts[1:])  # the first call may fault in memory the heap never had

        before = faults_per_call()
        with timing_context(torch.device("cpu"), torch.float32, 1):
            inside = faults_per_call()
        print(before, inside, faults_per_call())
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=ROOT)
    before, inside, after = map(int, out.stdout.split())
    assert before > 5000  # the default: mmap'd afresh every call
    assert inside < 100
    assert after > 5000  # glibc's thresholds back, 40 MB is above the mmap threshold
