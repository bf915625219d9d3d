"""Latency measurement and lookup tables that predict the end-to-end latency of depth-pruned networks.

* :func:`measure` times any callable or module on a device (CPU or CUDA) with robust, adaptive statistics.
* :func:`build_table` builds (or loads from the cache) a model's :class:`LatencyTable`: per-segment variant costs
  whose sum predicts the latency of any plan (``table.predict(plan)``, ``table.segment_costs()``).
* :func:`prediction_error` measures given plans' networks end to end beside the original and reports the table's
  error against the noise floor; :func:`correct` (``correct(table, n_plans)``) does so for random plans and fits a
  :class:`Correction` when it helps.
* :func:`keep_freed_memory`: the host-allocator setting every timed run uses; serve inside it (or with the same
  glibc settings) to run at the latency a table predicts.

Imports only torch, timm, numpy, filelock and the standard library (``python -m zoo.latency`` adds omegaconf).
"""

from .accuracy import NetworkResult, PredictionError, correct, prediction_error, random_plans
from .build import build_table
from .cache import LatencyCache, LatencyCacheWarning, default_cache_dir
from .device import LatencyDeviceError, keep_freed_memory, resolve_device, resolve_dtype
from .measure import Bench, LatencyStats, MeasureSettings, measure
from .settings import NetworkTimingSettings, TableSettings
from .table import Correction, LatencyTable

__all__ = [
    "Bench", "Correction", "LatencyCache", "LatencyCacheWarning", "LatencyDeviceError", "LatencyStats", "LatencyTable",
    "MeasureSettings", "NetworkResult", "NetworkTimingSettings", "PredictionError", "TableSettings", "build_table",
    "correct", "default_cache_dir", "keep_freed_memory", "measure", "prediction_error", "random_plans",
    "resolve_device", "resolve_dtype",
]
