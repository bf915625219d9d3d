"""Run identity: which config produced a run directory's results, and when a directory may be reused.

Every run directory (``train.py``, ``prune.py``, a cached baseline) holds ``run.json``: the kind of run and a
**fingerprint** of the resolved config keys that determine its results (:func:`determining` drops output paths,
logging and other keys that do not change what is computed; :data:`NON_DETERMINING` lists them). A directory is
reused only by a run with the same fingerprint: a finished prune job is skipped, an interrupted one resumes, and
``trainer.resume=auto`` continues training. Anything else is refused with a :class:`~zoo.errors.RunConflictError`
naming the keys that differ, and the directory is left exactly as it was; ``force`` discards its results first.
While a run works in a directory it holds ``.run.lock``, so two processes never share one.

Nothing here imports Hydra; :mod:`zoo.jobs.cli` ties it to the entry points.
"""

from __future__ import annotations

import copy
import logging
import os
import shutil
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from ..errors import CorruptFileError, RunConflictError
from ..files import file_digest, json_digest, read_sealed_json, write_sealed_json

_log = logging.getLogger(__name__)

RUN_FILE = "run.json"
LOCK_FILE = ".run.lock"

# Where a run writes, how it logs and how it was asked to reuse a directory: never part of a run's identity, and
# left out of multirun job directory names (so a re-run with logger=none or prune.force=true finds its jobs).
LOCATION_AND_REUSE = ("paths", "logger", "hydra", "task_name", "tags", "trainer.resume", "trainer.force",
                      "prune.force", "prune.cache_dir")
# Dotted config keys that never change what a run computes. Everything else in the resolved config is part of the
# fingerprint, and so are the contents of the files it names (:func:`with_inputs`).
NON_DETERMINING = (*LOCATION_AND_REUSE, "trainer.progress", "trainer.log_every", "trainer.save_checkpoints",
                   "data.num_workers", "data.download", "prune.objectives")
# The files and folders each kind of run leaves in its directory: what a conflict protects and what force removes.
OUTPUTS = {
    "train": ("results.json", "checkpoints"),
    "prune": ("results.json", "plan.json", "finetune", "pruned.safetensors", "pruned.onnx", "pruned.pt2", "hf",
              "README.md", "latency_table.json", "pruned_int8.onnx", "pruned_int8.pt2", "qat"),
    "baseline": ("checkpoints", "trained.json"),
}
ALL_OUTPUTS = tuple(dict.fromkeys(name for names in OUTPUTS.values() for name in names))
FILE_KEYS = ("checkpoint", "prune.plan", "model.pretrained", "data.files", "data.tokenizer", "model.name")  # name
FOLDER_KEYS = ("checkpoint", "model.pretrained", "data.tokenizer", "model.name")  # input files; may name a folder
FULL_DIGEST_BYTES = 256 * 2**20  # files up to this size are hashed; larger ones are identified by size and mtime


def _drop(config: dict[str, Any], dotted: str) -> None:
    *parents, leaf = dotted.split(".")
    node: Any = config
    for key in parents:
        node = node.get(key) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(leaf, None)


def determining(config: dict[str, Any]) -> dict[str, Any]:
    """The part of a resolved config that determines a run's results (a copy without :data:`NON_DETERMINING`)."""
    kept = copy.deepcopy(config)
    for key in NON_DETERMINING:
        _drop(kept, key)
    return kept


def names_a_job(key: str) -> bool:
    """Whether an override of the dotted `key` (or config group `key`) belongs in a multirun job's directory name:
    every key but the run's location, logging and reuse switches (:data:`LOCATION_AND_REUSE`)."""
    return not any(key == k or key.startswith(k + ".") for k in LOCATION_AND_REUSE)


def _file_identity(path: Path) -> str:
    stat = path.stat()
    if stat.st_size <= FULL_DIGEST_BYTES:
        return "sha256:" + file_digest(path)
    return f"size:{stat.st_size}:mtime:{stat.st_mtime_ns}"


def with_inputs(config: dict[str, Any]) -> dict[str, Any]:
    """`config` plus ``inputs``: the identity of every local file it names (a checkpoint, a plan, pretrained weights,
    text files, the files of a model or tokenizer folder): the same path with other contents is another config. Image
    folders count by path only."""
    import glob

    inputs = {}
    for key in FILE_KEYS:
        value = flatten(config).get(key)
        if key == "model.name":  # a transformers model folder (hf/<folder>: model=hf); other names are no files
            value = value.removeprefix("hf/") if isinstance(value, str) and value.startswith("hf/") else None
        patterns = value if isinstance(value, list) else [value]
        for pattern in patterns:
            if not isinstance(pattern, str) or not pattern:
                continue
            for name in sorted(glob.glob(str(Path(pattern).expanduser()), recursive=True)):
                files = sorted(Path(name).iterdir()) if key in FOLDER_KEYS and Path(name).is_dir() else [Path(name)]
                for file in files:
                    if file.is_file():
                        inputs[f"{key}:{file.resolve()}"] = _file_identity(file)
    return {**config, "inputs": inputs}


