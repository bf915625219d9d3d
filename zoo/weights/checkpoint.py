"""The project's checkpoint format: weights as safetensors with the model's name, overrides and plan
in the file's metadata, written atomically (temp file + fsync + rename)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from ..files import atomic_write

META_KEY = "depthzoo"
FORMAT_VERSION = 1


def tied_aliases(model: nn.Module) -> dict[str, str]:
    """Map each state-dict key whose tensor is the same storage as an earlier key's to that earlier key."""
    first: dict[tuple[int, int, tuple[int, ...]], str] = {}
    aliases = {}
    for key, tensor in model.state_dict().items():
        ident = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if tensor.numel() and ident in first:
            aliases[key] = first[ident]
        else:
            first.setdefault(ident, key)
    return aliases


def unique_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict with tied tensors stored once (safetensors refuses shared storage)."""
    aliases = tied_aliases(model)
    return {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items() if k not in aliases}


def checkpoint_meta(model: nn.Module, **extra: Any) -> dict[str, Any]:
    """What a checkpoint needs to rebuild `model`: name, overrides, classes, plan; plus `extra`."""
    name = getattr(model, "zoo_name", None)
    if name is None:
        raise ValueError("Only models made by zoo.create_model can be checkpointed (no `zoo_name`).")
    return {
        "format": FORMAT_VERSION,
        "model": name,
        "overrides": dict(getattr(model, "zoo_overrides", {})),
        "num_classes": getattr(model, "num_classes", None),
        "tag": getattr(model, "zoo_tag", None),
        "plan": getattr(model, "zoo_plan", None),
        "fused": bool(getattr(model, "zoo_fused", False)),
        **extra,
    }


def save_checkpoint(model: nn.Module, path: str | Path, **extra: Any) -> Path:
    """Write `model`'s weights and metadata to a ``.safetensors`` file atomically.

    `extra` (JSON-serialisable: epoch, step, metrics, config, ...) is stored in the metadata.
    """
    meta = json.dumps(checkpoint_meta(model, **extra), default=str)
    tensors = unique_state_dict(model)
    return atomic_write(path, lambda tmp: save_file(tensors, str(tmp), metadata={META_KEY: meta}))


def read_checkpoint_meta(path: str | Path) -> dict[str, Any] | None:
    """The depthzoo metadata of a ``.safetensors`` file, or None for a plain (e.g. timm) weight file."""
    with safe_open(str(path), framework="pt") as f:
        raw = (f.metadata() or {}).get(META_KEY)
    return json.loads(raw) if raw else None
