"""Paired comparisons of pruning rules that can carry a claim.

Each comparison pairs two rules by seed (a seed changes the calibration batches, the search's randomness and the
fine-tune's order). A difference that varies over seeds is tested with the paired t test (scipy.stats, the t
distribution's critical values); a difference with no spread over seeds (the seed did not change either plan's
quality, so the seeds measured nothing) is tested on the validation samples with a paired bootstrap of the
per-sample differences instead, never called a win by itself. All comparisons of one model family are then
corrected together with Holm's step-down method; the verdict is ``better``, ``worse`` or ``tie`` at ``alpha``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

ALPHA = 0.05
BOOTSTRAP_DRAWS = 10_000


def paired_t(diffs: Sequence[float]) -> dict[str, Any]:
    """Two-sided paired t test of mean(diffs) = 0 (scipy.stats.ttest_1samp on the per-seed differences)."""
    from scipy import stats

    values = np.asarray(diffs, dtype=float)
    n = len(values)
    sd = float(values.std(ddof=1)) if n > 1 else 0.0
    result = stats.ttest_1samp(values, 0.0)
    return {"test": "paired_t", "n": n, "mean": float(values.mean()), "sd": sd, "se": sd / math.sqrt(n),
            "t": float(result.statistic), "df": n - 1, "p": float(result.pvalue),
            "t_critical": float(stats.t.ppf(1 - ALPHA / 2, n - 1))}


def paired_bootstrap(per_sample: Sequence[float], draws: int = BOOTSTRAP_DRAWS, seed: int = 0) -> dict[str, Any]:
    """Two-sided paired bootstrap of mean(per_sample differences) = 0 over the validation samples: the share of
    resampled means on the other side of zero from the observed one, doubled (at least 1 / draws)."""
    values = np.asarray(per_sample, dtype=float)
    mean = float(values.mean())
    if not np.any(values != 0.0):
        return {"test": "paired_bootstrap", "n": len(values), "mean": 0.0, "p": 1.0, "draws": draws}
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), size=(draws, len(values)))].mean(axis=1)
    other_side = np.count_nonzero(means <= 0.0) if mean > 0 else np.count_nonzero(means >= 0.0)
    return {"test": "paired_bootstrap", "n": len(values), "mean": mean, "p": min(1.0, max(2 * other_side, 1) / draws),
            "ci95": [float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))], "draws": draws}


def compare(diffs: Sequence[float], per_sample: Sequence[Sequence[float]] | None) -> dict[str, Any]:
    """One paired comparison: the t test over seeds, or the bootstrap over samples when the seeds do not vary.

    diffs: per-seed differences (positive: the first rule is better); per_sample: per seed, the per-sample
    differences on the validation set in the same direction (averaged over seeds for the bootstrap)."""
    values = np.asarray(diffs, dtype=float)
    if len(values) >= 2 and float(values.std(ddof=1)) > 1e-12 * max(1.0, float(np.abs(values).max())):
        return paired_t(values)
    if per_sample is None:
        return {"test": "none", "n": len(values), "mean": float(values.mean()) if len(values) else 0.0, "p": 1.0,
                "note": "no spread over seeds and no per-sample values"}
    averaged = np.mean(np.asarray(per_sample, dtype=float), axis=0)
    return {**paired_bootstrap(averaged), "seeds": len(values),
            "note": "no spread over seeds: tested on the validation samples"}


def holm(pvalues: Sequence[float], alpha: float = ALPHA) -> list[dict[str, Any]]:
    """Holm's step-down correction: per p value its adjusted p and whether it is rejected at `alpha`."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    m = len(pvalues)
    adjusted = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return [{"p_holm": adjusted[i], "rejected": adjusted[i] < alpha} for i in range(m)]


def verdicts(comparisons: list[dict[str, Any]], alpha: float = ALPHA) -> list[dict[str, Any]]:
    """Holm-correct a model family's comparisons (each with ``p`` and ``mean``) and name each: better, worse or tie."""
    corrected = holm([c["p"] for c in comparisons], alpha)
    out = []
    for comparison, fix in zip(comparisons, corrected):
        verdict = "tie" if not fix["rejected"] else ("better" if comparison["mean"] > 0 else "worse")
        out.append({**comparison, **fix, "family_size": len(comparisons), "verdict": verdict})
    return out
