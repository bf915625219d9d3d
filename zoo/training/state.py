"""Training checkpoints: ``last`` and ``best`` weights (zoo safetensors) plus the resumable training state.

Layout of ``<run dir>/checkpoints/``:

- ``last.safetensors``, ``best.safetensors``: weights + metadata (model name, overrides, plan, epoch, step,
  metrics, resolved config), written by :func:`zoo.save_checkpoint`; load with ``zoo.load(path)`` or
  ``zoo.create_model(model_name_from_checkpoint(path), pretrained=path)``.
- ``last.state.pt``: everything a resume needs in one file (model weights again, optimizer, scheduler, grad
  scaler, EMA, epoch and position in it, step, best metric, RNG states, config). Self-contained so that a
  crash between two file writes can never pair weights and optimizer state of different steps.

Every file is written to a temp file and renamed over the old one, so a kill -9 during a save leaves the
previous checkpoint intact (plus a stale ``.*.tmp`` file, removed by :func:`remove_stale_temps`).

``last.state.pt`` is the commit point of an epoch, written after the weights. A new ``best`` is first written as
``best.pending.safetensors`` and renamed to ``best.safetensors`` only after the state that records it
(:func:`settle_best`), so a kill between the writes never leaves ``best`` a step behind or ahead of the state
that a resume continues from.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import CheckpointError
from ..weights.checkpoint import atomic_write, read_checkpoint_meta, save_checkpoint

STATE_FORMAT = 1
STATE_SUFFIX = ".state.pt"


def checkpoint_dir(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def remove_stale_temps(directory: str | Path) -> None:
    """Delete temp files left by a save that was killed (they are never read)."""
    for tmp in Path(directory).glob(".*.tmp"):
        tmp.unlink(missing_ok=True)


def model_name_from_checkpoint(path: str | Path) -> str:
    """The zoo model name recorded in a checkpoint (weights ``.safetensors`` or a ``.state.pt``)."""
    path = Path(path)
    if path.name.endswith(STATE_SUFFIX):
        return load_state(path)["model_name"]
    try:
        meta = read_checkpoint_meta(path)
    except Exception as exc:  # noqa: BLE001 - unreadable for whatever reason
        raise CheckpointError(f"Cannot read checkpoint {path}: {exc}") from exc
    if not meta or "model" not in meta:
        raise CheckpointError(f"{path} has no depthzoo metadata, so it names no model.")
    return meta["model"]


def rng_state() -> dict[str, Any]:
    """Python, NumPy and torch (CPU and CUDA) RNG states in a form ``torch.load(weights_only=True)`` reads."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached": float(cached)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np_state = state["numpy"]
    np.random.set_state((np_state["kind"], np_state["keys"].numpy().astype(np.uint32), np_state["pos"],
                         np_state["has_gauss"], np_state["cached"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_weights(model: torch.nn.Module, path: str | Path, **meta: Any) -> Path:
    """Weights + metadata, atomically (see :func:`zoo.save_checkpoint`)."""
    return save_checkpoint(model, path, **meta)


PENDING_BEST = "best.pending.safetensors"


def settle_best(directory: str | Path, best_epoch: int | None) -> None:
    """Finish or undo a ``best`` save that a kill interrupted: the pending weights become ``best.safetensors`` if the
    committed state records them as best (their epoch is its ``best_epoch``), and are dropped otherwise."""
    pending = Path(directory) / PENDING_BEST
    if not pending.exists():
        return
    try:
        epoch = (read_checkpoint_meta(pending) or {}).get("epoch")
    except Exception:  # noqa: BLE001 - a damaged pending file was never committed
        epoch = None
    if epoch is not None and epoch == best_epoch:
        pending.replace(pending.with_name("best.safetensors"))
    else:
        pending.unlink()


def save_state(state: dict[str, Any], path: str | Path) -> Path:
    """The resumable training state, atomically (``torch.save`` to a temp file, then rename)."""
    payload = {"format": STATE_FORMAT, **state}
    return atomic_write(path, lambda tmp: torch.save(payload, tmp))


def load_state(path: str | Path) -> dict[str, Any]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - truncated, foreign or missing: reported the same way
        raise CheckpointError(f"Cannot read training state {path}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT or "model_name" not in state:
        raise CheckpointError(f"{path} is not a depthzoo training state (written by zoo.training).")
    return state


def resolve_resume(resume: str | Path | None, output_dir: str | Path | None) -> Path | None:
    """The training-state file to resume from, or None for a fresh start.

    `resume`: None (fresh), ``"auto"`` (``<output_dir>/checkpoints/last.state.pt`` if it exists, else fresh),
    a run directory, its ``checkpoints/`` folder, a ``*.state.pt`` file or the ``*.safetensors`` beside one.
    """
    if resume in (None, "", "none", "null", False):
        return None
    if str(resume) == "auto":
        if output_dir is None:
            return None
        candidate = checkpoint_dir(output_dir) / f"last{STATE_SUFFIX}"
        return candidate if candidate.is_file() else None
    path = Path(str(resume)).expanduser()
    candidates = [path, path / f"last{STATE_SUFFIX}", checkpoint_dir(path) / f"last{STATE_SUFFIX}"]
    if path.suffix == ".safetensors":
        candidates.insert(0, path.with_name(path.name.removesuffix(".safetensors") + STATE_SUFFIX))
    for candidate in candidates:
        if candidate.is_file() and candidate.name.endswith(STATE_SUFFIX):
            return candidate
    raise CheckpointError(
        f"trainer.resume={resume!r}: no training state found (looked for {', '.join(map(str, candidates[:3]))}). "
        f"Pass a run directory, its checkpoints/last{STATE_SUFFIX}, or trainer.resume=auto with hydra.run.dir "
        f"set to the run to continue."
    )


def check_same_model(state: dict[str, Any], model: torch.nn.Module, path: str | Path) -> None:
    """Refuse to resume `model` from a state written for another model (name, overrides or plan)."""
    ours = (getattr(model, "zoo_name", None), dict(getattr(model, "zoo_overrides", {})),
            getattr(model, "zoo_plan", None))
    theirs = (state["model_name"], dict(state.get("overrides") or {}), state.get("plan"))
    if ours[0] != theirs[0]:
        raise CheckpointError(
            f"Cannot resume model={ours[0]} from {path}: that checkpoint was written for model={theirs[0]}. "
            f"Resume with model={theirs[0]}, or start a new run (trainer.resume=null)."
        )
    if ours != theirs:
        raise CheckpointError(
            f"Cannot resume {ours[0]} from {path}: the checkpoint's overrides/plan {theirs[1:]} differ from this "
            f"run's {ours[1:]}."
        )
