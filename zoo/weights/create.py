"""Building models with weights: :func:`create_model` (a registered name, optionally with pretrained weights or a
checkpoint of this project, its pruning plan and deploy form re-applied) and :func:`load` (a checkpoint alone).

The top of the model layer: it combines the registry (architectures), :mod:`zoo.pretrained` (finding and checking
weights), :mod:`zoo.surgery` (plans) and :mod:`zoo.fuse` (deploy form), none of which imports it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..deploy.fuse import fuse
from ..errors import ModelOptionError, WeightsError
from ..models.features import FEATURE_OPTIONS, timm_features
from ..models.features import features_only as features_only_model
from ..models.registry import build_model, get_entry, model_class
from ..pruning.surgery import apply_plan
from .checkpoint import read_checkpoint_meta
from .pretrained import load_into, resolve_source
from .tags import hub_id, pretrained_cfg, resolve_tag, source_tag, split_name


def create_model(
    name: str,
    pretrained: bool | str | Path = False,
    num_classes: int | None = None,
    features_only: bool = False,
    out_indices: int | Sequence[int] | None = None,
    **overrides: Any,
) -> nn.Module:
    """Create a zoo model by name (timm's form: ``"mobilenetv2_140"`` or ``"mobilenetv2_140.ra_in1k"``).

    `pretrained`: False (random init), True (the tag's weights, by default the architecture's default tag, through
    the HF cache or a download), a HF hub id such as ``"timm/mobilenetv2_100.ra_in1k"``, or a local file
    (``.safetensors``, a ``.pth``/``.pt``/``.bin`` state dict, or a checkpoint written by this project). A tag sets
    the model's ``default_cfg`` to the tag's eval config (input size, crop, interpolation, mean/std, classes) even
    without weights. A different `num_classes` than the weights' re-initialises the classifier. A project
    checkpoint keeps its own head, overrides and tag unless new ones are given. `features_only` returns timm's
    backbone form (the stage outputs `out_indices` as a list, with ``feature_info``), pruned models included.
    """
    feature_options = {k: overrides.pop(k) for k in FEATURE_OPTIONS if k in overrides}
    if (out_indices is not None or feature_options) and not features_only:
        given = ", ".join(["out_indices"] * (out_indices is not None) + list(feature_options))
        raise ModelOptionError(f"{given} is for the backbone form: pass features_only=True as well.")
    if num_classes is not None and (isinstance(num_classes, bool) or not isinstance(num_classes, int) or
                                    num_classes < 0):
        raise ModelOptionError(f"num_classes={num_classes!r}: give the number of classes, an integer >= 0 (0: no "
                               f"classifier, the pooled features), or None for the architecture's own.")
    if not isinstance(name, str):
        raise ModelOptionError(f"create_model takes a model name (str), e.g. 'mobilenetv2_100'; got {name!r}.")
    arch, tag = split_name(name)
    entry = get_entry(arch)  # an unknown name fails first, with the closest names
    if isinstance(pretrained, str) and pretrained in ("true", "True"):
        pretrained = True
    if entry.family == "hf" and pretrained is True:  # a transformers folder's own weights, read by transformers
        overrides["weights"], pretrained = True, False
    tag = tag or source_tag(arch, pretrained)  # weights carry their tag (and so their eval config)
    if pretrained is True:
        pretrained = hub_id(arch, tag)
        tag = tag or resolve_tag(arch, None)["tag"]
    if tag is not None:
        resolve_tag(arch, tag, weighted=False)  # an unknown tag fails before any file is read
    source = resolve_source(pretrained) if pretrained is not False else None
    meta = source.meta if source is not None else None
    if meta is not None:
        if meta.get("model") != arch:
            raise WeightsError(
                f"Checkpoint {source.path} was written for model {meta.get('model')!r}, not {arch!r}. "
                f"Load it with zoo.create_model({meta.get('model')!r}, pretrained=...) or zoo.load(path)."
            )
        overrides = {**meta.get("overrides", {}), **overrides}
        tag = tag or meta.get("tag")
        if num_classes is None:
            num_classes = meta.get("num_classes")
    if source is not None and meta is None:
        reader = getattr(model_class(arch), "read_foreign", None)
        found = reader(arch, source.state_dict, source.config, overrides) if reader else None
        if found is not None:  # another project's format: its architecture options, our keys
            options, state = found
            overrides = {**options, **overrides}
            source = replace(source, state_dict=state)
    cfg = pretrained_cfg(arch, tag)
    if num_classes is None:
        num_classes = cfg.get("num_classes")
    kwargs = dict(overrides)
    if num_classes is not None:
        kwargs["num_classes"] = num_classes
    placement = {k: kwargs.pop(k) for k in ("device", "dtype") if kwargs.get(k) is not None}
    with torch.device(placement["device"]) if "device" in placement else contextlib.nullcontext():
        model = build_model(arch, **kwargs)  # timm's device and dtype options, for every family
    if "dtype" in placement:
        model = model.to(dtype=placement["dtype"])
    if tag is not None:
        model.default_cfg = model.pretrained_cfg = {**cfg, "num_classes": model.default_cfg.get("num_classes")}
    model.zoo_tag = tag
    if meta is not None and meta.get("plan"):
        model = apply_plan(model, meta["plan"])
    if meta is not None and meta.get("fused"):
        model = fuse(model, inplace=True)
    if source is not None:
        load_into(model, source)
    if not features_only:
        return model
    if arch.startswith("timm/"):  # timm's own class: wrapped as timm wraps it
        return timm_features(model, arch.removeprefix("timm/"), kwargs, out_indices, feature_options)
    return features_only_model(model, out_indices, **feature_options)


def load(path: str | Path, **kwargs: Any) -> nn.Module:
    """Rebuild the model recorded in a project checkpoint (name, overrides, plan) and load its weights."""
    try:
        meta = read_checkpoint_meta(path)
    except Exception as exc:  # noqa: BLE001 - any read failure is reported the same way
        raise WeightsError(f"Cannot read checkpoint {path}: {exc}. Expected a depthzoo .safetensors file.") from exc
    if not meta or "model" not in meta:
        raise WeightsError(
            f"{path} has no depthzoo metadata, so the model name is unknown. Use "
            "zoo.create_model(name, pretrained=path) with the architecture's name instead."
        )
    return create_model(meta["model"], pretrained=path, **kwargs)
