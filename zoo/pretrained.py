"""Resolve and load weights: local files (safetensors, pickled state dicts, our checkpoints) and HF hub ids.

Resolution follows timm: an explicit file wins, then a hub id, then (``pretrained=True``) the model's
default published tag. Everything is checked against the model before loading, so a mismatch never
leaves a half-loaded model.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ._registry import ModelEntry
from .checkpoint import read_checkpoint_meta, tied_aliases
from .errors import WeightsError

_logger = logging.getLogger(__name__)

PICKLE_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt")
WEIGHT_SUFFIXES = (".safetensors", *PICKLE_SUFFIXES)
_WRAPPER_KEYS = ("state_dict_ema", "model_ema", "state_dict", "model")

__all__ = ["WeightsError", "WeightSource", "resolve_source", "load_into", "read_state_dict"]


@dataclass
class WeightSource:
    """A resolved weight file: where it came from, its tensors, and depthzoo metadata if it has any."""

    path: Path
    origin: str
    state_dict: dict[str, torch.Tensor]
    meta: dict[str, Any] | None


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a weight file into a flat state dict (safetensors, or a pickled dict with weights_only=True)."""
    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"Weight file {path} does not exist. Give an existing {'/'.join(WEIGHT_SUFFIXES)} file.")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path), device="cpu")
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any decode failure means the same thing to the user
        raise WeightsError(
            f"Cannot read weight file {path}: {type(exc).__name__}: {exc}. The file is unreadable, truncated "
            f"or not a weight file; allowed are .safetensors and pickled state dicts ({', '.join(PICKLE_SUFFIXES)})."
        ) from exc
    for key in _WRAPPER_KEYS:
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
            break
    if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
        raise WeightsError(f"{path} does not hold a state dict (a mapping of names to tensors).")
    return {k.removeprefix("module.").removeprefix("_orig_mod."): v for k, v in state.items()}


def _download_from_hub(hub_id: str) -> Path:
    """Fetch a repo's weights through huggingface_hub (its cache; HF_HUB_OFFLINE=1 uses the cache only)."""
    from huggingface_hub import hf_hub_download

    errors = []
    for filename in ("model.safetensors", "pytorch_model.bin"):
        try:
            return Path(hf_hub_download(hub_id, filename))
        except Exception as exc:  # noqa: BLE001 - hub errors vary by version; all end the same way
            errors.append(f"{filename}: {type(exc).__name__}")
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
    mode = " with HF_HUB_OFFLINE=1" if offline else ""
    raise WeightsError(
        f"Could not get weights for hub id {hub_id!r} ({'; '.join(errors)}){mode}. "
        f"They are neither in the local Hugging Face cache nor downloadable now. Download them where there is "
        f"network (e.g. `huggingface-cli download {hub_id}`) or pass a local file: "
        f"zoo.create_model(name, pretrained='path/to/model.safetensors')."
    )


def resolve_source(entry: ModelEntry, pretrained: bool | str | Path) -> WeightSource:
    """Turn the `pretrained` argument of create_model into loaded tensors (see module docstring)."""
    if pretrained is True:
        hub_id = entry.default_cfg.get("hf_hub_id")
        if not hub_id:
            raise WeightsError(
                f"Model {entry.name!r} has no published pretrained weights. Pass a local file or a hub id "
                f"as pretrained=..., or pretrained=False."
            )
        path, origin = _download_from_hub(hub_id), f"hf-hub:{hub_id}"
    else:
        text = str(pretrained)
        local = Path(text).expanduser()
        if local.exists() or text.endswith(WEIGHT_SUFFIXES) or "/" not in text:
            path, origin = local, str(local)
        else:
            hub_id = text.removeprefix("hf-hub:")
            path, origin = _download_from_hub(hub_id), f"hf-hub:{hub_id}"
    meta = None
    if path.suffix == ".safetensors" and path.is_file():
        try:
            meta = read_checkpoint_meta(path)
        except Exception:  # noqa: BLE001 - unreadable files are reported by read_state_dict below
            meta = None
    return WeightSource(path=path, origin=origin, state_dict=read_state_dict(path), meta=meta)


def _classifier_keys(model: nn.Module) -> list[str]:
    """State-dict keys of the classifier named in the model's default_cfg (e.g. ``head.fc``)."""
    prefix = model.default_cfg.get("classifier")
    if not prefix:
        return []
    return [k for k in model.state_dict() if k.startswith(prefix + ".")]


def _format_mismatch(path: Path, missing: list[str], unexpected: list[str], shapes: list[str]) -> str:
    parts = []
    if missing:
        parts.append(f"{len(missing)} missing key(s), first: {', '.join(missing[:5])}")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected key(s), first: {', '.join(unexpected[:5])}")
    if shapes:
        parts.append(f"{len(shapes)} shape mismatch(es), first: {'; '.join(shapes[:5])}")
    return f"Weights in {path} do not fit this architecture: " + "; ".join(parts) + "."


def load_into(model: nn.Module, source: WeightSource) -> nn.Module:
    """Check `source` against `model` (keys and shapes) and load it; re-initialise a mismatched classifier."""
    state = dict(source.state_dict)
    expected = model.state_dict()
    for alias, key in tied_aliases(model).items():
        if alias not in state and key in state:
            state[alias] = state[key]
    head_keys = _classifier_keys(model)
    head_differs = any(k in state and state[k].shape != expected[k].shape for k in head_keys) or (
        head_keys and not any(k in state for k in head_keys)
    )
    if head_differs:
        prefix = model.default_cfg.get("classifier")
        for key in list(state):
            if key.startswith(prefix + "."):
                state.pop(key)
        _logger.warning(
            "Classifier %s re-initialised: %s has a head for another number of classes than num_classes=%s.",
            prefix, source.origin, getattr(model, "num_classes", "?"),
        )
        expected = {k: v for k, v in expected.items() if k not in head_keys}
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    shapes = [
        f"{k}: file {tuple(state[k].shape)} vs model {tuple(expected[k].shape)}"
        for k in expected
        if k in state and state[k].shape != expected[k].shape
    ]
    if missing or unexpected or shapes:
        raise WeightsError(_format_mismatch(source.path, missing, unexpected, shapes))
    model.load_state_dict(state, strict=not head_differs)
    model.pretrained_source = source.origin
    return model
