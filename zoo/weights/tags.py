"""Pretrained tags, as timm names them: ``mobilenetv2_140.ra_in1k`` is the architecture ``mobilenetv2_140`` with the
weights (and the evaluation config they were published with) of tag ``ra_in1k``.

timm is the one source of these facts: for every registered name that timm also has, the known tags, the default
tag (timm's first) and each tag's eval config (input size, crop_pct, crop_mode, interpolation, mean/std,
num_classes) are read from timm's pretrained configs when first needed, so ``import zoo`` stays free of timm. A
registered model timm does not have may name its weights with ``hf_hub_id`` in its default config.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import UnknownTagError
from ..models.registry import get_entry, timm_cfg

EVAL_KEYS = ("input_size", "test_input_size", "interpolation", "crop_pct", "test_crop_pct", "crop_mode", "mean",
             "std", "num_classes", "pool_size", "first_conv", "classifier", "fixed_input_size", "label_offset")


def split_name(name: str) -> tuple[str, str | None]:
    """``"mobilenetv2_140.ra_in1k"`` -> (``"mobilenetv2_140"``, ``"ra_in1k"``); a plain name has tag None, as has
    ``hf/<folder or hub id>`` (whose dots are the path's)."""
    if str(name).startswith("hf/"):
        return str(name), None
    arch, _, tag = str(name).partition(".")
    return arch, (tag or None)


def timm_arch(arch: str) -> str:
    """timm's name of an architecture: a zoo name as it is, ``timm/<arch>`` (any timm model) without the prefix."""
    return arch.removeprefix("timm/")


def _timm_cfgs(arch: str, weighted: bool = True) -> dict[str, dict[str, Any]]:
    """timm's pretrained configs of `arch` by tag, in timm's order (default first): those that name published weights,
    or (`weighted` False) every tag timm lists (``mixer_s16_224.untrained`` too)."""
    from timm.models import get_arch_pretrained_cfgs, is_model

    arch = timm_arch(arch)
    if not is_model(arch):
        return {}
    cfgs = {}
    for full, cfg in get_arch_pretrained_cfgs(arch).items():
        values = cfg.to_dict()
        if values.get("hf_hub_id") or values.get("url") or not weighted:
            cfgs[split_name(full)[1]] = values
    return cfgs


def tag_cfgs(arch: str) -> dict[str, dict[str, Any]]:
    """Every known tag of a registered architecture with its full pretrained config (default tag first)."""
    entry = get_entry(arch)
    cfgs = _timm_cfgs(arch)
    own = entry.default_cfg.get("hf_hub_id")
    if own and not cfgs:
        cfgs[split_name(own.split("/")[-1])[1] or "default"] = {**entry.default_cfg, "architecture": arch}
    return cfgs


def known_tags(pattern: str = "*") -> list[str]:
    """``arch.tag`` of every pretrained tag of the registered models matching `pattern` (``list --pretrained``)."""
    from ..models.registry import list_models

    return [f"{arch}.{tag}" for arch in list_models(pattern) for tag in tag_cfgs(arch)]


def default_tag(arch: str) -> str | None:
    """The tag ``pretrained=True`` loads for a plain architecture name (timm's default), or None when none exists."""
    return next(iter(tag_cfgs(arch)), None)


def resolve_tag(arch: str, tag: str | None, weighted: bool = True) -> dict[str, Any]:
    """The pretrained config of ``arch.tag``; tag None means the default tag. Unknown tags list the known ones.
    `weighted` False: any tag timm lists is known, with or without weights (a model built without them)."""
    cfgs = tag_cfgs(arch)
    listed = _timm_cfgs(arch, weighted=False) if tag is not None and tag not in cfgs else {}
    if tag in listed:
        if not weighted:
            return {**listed[tag], "tag": tag}
        raise UnknownTagError(f"{arch}.{tag} names no published weights (timm lists the tag without a file): build it "
                              f"with pretrained=False, or pass weights as pretrained=<file or hub id>.")
    tag = tag or default_tag(arch)
    if tag is None:
        raise UnknownTagError(f"Model {arch!r} has no published pretrained weights (no tag is known). Pass a local "
                              f"file or a hub id as pretrained=..., or pretrained=False.")
    if tag not in cfgs:
        known = ", ".join(f"{arch}.{t}" for t in cfgs) or "none"
        raise UnknownTagError(f"Unknown pretrained tag {tag!r} for {arch}; known tags: {known}. "
                              f"`python -m zoo list --pretrained` lists every tag.")
    return {**cfgs[tag], "tag": tag}


def hub_id(arch: str, tag: str | None) -> str:
    """The Hugging Face hub id that holds ``arch.tag``'s weights."""
    cfg = resolve_tag(arch, tag)
    hub = cfg.get("hf_hub_id") or ""
    if hub.endswith("/"):  # timm writes "timm/" and appends the model name and tag
        hub = f"{hub}{timm_arch(arch)}.{cfg['tag']}"
    if not hub:
        raise UnknownTagError(f"{arch}.{cfg['tag']} is published only by URL ({cfg.get('url')}), not on the "
                              f"Hugging Face Hub; download it and pass the file as pretrained=...")
    return hub


def source_tag(arch: str, pretrained: Any) -> str | None:
    """The tag that weights carry, so that their eval config follows them: ``True`` means the default tag, a timm
    hub id ``timm/<arch>.<tag>`` (``hf-hub:`` prefix and trailing slash allowed) its tag, a depthzoo checkpoint the
    tag in its metadata; None for anything else (a plain file, another hub repo)."""
    from pathlib import Path

    from .checkpoint import read_checkpoint_meta

    if pretrained is True:
        return default_tag(arch)
    if pretrained in (None, False) or not isinstance(pretrained, (str, Path)):
        return None
    text = str(pretrained).removeprefix("hf-hub:").rstrip("/")
    prefix = f"timm/{timm_arch(arch)}."
    if text.startswith(prefix) and text[len(prefix):] in tag_cfgs(arch):
        return text[len(prefix):]
    local = Path(text).expanduser()
    if local.is_dir() and (local / "model.safetensors").is_file():
        local = local / "model.safetensors"
    if local.suffix == ".safetensors" and local.is_file():
        try:
            meta = read_checkpoint_meta(local) or {}
        except Exception:  # noqa: BLE001 - an unreadable file is reported when the weights are read
            return None
        return meta.get("tag") if meta.get("model") == arch else None
    return None


def pretrained_cfg(arch: str, tag: str | None = None) -> dict[str, Any]:
    """A model's default config (eval config included): the registered defaults, updated with the tag's when a tag
    is given. This is what ``model.default_cfg`` holds and what the data transforms and latency tables use."""
    entry = get_entry(arch)
    cfg = {**entry.default_cfg, **((timm_cfg(arch, tag) if tag else {}) or timm_cfg(arch))}
    if tag is not None:
        found = resolve_tag(arch, tag, weighted=False)
        cfg.update({k: found[k] for k in EVAL_KEYS if found.get(k) is not None})
        cfg["tag"] = found["tag"]
        if found.get("hf_hub_id"):
            cfg["hf_hub_id"] = hub_id(arch, tag)
    cfg["architecture"] = timm_arch(arch)
    return cfg


def model_info(name: str) -> dict[str, Any]:
    """Family, default input size, parameter count and default pretrained tag of a registered model; for
    ``arch.tag`` also that tag's eval config (``eval_cfg``)."""
    name, tag = split_name(name)
    entry = get_entry(name)
    default = default_tag(name)
    kwargs = {"num_classes": entry.default_cfg["num_classes"]} if entry.default_cfg.get("num_classes") else {}
    with torch.device("meta"):
        model = entry.builder(**kwargs)
    return {
        "name": name,
        "family": entry.family,
        "input_size": tuple(entry.default_cfg.get("input_size", ())),
        "params": sum(p.numel() for p in model.parameters()),
        "pretrained_tag": f"{name}.{default}" if default else None,
        "tags": [f"{name}.{t}" for t in tag_cfgs(name)],
        "num_classes": entry.default_cfg.get("num_classes"),
        **({"eval_cfg": {k: v for k, v in pretrained_cfg(name, tag).items() if k in EVAL_KEYS or k == "hf_hub_id"}}
           if tag else {}),
    }
