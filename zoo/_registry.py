"""Model registry: one name per architecture, the same names as timm where timm has the model."""

from __future__ import annotations

import difflib
import fnmatch
import inspect
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .errors import ModelOptionError, UnknownModelError

_logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelEntry:
    """A registered architecture: its builder and its default (pretrained) configuration."""

    name: str
    family: str
    builder: Callable[..., nn.Module]
    default_cfg: dict[str, Any] = field(default_factory=dict)
    task: str = "classification"  # or "language_model": what data and loss the model takes


_REGISTRY: dict[str, ModelEntry] = {}


TASKS = ("classification", "language_model")


def register_model(family: str, task: str = "classification", **default_cfg: Any) -> Callable:
    """Decorator registering a builder function under its own name (a name can be registered once).

    `task`: ``classification`` or ``language_model``. `default_cfg` holds timm-style metadata: input_size, mean,
    std, num_classes, hf_hub_id, interpolation, crop_pct, first_conv, classifier.
    """
    if task not in TASKS:
        raise ValueError(f"Unknown task {task!r}; allowed: {', '.join(TASKS)}.")

    def wrap(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        if fn.__name__ in _REGISTRY:
            first = _REGISTRY[fn.__name__].builder.__module__
            raise ValueError(f"Model {fn.__name__!r} is registered already (by {first}); a name is registered once.")
        _REGISTRY[fn.__name__] = ModelEntry(fn.__name__, family, fn, dict(default_cfg), task)
        return fn

    return wrap


def list_models(pattern: str = "*") -> list[str]:
    """Sorted registered names matching a shell-style pattern, e.g. ``"mobilenetv2_*"``."""
    return sorted(n for n in _REGISTRY if fnmatch.fnmatch(n, pattern))


def is_model(name: str) -> bool:
    return name in _REGISTRY


def get_entry(name: str) -> ModelEntry:
    """The registry entry for `name`; an unknown name raises with the closest registered names."""
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=5, cutoff=0.4)
        hint = f" Closest names: {', '.join(close)}." if close else ""
        raise UnknownModelError(
            f"Unknown model {name!r}.{hint} `zoo.list_models()` (or `python -m zoo list`) lists all "
            f"{len(_REGISTRY)} registered models."
        )
    return _REGISTRY[name]


def build_model(name: str, **kwargs: Any) -> nn.Module:
    """Build the architecture with random weights and attach its name, overrides and default_cfg."""
    entry = get_entry(name)
    try:
        model = entry.builder(**kwargs)
    except TypeError as exc:
        bad = re.search(r"unexpected keyword argument '(\w+)'", str(exc))
        options = ", ".join(builder_options(entry))
        if bad is not None:
            raise ModelOptionError(f"{name} has no option {bad.group(1)!r} (from create_model(..., "
                                   f"{bad.group(1)}=...) or model.overrides); its options are: {options}.") from None
        given = {k: v for k, v in kwargs.items() if k != "num_classes"}
        if not given:
            raise
        raise ModelOptionError(f"{name} cannot be built with options {given} ({exc}); its options are: "
                               f"{options}.") from None
    cfg = dict(entry.default_cfg)
    cfg["architecture"] = name
    if "num_classes" in kwargs:
        cfg["num_classes"] = kwargs["num_classes"]
    model.default_cfg = cfg
    model.pretrained_cfg = cfg
    model.zoo_name = name
    model.zoo_overrides = {k: v for k, v in kwargs.items() if k != "num_classes"}
    return model


def builder_options(entry: ModelEntry) -> list[str]:
    """The keyword options a registered model's class takes (what ``create_model(name, **options)`` accepts)."""
    with torch.device("meta"):
        model = entry.builder()
    return [p for p in inspect.signature(type(model).__init__).parameters if p not in ("self", "args", "kwargs")]


def create_model(
    name: str,
    pretrained: bool | str | Path = False,
    num_classes: int | None = None,
    **overrides: Any,
) -> nn.Module:
    """Create a zoo model by name, optionally with weights.

    `pretrained`: False (random init), True (the default published tag through the HF cache or a
    download), a HF hub id such as ``"timm/mobilenetv2_100.ra_in1k"``, or a local file
    (``.safetensors``, a ``.pth``/``.pt``/``.bin`` state dict, or a checkpoint written by this project).
    A different `num_classes` than the weights' re-initialises the classifier. A project checkpoint keeps
    its own head and overrides unless new ones are given.
    """
    from . import pretrained as _pretrained  # local import keeps the registry importable on its own

    entry = get_entry(name)
    source = _pretrained.resolve_source(entry, pretrained) if pretrained is not False else None
    meta = source.meta if source is not None else None
    if meta is not None:
        if meta.get("model") != name:
            raise _pretrained.WeightsError(
                f"Checkpoint {source.path} was written for model {meta.get('model')!r}, not {name!r}. "
                f"Load it with zoo.create_model({meta.get('model')!r}, pretrained=...) or zoo.load(path)."
            )
        overrides = {**meta.get("overrides", {}), **overrides}
        if num_classes is None:
            num_classes = meta.get("num_classes")
    if num_classes is None:
        num_classes = entry.default_cfg.get("num_classes")
    kwargs = dict(overrides)
    if num_classes is not None:
        kwargs["num_classes"] = num_classes
    model = build_model(name, **kwargs)
    if meta is not None and meta.get("plan"):
        from .surgery import apply_plan

        model = apply_plan(model, meta["plan"])
    if meta is not None and meta.get("fused"):
        from .fuse import fuse

        model = fuse(model, inplace=True)
    if source is not None:
        _pretrained.load_into(model, source)
    return model


def model_info(name: str) -> dict[str, Any]:
    """Family, default input size, parameter count and default pretrained tag of a registered model."""
    entry = get_entry(name)
    kwargs = {"num_classes": entry.default_cfg["num_classes"]} if entry.default_cfg.get("num_classes") else {}
    with torch.device("meta"):
        model = entry.builder(**kwargs)
    return {
        "name": name,
        "family": entry.family,
        "input_size": tuple(entry.default_cfg.get("input_size", ())),
        "params": sum(p.numel() for p in model.parameters()),
        "pretrained_tag": entry.default_cfg.get("hf_hub_id"),
        "num_classes": entry.default_cfg.get("num_classes"),
    }
