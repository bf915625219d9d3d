"""Files that cannot lie: atomic writes, content digests, and JSON sealed with a checksum of its content.

Every file the project writes for later reuse (checkpoints, caches, run records, results) goes through
:func:`atomic_write`: the data goes to a temp file in the same folder, is fsynced, then renamed over the target,
so a reader sees the old file or the new one, never a partial one; a write that fails half-way (a full disk, a
kill) leaves the previous file intact. :func:`write_sealed_json` adds a SHA-256 of the payload, and
:func:`read_sealed_json` refuses a file whose payload does not match it (truncated, edited, or not ours).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import CorruptFileError

SEAL_KEY = "sha256"


def _file_mode() -> int:
    """The mode a plain ``open(path, "w")`` would give a new file under the current umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


FILE_MODE = _file_mode()


def json_digest(obj: Any, length: int = 12) -> str:
    """A short, stable hash of JSON-like data (keys sorted): names cache files and shared run directories."""
    return hashlib.sha1(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:length]


@functools.lru_cache(maxsize=64)  # a digest of code is taken on every cached build: parse each source once
def syntax_of(source: str) -> str:
    """The syntax tree of Python `source` without its docstrings, dumped: what a digest of code hashes (a docstring
    or comment edit leaves it as it was)."""

    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


def file_digest(path: str | Path) -> str:
    """SHA-256 of a file's bytes (hex), read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call `write(tmp_path)` then rename the temp file over `path`: readers never see a partial file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        write(tmp_path)
        os.chmod(tmp_path, FILE_MODE)  # mkstemp makes 0600 files; ours are as readable as others the user writes
        with open(tmp_path, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp_path, path)
    finally:
        tmp_path.unlink(missing_ok=True)
    return path


def write_json(path: str | Path, payload: Any) -> Path:
    """Write JSON atomically (indented, keys in insertion order)."""
    text = json.dumps(payload, indent=2, default=str)
    return atomic_write(path, lambda tmp: tmp.write_text(text))


def _seal(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def write_sealed_json(path: str | Path, payload: dict[str, Any]) -> Path:
    """Write `payload` atomically with a SHA-256 of its content under the key ``sha256``."""
    if SEAL_KEY in payload:
        raise ValueError(f"A sealed payload cannot hold the key {SEAL_KEY!r} itself.")
    plain = json.loads(json.dumps(payload, default=str))  # what reads back: tuples become lists
    return write_json(path, {**plain, SEAL_KEY: _seal(plain)})


def read_sealed_json(path: str | Path) -> dict[str, Any]:
    """The payload of a file written by :func:`write_sealed_json`; raises CorruptFileError if it is not intact."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptFileError(f"{path} is not readable JSON ({type(exc).__name__}: {exc}).") from None
    if not isinstance(data, dict) or SEAL_KEY not in data:
        raise CorruptFileError(f"{path} has no checksum: it was not written by this version of depthzoo.")
    stored = data.pop(SEAL_KEY)
    if stored != _seal(data):
        raise CorruptFileError(f"{path} does not match its checksum: it was truncated, edited or corrupted.")
    return data


def check_writable(folder: Any, key: str) -> None:
    """A folder the run will write into must be one (or be creatable) and take a file. The test writes and removes a
    file in the folder, or, where it does not exist yet, a folder in its nearest existing parent: nothing is left
    behind, and a folder that exists but cannot be written (read-only, immutable, full) is refused before any work
    rather than when the run first saves something (raises ConfigError naming `key`)."""
    from .errors import ConfigError

    path = Path(str(folder)).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{key}={folder} is a file, not a folder; give a folder you can write to.")
    parent = path
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"{key}={folder} cannot be created: {parent} is a file; give a folder you can write to.")
    try:
        if parent == path:
            with tempfile.NamedTemporaryFile(prefix=".depthzoo-write-check-", dir=path):
                pass
        else:
            tempfile.TemporaryDirectory(prefix=".depthzoo-write-check-", dir=parent).cleanup()
    except OSError as exc:
        raise ConfigError(f"{key}={folder} cannot be written ({exc.strerror} in {parent}); give a folder you can "
                          f"write to.") from None