def fingerprint(config: dict[str, Any]) -> str:
    """A stable hash of the determining part of a resolved config."""
    return json_digest(determining(config), 16)


SEED_KEYS = ("trainer.seed", "prune.seed")  # what a study repeats a config over


def study_group(config: dict[str, Any]) -> str:
    """A hash of the determining config without its seeds: the jobs of a study that repeat one config over seeds
    share it (``python -m zoo report`` gives their mean and spread)."""
    kept = determining(config)
    for key in SEED_KEYS:
        _drop(kept, key)
    return json_digest(kept, 16)


def flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a.b": value}`` for every leaf of nested dicts (lists are leaves)."""
    if not isinstance(config, dict):
        return {prefix: config}
    flat: dict[str, Any] = {}
    for key, value in config.items():
        flat.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def same_run_config(recorded: dict[str, Any], ours: dict[str, Any]) -> bool:
    """Whether a config recorded by an earlier version (a training state's ``config``) describes this config: every
    determining key it has holds the same value now; keys a newer version added (``inputs`` included) are not
    compared."""
    old, new = flatten(determining(recorded)), flatten(determining(ours))
    return all(new.get(key, "<unset>") == value for key, value in old.items())


def describe_differences(old: dict[str, Any], new: dict[str, Any], limit: int = 4) -> str:
    """``key: old -> new`` for the first keys where two determining configs differ."""
    a, b = flatten(old), flatten(new)
    changed = sorted(k for k in a.keys() & b.keys() if a[k] != b[k])
    keys = changed + sorted(a.keys() ^ b.keys())  # values that changed first, then keys only one side has
    parts = [f"{k}: {a.get(k, '<unset>')!r} -> {b.get(k, '<unset>')!r}" for k in keys[:limit]]
    more = f" and {len(keys) - limit} more" if len(keys) > limit else ""
    return "; ".join(parts) + more if parts else "no key differs, but the recorded fingerprint does"


# ---------------------------------------------------------------------------------------------- run records


def read_record(directory: str | Path) -> dict[str, Any] | None:
    """The run record of a directory, None if it has none; raises CorruptFileError if it is not intact."""
    path = Path(directory) / RUN_FILE
    return read_sealed_json(path) if path.exists() else None


