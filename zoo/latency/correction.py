"""The correction a table may carry: ``corrected = scale * raw + offset_ms`` for a whole-network prediction, and its
fit to measured networks by leave-one-out error (:func:`fit_correction`)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Correction:
    """``corrected = scale * raw + offset_ms`` for a whole-network prediction (kind: none, scale or offset)."""

    kind: str = "none"
    scale: float = 1.0
    offset_ms: float = 0.0

    def apply(self, raw_ms: float) -> float:
        return self.scale * raw_ms + self.offset_ms


def _fit(kind: str, predicted: Sequence[float], measured: Sequence[float]) -> Correction:
    if kind == "scale":
        return Correction("scale", statistics.median(m / p for p, m in zip(predicted, measured)), 0.0)
    if kind == "offset":
        return Correction("offset", 1.0, statistics.median(m - p for p, m in zip(predicted, measured)))
    return Correction()


def fit_correction(predicted: Sequence[float], measured: Sequence[float], margin: float = 0.0
                   ) -> tuple[Correction, float]:
    """The correction kind with the lowest leave-one-out mean abs relative error, and that error.

    A correction is kept only when its leave-one-out error beats the raw prediction's error by more than `margin`
    (a relative error, e.g. the noise floor: an improvement smaller than the measurement noise is not evidence);
    otherwise 'none' is returned with the raw error.
    """
    n = len(predicted)
    if n < 2:
        return Correction(), float("nan")
    loo: dict[str, float] = {}
    for kind in ("none", "scale", "offset"):
        errors = []
        for i in range(n):
            rest = [j for j in range(n) if j != i]
            corr = _fit(kind, [predicted[j] for j in rest], [measured[j] for j in rest])
            errors.append(abs(corr.apply(predicted[i]) / measured[i] - 1.0))
        loo[kind] = statistics.fmean(errors)
    best = min(("scale", "offset"), key=lambda kind: loo[kind])
    if loo[best] < loo["none"] - margin - 1e-12:
        return _fit(best, predicted, measured), loo[best]
    return Correction(), loo["none"]


__all__ = ["Correction", "fit_correction"]
