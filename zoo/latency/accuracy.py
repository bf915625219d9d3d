"""Whole networks timed side by side: interleaved rounds (A B C A B C ...) on the same inputs, under a table's
conditions (device, dtype, layout, threads, runtime). A table's prediction check (:mod:`zoo.latency.accuracy`),
``prune.py``'s final measurement and the benchmarks time networks this way.

How well a table predicts measured end-to-end latency, and a correction where one helps.

:func:`prediction_error` times the original network and pruned networks (:func:`zoo.pruning.surgery.apply_plan`, merged)
in interleaved rounds (A B C ... A' ... each round, :func:`~zoo.latency.accuracy.time_networks`), with the table's
device, dtype, layout, thread count and runtime. The original runs twice (A and A'); their relative difference is
the **noise floor**: a prediction error below it cannot be told from measurement noise. :func:`correct` does this
for random plans and fits a correction ``scale * raw + offset`` (:func:`~zoo.latency.table.fit_correction`:
kind scale or offset, chosen by leave-one-out error over the measured networks), kept only when it beats the raw
prediction on networks it was not fit on by more than the noise floor; otherwise there is none (raw predictions
are used).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from ..pruning.surgery import Segment, apply_plan
from .cache import device_lock
from .device import resolve_dtype, timing_context
from .measure import Bench, measured_form, prepare, time_rounds
from .runtime import in_runtime
from .settings import NetworkTimingSettings
from .table import Correction, LatencyTable, fit_correction


def time_interleaved(callables: Sequence[Any], args: Sequence[Any], kwargs: Mapping[str, Any], device: torch.device,
                     dtype: torch.dtype, threads: int, settings: NetworkTimingSettings, cuda_graph: bool = False,
                     clock: str = "wall") -> list[Bench]:
    """Time callables on the same inputs in interleaved rounds (A B C A B C ...); one bench per callable."""
    benches = [Bench(fn, tuple(args), kwargs, device, cuda_graph, clock) for fn in callables]
    with device_lock(device), timing_context(device, dtype, threads):
        benches[0].warmup(settings.warmup_s)
        for bench in benches:
            bench.warmup(settings.net_warmup_s)
        time_rounds(benches, (settings.min_rounds, settings.max_rounds), settings.runs_per_round, settings.rel_tol,
                    settings.max_time_s, warm_calls=settings.warm_calls, order=settings.round_order)
    return benches


def time_networks(nets: Sequence[nn.Module], example: Any, forward_kwargs: Mapping[str, Any], table: LatencyTable,
                  settings: NetworkTimingSettings, labels: Sequence[str] | None = None) -> list[Bench]:
    """Time whole networks in interleaved rounds under the table's conditions (its runtime too: each network is
    compiled or exported first, once per distinct network); one bench per network. `labels` name them in errors."""
    device = next(iter(table.model.parameters())).device
    dtype = resolve_dtype(table.condition["dtype"], device)
    runtime, threads = table.settings.runtime, table.settings.threads
    made: dict[int, Any] = {}
    with timing_context(device, dtype, threads):
        for i, net in enumerate(nets):
            if id(net) not in made:
                what = f"network {labels[i] if labels else i}"
                made[id(net)] = in_runtime(net, (example,), forward_kwargs, runtime, device, threads, dtype, what)
    return time_interleaved([made[id(net)] for net in nets], (example,), forward_kwargs, device, dtype, threads,
                            settings, table.settings.cuda_graph, table.settings.clock)


def pruned_network(table: LatencyTable, plan: Mapping[str, Any]) -> nn.Module:
    """The table's model with `plan` applied (a copy), prepared like the table's segments."""
    model = measured_form(apply_plan(table.model, dict(plan), inplace=False), table.settings)
    channels_last = table.condition["layout"] == "channels_last"
    return prepare(model, next(iter(table.model.parameters())).device, channels_last)




@dataclass
class NetworkResult:
    """One measured network: its plan, the table's raw and corrected predictions, and the measurement."""

    label: str
    plan: dict[str, Any]
    predicted_raw_ms: float
    predicted_ms: float
    measured_ms: float
    iqr_ms: float
    rel_uncertainty: float
    n_runs: int

    predicted_anchored_ms: float = float("nan")

    def error(self, corrected: bool = True) -> float:
        """Signed relative prediction error (predicted / measured - 1)."""
        return (self.predicted_ms if corrected else self.predicted_raw_ms) / self.measured_ms - 1.0

    def anchored_error(self) -> float:
        """Signed error of the prediction anchored to the original measured in the same session: the error of the
        predicted speed-up over the original, free of the machine's drift since the table was built."""
        return self.predicted_anchored_ms / self.measured_ms - 1.0


