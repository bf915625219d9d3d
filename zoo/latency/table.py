"""The correction a table may carry: ``corrected = scale * raw + offset_ms`` for a whole-network prediction, and its
fit to measured networks by leave-one-out error (:func:`fit_correction`).

Latency lookup tables: one record per (segment signature, variant), plus the parts never removed.

The prediction for a plan is ``fixed + sum over segments of cost(segment, variant chosen by the plan)``, where

* a segment (:func:`zoo.pruning.surgery.segments`) is measured for every variant it has
  (:meth:`~zoo.pruning.surgery.Segment.variants`, rebuilt with :func:`~zoo.pruning.surgery.build_segment`), on the
  very inputs it
  receives inside the network (captured with one hooked forward at the table's batch and input size), on the
  table's device, dtype and layout; removing the whole segment costs 0;
* timed alone, ``cost = max(0, record - call overhead)``: every isolated measurement also contains one module call
  and the timer, measured once as an ``nn.Identity`` call (in context the call-overhead record is 0);
* ``fixed`` is the network with each segment replaced by a module that replays the segment's captured output:
  stem, head and all glue between segments, with real shapes; in a runtime other than eager (``runtime=compile``,
  ``onnxruntime``, ``tensorrt`` and their ``_int8`` forms: :mod:`zoo.latency.runtime`) each record's module is
  compiled or exported on its own, timed chained after the previous segment (less that segment alone: the runtime's
  layout conversions at the edges cancel, :func:`~zoo.latency.build.chains_after_previous`), and the fixed part is
  the whole network, timed in the runtime, less its intact segments (a compiler folds a replay).

Identical segments (same architecture, inputs and variant) share one cache record across models and runs; see
:mod:`zoo.latency.cache`. :func:`~zoo.latency.accuracy.correct` may fit a correction ``scale * raw + offset``
(:class:`~zoo.latency.table.Correction`) that :meth:`~LatencyTable.predict` and
:meth:`~LatencyTable.segment_costs` apply. Tables are built by :func:`~zoo.latency.build.build_table`.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from torch import nn

from ..errors import PlanError
from ..pruning.surgery import Segment
from .settings import TableSettings


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




def variant_label(segment: Segment, variant: frozenset[str]) -> str:
    if not variant:
        return "-"
    if segment.name in variant:
        return "removed"
    return "+".join(sorted(name[len(segment.name) + 1:] for name in variant))


@dataclass
class LatencyTable:
    """A built table: per-segment variant costs and the fixed part, for one model and condition.

    ``segments`` is aligned with :func:`zoo.pruning.surgery.segments` of the model; ``keys[i][variant]`` is the cache
    key of segment i's variant (None for the removed segment, which costs 0); ``records`` holds the stats.
    """

    model_name: str
    condition: dict[str, Any]
    segments: list[Segment]
    keys: list[dict[frozenset[str], str | None]]
    records: dict[str, dict[str, Any]]
    fixed_key: str
    overhead_key: str
    n_measured: int
    n_cached: int
    build_s: float
    sources: dict[str, str] = field(default_factory=dict)
    correction: Correction = field(default_factory=Correction)
    measured_error: Any = None  # the last :class:`~zoo.latency.accuracy.PredictionError` measured for this table
    model: nn.Module | None = field(default=None, repr=False)
    example: Any = field(default=None, repr=False)
    forward_kwargs: dict[str, Any] = field(default_factory=dict, repr=False)
    merge: bool = True
    settings: TableSettings = field(default_factory=TableSettings)
    timing_probe: dict[str, Any] = field(default_factory=dict)  # cuda_timing="auto": what decided the protocol
    prefix_keys: list[str | None] = field(default_factory=list)  # per segment: the prefix its records are timed after

    # -- costs -----------------------------------------------------------------------------------------------

    def value(self, key: str) -> float:
        """The record's time (ms) under the table's estimator (``settings.estimator``)."""
        return self.records[key][f"{self.settings.estimator}_ms"]

    @property
    def runtime_build_s(self) -> float:
        """What compiling or exporting the records measured for this table cost (0 in eager), in seconds."""
        return sum(self.records[k].get("runtime_build_s", 0.0) for k in {*self.records} if self.sources.get(k)
                   == "measured")

    @property
    def overhead_ms(self) -> float:
        return self.value(self.overhead_key)

    @property
    def fixed_raw_ms(self) -> float:
        return self.value(self.fixed_key)

    @property
    def n_records(self) -> int:
        """Distinct measured records this table uses (shared segments count once), fixed part and overhead included."""
        return len({k for keys in self.keys for k in keys.values() if k is not None}
                   | {k for k in self.prefix_keys if k is not None} | {self.fixed_key, self.overhead_key})

    def raw_cost(self, index: int, variant: frozenset[str]) -> float:
        """Uncorrected cost (ms) of segment `index` in `variant`: record minus call overhead (a chained record: minus
        its prefix alone), 0 when removed."""
        key = self.keys[index][variant]
        if key is None:
            return 0.0
        prefix = self.prefix_keys[index] if self.prefix_keys else None
        return max(0.0, self.value(key) - (self.value(prefix) if prefix else self.overhead_ms))

    def fixed_cost(self, corrected: bool = True) -> float:
        """The part of every prediction that no plan changes (the correction's offset included)."""
        return self.correction.apply(self.fixed_raw_ms) if corrected else self.fixed_raw_ms

    def segment_costs(self, corrected: bool = True) -> list[list[tuple[frozenset[str], float]]]:
        """Per segment (aligned with ``segments``), every variant with its cost in ms.

        ``predict(plan) == fixed_cost() + sum of the chosen variants' costs``; with `corrected` the costs are
        scaled by the fitted correction (its offset lives in :meth:`fixed_cost`).
        """
        scale = self.correction.scale if corrected else 1.0
        return [[(variant, scale * self.raw_cost(i, variant)) for variant in seg.variants()]
                for i, seg in enumerate(self.segments)]

    def variants_of(self, plan: Mapping[str, Any]) -> list[frozenset[str]]:
        """The variant each segment takes under `plan` (a plain-data plan, see :mod:`zoo.surgery`)."""
        if not isinstance(plan, Mapping):
            raise PlanError(f"A plan is a mapping {{'remove': [unit names], 'merge': bool}}; got {plan!r}.")
        removed = set(plan.get("remove", []))
        if bool(plan.get("merge", True)) != self.merge:
            raise PlanError(f"This table was built for merge={self.merge}; the plan has merge={plan.get('merge')}.")
        known = {name for seg in self.segments for name in (seg.name, *seg.acts)}
        unknown = sorted(removed - known)
        if unknown:
            raise PlanError(f"Unit(s) {unknown[:5]} are not removable units of {self.model_name}'s segments; "
                            f"known units are segment names and their mergeable activations.")
        variants = []
        for seg in self.segments:
            if seg.name in removed:
                if not seg.removable:
                    raise PlanError(f"Segment {seg.name!r} cannot be removed (its shortcut changes shapes).")
                variants.append(frozenset({seg.name}))
            else:
                variants.append(seg.variant_of(removed))
        return variants

    def predict(self, plan: Mapping[str, Any] | None = None, corrected: bool = True) -> float:
        """Predicted end-to-end latency (ms) of the network after `plan` (None or {} = the original)."""
        variants = self.variants_of(plan or {})
        raw = self.fixed_raw_ms + sum(self.raw_cost(i, v) for i, v in enumerate(variants))
        return self.correction.apply(raw) if corrected else raw

    def predict_memory(self, plan: Mapping[str, Any] | None = None) -> int | None:
        """Predicted peak activation memory (bytes): the largest of the fixed part's and the chosen records'."""
        keys = [self.fixed_key] + [self.keys[i][v] for i, v in enumerate(self.variants_of(plan or {}))]
        values = [self.records[k].get("peak_mem_bytes") for k in keys if k is not None]
        return max((v for v in values if v is not None), default=None)

    # -- reporting -----------------------------------------------------------------------------------------

    def rows(self) -> list[dict[str, Any]]:
        """One row per (segment, variant): label, cost, record median, IQR, runs and where it came from."""
        rows = []
        for i, seg in enumerate(self.segments):
            intact = self.raw_cost(i, frozenset())
            for variant in seg.variants():
                key = self.keys[i][variant]
                rec = self.records.get(key, {}) if key else {}
                cost = self.raw_cost(i, variant)
                rows.append({"segment": seg.name, "variant": variant_label(seg, variant), "cost_ms": cost,
                             "median_ms": rec.get("median_ms", 0.0), "iqr_ms": rec.get("iqr_ms", 0.0),
                             "n_runs": rec.get("n_runs", 0), "cap_hit": rec.get("cap_hit", False),
                             "slower": bool(variant) and cost > intact,
                             "source": self.sources.get(key, "structural") if key else "structural"})
        return rows

    def summary(self) -> dict[str, Any]:
        return {"model": self.model_name, **self.condition, "entries": self.n_records,
                "measured_now": self.n_measured, "from_cache": self.n_cached, "build_s": self.build_s,
                "fixed_ms": self.fixed_raw_ms, "overhead_ms": self.overhead_ms,
                "predicted_original_ms": self.predict(corrected=False), "correction": asdict(self.correction),
                "timing_probe": self.timing_probe, "runtime_build_s": self.runtime_build_s}

    def describe_condition(self) -> str:
        c = self.condition
        size = "x".join(map(str, c["input_size"]))
        return (f"{c['device_name']} [{c['dtype']}, batch {c['batch_size']}, input {size}, {c['layout']}, "
                f"{c['threads']} thread(s), torch {c['torch']}, runtime {c.get('runtime', 'eager')}]")

    def format(self) -> str:
        """The table as aligned text: one line per (segment, variant), then the fixed part and totals."""
        lines = [f"{'segment':<24} {'variant':<24} {'cost ms':>9} {'median ms':>10} {'IQR ms':>8} {'runs':>6}  source",
                 "-" * 96]
        rows = self.rows()
        for r in rows:
            cap = " (cap)" if r["cap_hit"] else ""
            lines.append(f"{r['segment']:<24} {r['variant']:<24} {r['cost_ms']:>9.4f} {r['median_ms']:>10.4f} "
                         f"{r['iqr_ms']:>8.4f} {r['n_runs']:>6}  {r['source']}{cap}{' *' if r['slower'] else ''}")
        fixed, corr = self.records[self.fixed_key], self.correction
        if any(r["slower"] for r in rows):
            lines.append("* costs more than the intact block: merging convs makes one larger kernel (k1 + k2 - 1 wide, "
                         "and dense unless every part was depthwise), which can be slower than the chain it replaces; "
                         "the search takes such a variant only where it pays.")
        lines += ["-" * 96,
                  f"fixed part (stem, head, glue): {self.fixed_raw_ms:.4f} ms (IQR {fixed['iqr_ms']:.4f}); "
                  + ("entries timed inside the running network; " if self.settings.entries == "context" else
                     f"entries timed alone, call overhead subtracted per entry: {self.overhead_ms * 1e3:.1f} us; ")
                  + f"costs use the {self.settings.estimator} of {self.settings.clock}-clock runs",
                  f"predicted original: {self.predict(corrected=False):.3f} ms raw, {self.predict():.3f} ms "
                  f"corrected ({corr.kind}: scale {corr.scale:.4f}, offset {corr.offset_ms:.4f} ms)",
                  f"{self.model_name} on {self.describe_condition()}: {self.n_records} entries, {self.n_measured} "
                  f"measured now, {self.n_cached} from cache, built in {self.build_s:.1f} s"]
        return "\n".join(lines)


__all__ = ["Correction", "LatencyTable", "fit_correction", "variant_label"]