def write_record(directory: str | Path, kind: str, config: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """Record that `directory` holds a `kind` run of `config` (its determining part and fingerprint)."""
    record = {"kind": kind, "fingerprint": fingerprint(config), "config": determining(config),
              "created": time.strftime("%Y-%m-%dT%H:%M:%S"), **extra}
    write_sealed_json(Path(directory) / RUN_FILE, record)
    return record


@dataclass
class Claim:
    """A run directory this process may work in. state: ``fresh``, ``resume`` (same config, unfinished) or
    ``finished`` (same config, results present)."""

    directory: Path
    state: str
    record: dict[str, Any]
    lock: FileLock | None = None

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None


def existing_outputs(directory: Path, outputs: Sequence[str] = ALL_OUTPUTS) -> list[str]:
    return [name for name in outputs if (directory / name).exists()]


def clear_outputs(directory: Path, outputs: Sequence[str]) -> None:
    """Delete a run's outputs (files or folders) from `directory` (``force``)."""
    for name in (*outputs, RUN_FILE):
        path = directory / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def check_reuse(directory: str | Path, kind: str, config: dict[str, Any], *, finished: str | None = None,
                new_only: bool = False, force_hint: str = "force=true", dir_hint: str = "a new directory") -> str:
    """Read-only: what this run may do in `directory` (``fresh``, ``resume``, ``finished``) or a RunConflictError.

    A directory without the outputs of any run (:data:`OUTPUTS`) is fresh, whatever its ``run.json`` says (a run that
    stopped before writing anything protects nothing). `finished`: the output that marks a run of this kind complete
    (None: the kind is never skipped); `new_only`: an earlier run of the same config is a conflict too (train.py
    without resume).
    """
    directory = Path(directory)
    present = existing_outputs(directory, ALL_OUTPUTS)
    if not present:
        return "fresh"
    try:
        record = read_record(directory)
    except CorruptFileError as exc:
        raise RunConflictError(f"{directory} holds a damaged run record ({exc}). Its files are kept: use "
                               f"{dir_hint}, or {force_hint} to discard them and start over.") from None
    if record is None:
        raise RunConflictError(
            f"{directory} holds {', '.join(present)} of a run with no recorded config (an earlier depthzoo "
            f"version or files put there by hand), so they cannot be matched to this config. They are kept: "
            f"use {dir_hint}, or {force_hint} to discard them.")
    ours = fingerprint(config)
    if record.get("kind") != kind or record.get("fingerprint") != ours:
        what = record.get("kind", "unknown")
        diff = describe_differences(record.get("config", {}), determining(config)) if what == kind else \
            f"it is a {what} run, this is a {kind} run"
        raise RunConflictError(
            f"{directory} holds a {what} run of another config ({diff}). Its results are kept: use {dir_hint}, "
            f"or {force_hint} to discard them and start over.")
    if new_only:
        raise RunConflictError(
            f"{directory} already holds a {kind} run of this config. Continue it with trainer.resume=auto, start "
            f"over with {force_hint}, or use {dir_hint}.")
    if finished and (directory / finished).exists():
        if _intact(directory / finished, record["fingerprint"]):
            return "finished"
        _log.warning("%s is damaged or belongs to another run: the run continues as if it had not finished",
                     directory / finished)
    return "resume"


def _intact(path: Path, expected_fingerprint: str) -> bool:
    """Whether a sealed results file is intact and records the expected fingerprint."""
    try:
        return read_sealed_json(path).get("fingerprint") == expected_fingerprint
    except CorruptFileError:
        return False


def claim(directory: str | Path, kind: str, config: dict[str, Any], *, finished: str | None = None,
          new_only: bool = False, force: bool = False, force_hint: str = "force=true",
          dir_hint: str = "a new directory") -> Claim:
    """Take `directory` for a `kind` run of `config`: check it (see :func:`check_reuse`), lock it, record it.

    Nothing is written when the run is refused. With `force` the outputs of whatever run the directory held are
    deleted first. A ``finished`` claim holds no lock and writes nothing (the caller reports the existing results).
    """
    directory = Path(directory)
    kwargs = {"finished": finished, "new_only": new_only, "force_hint": force_hint, "dir_hint": dir_hint}
    if not force:
        state = check_reuse(directory, kind, config, **kwargs)
        if state == "finished":
            return Claim(directory, state, read_record(directory) or {})
    directory.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(directory / LOCK_FILE), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise RunConflictError(f"Another process is running in {directory} (it holds {LOCK_FILE}). Wait for it "
                               f"to finish, or use {dir_hint}.") from None
    try:
        if force:
            present = existing_outputs(directory, ALL_OUTPUTS)
            if present:
                _log.warning("%s: discarding %s of an earlier run (force)", directory, ", ".join(present))
            clear_outputs(directory, ALL_OUTPUTS)
            state = "fresh"
        else:  # re-check under the lock: another process may have finished or claimed it in between
            state = check_reuse(directory, kind, config, **kwargs)
        record = read_record(directory) if state != "fresh" else None
        if record is None:
            record = write_record(directory, kind, config, pid=os.getpid())
    except BaseException:
        lock.release()
        raise
    return Claim(directory, state, record, lock)


@contextmanager
def claimed(directory: str | Path, kind: str, config: dict[str, Any], **kwargs: Any) -> Iterator[Claim]:
    """:func:`claim` as a context manager that releases the directory's lock at the end."""
    taken = claim(directory, kind, config, **kwargs)
    try:
        yield taken
    finally:
        taken.release()


@contextmanager
def claimed_by_main(directory: str | Path, kind: str, config: dict[str, Any], **kwargs: Any) -> Iterator[str]:
    """:func:`claimed` on rank 0 under torchrun (or in the one process); every rank gets its state (``fresh``,
    ``resume`` or ``finished``), or raises its refusal. The lock is released when the block ends."""
    from contextlib import ExitStack

    from ..errors import ZooError
    from ..training import distributed as dist_utils

    with ExitStack() as stack:
        state, refused = None, None
        if dist_utils.info().is_main:
            try:
                state = stack.enter_context(claimed(directory, kind, config, **kwargs)).state
            except ZooError as exc:
                refused = exc
        state, refusal = dist_utils.broadcast_object((state, None if refused is None else (type(refused),
                                                                                           str(refused))))
        if refused is not None:
            raise refused
        if refusal is not None:
            raise refusal[0](refusal[1])
        yield state


__all__ = ["NON_DETERMINING", "OUTPUTS", "Claim", "check_reuse", "claim", "claimed", "claimed_by_main",
           "clear_outputs",
           "describe_differences", "determining", "fingerprint", "flatten", "names_a_job", "read_record",
           "same_run_config", "with_inputs", "write_record"]