@dataclass
class PredictionError:
    """Measured networks (the original first) with the noise floor of the measurement."""

    results: list[NetworkResult]
    noise_floor: float
    time_s: float
    correction: Correction = field(default_factory=Correction)
    loo_error: float | None = None

    def errors(self, corrected: bool = True, include_original: bool = False) -> list[float]:
        chosen = self.results if include_original else self.results[1:]
        return [abs(r.error(corrected)) for r in chosen]

    def anchored_errors(self) -> list[float]:
        return [abs(r.anchored_error()) for r in self.results[1:]]

    @property
    def drift(self) -> float:
        """The table's raw prediction of the original over its measurement now, minus 1: how much the machine's
        speed (and the table) moved between the build and this measurement."""
        return self.results[0].error(False)

    def mean_error(self, corrected: bool = True, include_original: bool = False) -> float:
        errors = self.errors(corrected, include_original)
        return statistics.fmean(errors) if errors else float("nan")

    def max_error(self, corrected: bool = True, include_original: bool = False) -> float:
        return max(self.errors(corrected, include_original), default=float("nan"))

    def summary(self) -> dict[str, Any]:
        return {"n_plans": len(self.results) - 1, "noise_floor": self.noise_floor,
                "mean_abs_error_raw": self.mean_error(False), "max_abs_error_raw": self.max_error(False),
                "mean_abs_error": self.mean_error(True), "max_abs_error": self.max_error(True),
                "original_error_raw": abs(self.results[0].error(False)), "drift": self.drift,
                "mean_abs_error_anchored": statistics.fmean(self.anchored_errors()) if self.anchored_errors()
                else float("nan"), "max_abs_error_anchored": max(self.anchored_errors(), default=float("nan")),
                "loo_error": self.loo_error,
                "correction": asdict(self.correction), "time_s": self.time_s}

    def format(self) -> str:
        lines = [f"{'network':<10} {'removed':>7} {'measured ms':>12} {'IQR':>8} {'pred raw':>9} {'err raw':>8} "
                 f"{'pred':>9} {'err':>7}"]
        for r in self.results:
            lines.append(f"{r.label:<10} {len(r.plan.get('remove', [])):>7} {r.measured_ms:>12.3f} {r.iqr_ms:>8.3f} "
                         f"{r.predicted_raw_ms:>9.3f} {r.error(False):>+8.1%} {r.predicted_ms:>9.3f} "
                         f"{r.error(True):>+7.1%}")
        anchored = self.anchored_errors()
        lines.append(
            f"prediction error over {len(self.results) - 1} random plans: mean {self.mean_error(False):.1%} / max "
            f"{self.max_error(False):.1%} raw, mean {self.mean_error(True):.1%} / max {self.max_error(True):.1%} "
            f"with correction '{self.correction.kind}'; noise floor (original measured twice) {self.noise_floor:.1%}"
        )
        if anchored:
            lines.append(f"anchored to the original measured now (the speed-up error): mean "
                         f"{statistics.fmean(anchored):.1%} / max {max(anchored):.1%}; the raw prediction of the "
                         f"original is {self.drift:+.1%} off its measurement now (machine drift since the build)")
        return "\n".join(lines)


