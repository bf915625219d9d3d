"""Drift statistics: how fast the machine was in each round, as the other networks (or records) timed in the same
rounds saw it, and the level each estimator's statistic sits at.

The machine's speed drifts over seconds (docs/latency.md), so a table's timings divide each run by its round's
speed (:func:`speeds_from_others`), which puts every run at the build's median speed, and then put each estimator
back at the speed it picks out of a reference network's raw runs (:func:`speed_levels`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .settings import ESTIMATORS

ESTIMATOR_WINDOWS = {"median": (40.0, 60.0), "p10": (0.0, 20.0), "min": (0.0, 5.0)}


def estimator_runs(totals: Sequence[float], estimator: str) -> np.ndarray:
    """Indices of the runs whose total lies in the estimator's percentile window (p10: the fastest 20 %)."""
    t = np.asarray(totals, dtype=np.float64)
    lo, hi = np.percentile(t, ESTIMATOR_WINDOWS[estimator])
    chosen = np.flatnonzero((t >= lo) & (t <= hi))
    return chosen if chosen.size else np.array([int(np.argmin(np.abs(t - np.median(t))))])


def machine_speed(per_round: Sequence[float], span: int = 3) -> np.ndarray:
    """Per round, how slow the machine was: a time per round (a running median over ``2 * span + 1`` rounds, which
    keeps one slow run from counting as a slow machine) over its median."""
    per_round = np.asarray(per_round, dtype=np.float64)
    smooth = np.array([np.median(per_round[max(0, r - span):r + span + 1]) for r in range(per_round.size)])
    return smooth / np.median(smooth)


def speed_levels(reference_ms: Sequence[float], speed: np.ndarray) -> dict[str, float]:
    """Per estimator: where its runs of the reference sit raw, over where they sit once divided by the machine's speed
    (the mean over the estimator's window of runs, :func:`estimator_runs`).

    Dividing by :func:`machine_speed` puts every run at the build's median speed. A whole network measured end to
    end (a prediction check, ``prune.py``) reports the estimator of its raw runs, which on a drifting machine sits at
    the speed of its fast rounds (p10, min). Multiplying by this level puts the records at that same speed, so a table
    and a measurement report the same machine state (docs/latency.md). Only these statistics are levelled; a
    record's mean, IQR and MAD stay at the median speed.
    """
    raw = np.asarray(reference_ms, dtype=np.float64)
    normalised = raw / speed
    return {est: float(raw[estimator_runs(raw, est)].mean() / normalised[estimator_runs(normalised, est)].mean())
            for est in ESTIMATORS}


def speeds_from_others(times_ms: Sequence[Sequence[float]], runs_per_round: int) -> list[np.ndarray]:
    """Per bench, per run: the :func:`machine_speed` of that run's round as the *other* benches timed in the same
    rounds saw it (per round, the median over them of their time over their own median), repeated for each run
    of the round: what that bench's runs divide by.

    No bench is divided by its own times. A network whose own runs set the speed has part of its own noise divided
    out with the drift, so its fastest runs sit closer to its median than any other network's, and its records
    would come out slower than theirs (docs/latency.md, "Where the error sits"). With one bench, it is its own.
    """
    per_round = np.stack([np.asarray(t, dtype=np.float64).reshape(-1, runs_per_round).mean(axis=1)
                          for t in times_ms])
    relative = per_round / np.median(per_round, axis=1, keepdims=True)
    speeds = []
    for j in range(len(relative)):
        others = np.delete(relative, j, axis=0) if len(relative) > 1 else relative
        speeds.append(np.repeat(machine_speed(np.median(others, axis=0)), runs_per_round))
    return speeds


__all__ = ["ESTIMATOR_WINDOWS", "estimator_runs", "machine_speed", "speed_levels", "speeds_from_others"]
