"""Latency measurement and lookup tables that predict the end-to-end latency of depth-pruned networks.

* :func:`measure` times any callable or module on a device (CPU or CUDA) with robust, adaptive statistics.
* :func:`build_table` builds (or loads from the cache) a model's :class:`LatencyTable`: per-segment variant costs
  whose sum predicts the latency of any plan (``table.predict(plan)``, ``table.segment_costs()``).
* :func:`calibrate` (``calibrate(table, n_plans)``) measures random pruned networks end to end, reports the
  prediction error beside the noise floor and fits a correction when it helps.
* :func:`keep_freed_memory`: the host-allocator setting every timed run uses; serve inside it (or with the same
  glibc settings) to run at the latency a table predicts.

Imports only torch, timm, numpy, filelock and the standard library (``python -m zoo.latency`` adds omegaconf).
"""

from .cache import LatencyCache, LatencyCacheWarning, default_cache_dir
from .calibrate import CalibrationSettings, Evaluation, NetworkResult, calibrate, evaluate, random_plans
from .device import LatencyDeviceError, keep_freed_memory, resolve_device, resolve_dtype
from .measure import Bench, LatencyStats, MeasureSettings, measure
from .table import Correction, LatencyTable, TableSettings, build_table

__all__ = [
    "Bench", "CalibrationSettings", "Correction", "Evaluation", "LatencyCache", "LatencyCacheWarning",
    "LatencyDeviceError", "LatencyStats", "LatencyTable", "MeasureSettings", "NetworkResult", "TableSettings",
    "build_table", "calibrate", "default_cache_dir", "evaluate", "keep_freed_memory", "measure", "random_plans",
    "resolve_device", "resolve_dtype",
]
