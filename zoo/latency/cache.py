"""The on-disk latency cache: one JSON file per measurement condition, its records (under the file's ``entries``)
keyed by record key (:func:`~zoo.latency.settings.record_key`).

A condition is (device name, torch version, dtype, batch size, input size, layout, threads, workload, timing
protocol, clock, form, runtime, host allocator). Writers
take a file lock, re-read the file, merge their records and atomically replace it (temp file + ``os.replace``), so
concurrent jobs (Hydra multirun) never lose or corrupt records and readers never see a partial file. Files are
sealed with a SHA-256 of their content; a corrupt, truncated, foreign or stale file is reported with a
:class:`LatencyCacheWarning`, ignored (its records are re-measured) and replaced on the next write.
:func:`device_lock` keeps two processes from timing on one device at the same moment.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from ..errors import CorruptFileError, LatencyCacheWarning, LatencyDeviceError
from ..files import SEAL_KEY, json_digest, read_sealed_json, write_sealed_json

CACHE_FORMAT = 2  # 2: sealed with a checksum of the content; 1 (no checksum) is still read and upgraded on write
logger = logging.getLogger("zoo.latency")
CACHE_ENV = "DEPTHZOO_CACHE"
LOCK_TIMEOUT_S = 120.0


def cache_root() -> Path:
    """``$DEPTHZOO_CACHE`` if the variable is set, else ``~/.cache/depthzoo``."""
    root = os.environ.get(CACHE_ENV)
    return Path(root).expanduser() if root else Path.home() / ".cache" / "depthzoo"


def default_cache_dir() -> Path:
    """``<cache root>/latency``: where latency tables are cached unless a cache_dir is given."""
    return cache_root() / "latency"


_DEVICE_LOCKS: dict[str, FileLock] = {}


@contextmanager
def device_lock(device: Any) -> Iterator[None]:
    """Hold this machine's timing lock for `device` (a file lock under the cache root): two processes never time
    on one device at the same moment. Re-entrant within a process; waits, with a log line, while another holds it."""
    from .device import device_name

    name = _slug(device_name(device)) or "device"
    path = cache_root() / "locks" / f"timing-{name}.lock"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LatencyDeviceError(f"Cannot create the timing lock folder {path.parent} ({exc.strerror}); set "
                                 f"${CACHE_ENV} to a folder you can write to.") from None
    lock = _DEVICE_LOCKS.setdefault(str(path), FileLock(str(path)))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        logger.info("waiting for %s: another process is timing on this device", path)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-")[:40]


def _valid_record(record: Any) -> bool:
    if not isinstance(record, dict):
        return False
    values = [record.get(name) for name in ("median_ms", "p10_ms", "min_ms")]
    return all(isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in values)


class LatencyCache:
    """Records measured under one condition (`key`), stored in ``<cache_dir>/<readable-name>-<hash>.json``."""

    def __init__(self, key: dict[str, Any], cache_dir: str | Path | None = None):
        self.key = json.loads(json.dumps(key, sort_keys=True))  # as it reads back from JSON (tuples -> lists)
        self.dir = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        digest = json_digest(self.key)
        parts = [self.key.get("device_name", "device"), self.key.get("dtype", ""), f"b{self.key.get('batch_size')}",
                 "x".join(map(str, self.key.get("input_size") or ())), self.key.get("layout", "")]
        self.path = self.dir / f"{'_'.join(_slug(str(p)) for p in parts if p)}-{digest}.json"
        self.lock = FileLock(str(self.path) + ".lock", timeout=LOCK_TIMEOUT_S)

    def load(self) -> dict[str, dict[str, Any]]:
        """The valid records on disk ({} if none); a corrupt, foreign or stale file warns and counts as empty."""
        if not self.path.exists():
            return {}
        try:
            data = json.loads(self.path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            return self._unusable(f"it is not readable JSON ({type(exc).__name__}: {exc})")
        if isinstance(data, dict) and SEAL_KEY in data:
            try:
                data = read_sealed_json(self.path)
            except CorruptFileError:
                return self._unusable("its content does not match its checksum (truncated, edited or corrupted)")
        elif isinstance(data, dict) and data.get("format") != 1:
            return self._unusable("it has no checksum")
        if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
            return self._unusable("it has no 'entries' mapping")
        if data.get("format") not in (1, CACHE_FORMAT) or data.get("key") != self.key:
            return self._unusable(f"it is stale (format {data.get('format')!r}, or written for another condition)")
        records = {k: v for k, v in data["entries"].items() if _valid_record(v)}
        if len(records) < len(data["entries"]):
            warnings.warn(f"Latency cache {self.path}: {len(data['entries']) - len(records)} malformed entries "
                          "ignored; they will be measured again.", LatencyCacheWarning, stacklevel=3)
        return records

    def _unusable(self, why: str) -> dict[str, dict[str, Any]]:
        warnings.warn(f"Latency cache file {self.path} is ignored because {why}; its entries will be measured "
                      "again and the file replaced.", LatencyCacheWarning, stacklevel=4)
        return {}

    def merge_write(self, new_records: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """Under the file lock: re-read, add `new_records`, atomically replace the file. Returns all records."""
        self.dir.mkdir(parents=True, exist_ok=True)
        with self.lock:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", LatencyCacheWarning)  # already reported by the reader
                records = self.load()
            records.update(new_records)
            write_sealed_json(self.path, {"format": CACHE_FORMAT, "key": self.key, "entries": records})
        return records