def random_plans(segs: Sequence[Segment], n: int, seed: int = 0, fraction: tuple[float, float] = (0.1, 0.5),
                 merge: bool = True) -> list[dict[str, Any]]:
    """`n` random plans: each removable segment and each mergeable act removed with a per-plan probability."""
    rng = random.Random(seed)
    plans = []
    for _ in range(n):
        p = rng.uniform(*fraction)
        remove: list[str] = []
        for seg in segs:
            if seg.removable and rng.random() < p:
                remove.append(seg.name)
            else:
                remove += [a for a in seg.acts if rng.random() < p]
        plans.append({"remove": remove, "merge": merge})
    return plans


def prediction_error(table: LatencyTable, plans: Sequence[Mapping[str, Any]],
                     settings: NetworkTimingSettings | None = None) -> PredictionError:
    """Measure the original (twice, for the noise floor) and each plan's network; compare with predictions."""
    settings = settings or NetworkTimingSettings()
    start = time.perf_counter()
    nets = [pruned_network(table, plan) for plan in plans]
    half = len(nets) // 2
    base_net = pruned_network(table, {"remove": [], "merge": table.merge})
    order = [base_net, *nets[:half], base_net, *nets[half:]]  # A ... A' ...: the noise-floor pair
    labels = ["original", *(f"plan {i}" for i in range(half)), "original", *(f"plan {i}" for i in range(half,
                                                                                                         len(nets)))]
    benches = time_networks(order, table.example, table.forward_kwargs, table, settings, labels)
    original, again = benches[0], benches[half + 1]
    plan_benches = benches[1:half + 1] + benches[half + 2:]
    estimate = f"{table.settings.estimator}_ms"
    a, b = original.summary()[estimate], again.summary()[estimate]
    pooled = Bench(table.model)
    pooled.times_ms = original.times_ms + again.times_ms
    results = [_result("original", {"remove": [], "merge": table.merge}, table, pooled)]
    results += [_result(f"plan {i}", dict(plan), table, bench) for i, (plan, bench) in enumerate(zip(plans,
                                                                                                      plan_benches))]
    anchor = results[0].measured_ms / results[0].predicted_raw_ms
    for r in results:
        r.predicted_anchored_ms = r.predicted_raw_ms * anchor
    return PredictionError(results, abs(a - b) / ((a + b) / 2), time.perf_counter() - start, table.correction)


def _result(label: str, plan: dict[str, Any], table: LatencyTable, bench: Bench) -> NetworkResult:
    stats = bench.summary()
    return NetworkResult(label, plan, table.predict(plan, corrected=False), table.predict(plan),
                         stats[f"{table.settings.estimator}_ms"], stats["iqr_ms"], stats["rel_uncertainty"],
                         len(bench.times_ms))


def correct(table: LatencyTable, n_plans: int = 5, seed: int = 0, settings: NetworkTimingSettings | None = None,
            fit: bool = True) -> PredictionError:
    """Measure the prediction error over `n_plans` random plans; with `fit`, set ``table.correction`` to the best
    correction. The result is kept as ``table.measured_error``.

    The result's corrected errors are in-sample; ``loo_error`` is the honest out-of-sample one.
    """
    if table.model is None:
        raise ValueError("This table has no model attached (it was not built in this process); rebuild it.")
    error = prediction_error(table, random_plans(table.segments, n_plans, seed, merge=table.merge), settings)
    if fit:
        predicted = [r.predicted_raw_ms for r in error.results]
        measured = [r.measured_ms for r in error.results]
        table.correction, error.loo_error = fit_correction(predicted, measured, error.noise_floor)
        error.correction = table.correction
        for r in error.results:
            r.predicted_ms = table.predict(r.plan)
    table.measured_error = error
    return error


__all__ = ["NetworkResult", "PredictionError", "correct", "prediction_error", "pruned_network", "random_plans",
    "time_interleaved", "time_networks"]
