"""Read back an offline W&B run (``run-<id>.wandb``) in tests: history rows, summary, config, run info, artifacts.

The file is a LevelDB-style log: a 7-byte header (``:W&B`` + version), then 32 KiB blocks of records, each
framed by a CRC (uint32), a length (uint16) and a type (uint8: 1 full, 2 first, 3 middle, 4 last); the
fragments of one record concatenate to a serialised ``wandb_internal_pb2.Record``.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HEADER_SIZE = 7
BLOCK_SIZE = 32 * 1024
FRAME_SIZE = 7  # crc uint32 + length uint16 + type uint8
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


@dataclass
class WandbRun:
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    run: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None
    artifacts: list[dict[str, Any]] = field(default_factory=list)  # name, type, digest, metadata, files


def read_records(path: str | Path) -> list[bytes]:
    """The raw record payloads of a ``.wandb`` file, fragments joined."""
    data = Path(path).read_bytes()
    if not data.startswith(b":W&B"):
        raise ValueError(f"{path} is not a W&B run file (header {data[:7]!r}).")
    records, pending, pos = [], b"", HEADER_SIZE
    while pos + FRAME_SIZE <= len(data):
        block_left = BLOCK_SIZE - pos % BLOCK_SIZE
        if block_left < FRAME_SIZE:  # the block's tail is padding
            pos += block_left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + FRAME_SIZE])
        payload = data[pos + FRAME_SIZE:pos + FRAME_SIZE + length]
        pos += FRAME_SIZE + length
        if kind == 0 and length == 0:
            continue
        if kind == FULL:
            records.append(payload)
        elif kind == FIRST:
            pending = payload
        elif kind == MIDDLE:
            pending += payload
        elif kind == LAST:
            records.append(pending + payload)
            pending = b""
    return records


def _items(items: Any) -> dict[str, Any]:
    out = {}
    for item in items:
        key = "/".join(item.nested_key) if item.nested_key else item.key
        out[key] = json.loads(item.value_json)
    return out


def read_run(path: str | Path) -> WandbRun:
    """Parse a ``.wandb`` file (or the offline run directory holding one) into history/summary/config."""
    from wandb.proto import wandb_internal_pb2

    path = Path(path)
    if path.is_dir():
        path = next(path.glob("*.wandb"))
    run = WandbRun()
    for raw in read_records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            run.history.append(_items(record.history.item))
        elif kind == "summary":
            run.summary.update(_items(record.summary.update))
        elif kind == "config":
            run.config.update(_items(record.config.update))
        elif kind == "run":
            run.run = {"id": record.run.run_id, "project": record.run.project, "group": record.run.run_group,
                       "name": record.run.display_name, "tags": list(record.run.tags)}
            run.config.update(_items(record.run.config.update))
        elif kind == "exit":
            run.exit_code = record.exit.exit_code
        elif kind == "artifact":
            a = record.artifact
            run.artifacts.append({"name": a.name, "type": a.type, "digest": a.digest,
                                  "metadata": json.loads(a.metadata or "{}"),
                                  "files": [entry.path for entry in a.manifest.contents]})
    return run


def find_run_files(root: str | Path) -> list[Path]:
    """Every ``run-*.wandb`` file under `root` (offline runs live in ``wandb/offline-run-*``)."""
    return sorted(Path(root).rglob("run-*.wandb"))
