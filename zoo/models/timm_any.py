"""Any timm model as a zoo model: ``zoo.create_model("timm/<name>")``, ``python prune.py model=timm model.name=<name>``.

No family file: the model is timm's own (its names, weights, tags and eval config), and its depth units are
discovered from its graph and proven (:mod:`zoo.models.discovery`, through :mod:`zoo.models.discovered`, the one
pipeline that ``create_model``, the prune job's check and ``python -m zoo list --prunable`` share). What tracing
cannot show stays with the declared families: merged activations (a discovered model is pruned by blocks and
sub-layers only, and says so), TResNet's anti-aliasing, RetNet's recurrent forms.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from torch import nn

from ..errors import ModelOptionError, UnknownModelError, UnknownTagError, first_line
from .discovered import cache_key, cached_discovery, check_prunable, make_prunable, prunable_class
from .discovery import Discovery, DiscoveryError, discover
from .features import FEATURE_OPTIONS
from .registry import CLASSIFIER_DEPLOY, ModelEntry, register_family, register_resolver

PREFIX = "timm/"
FAMILY = "timm"


def input_size_of(model: nn.Module, options: dict[str, Any]) -> tuple[int, ...]:
    """The per-sample input the model is discovered at: timm's, at the image size it was built for."""
    size = tuple(getattr(model, "pretrained_cfg", {}).get("input_size", (3, 224, 224)))
    image = options.get("img_size")
    if image is not None:
        height, width = (image, image) if isinstance(image, int) else tuple(image)
        size = (size[0], height, width)
    return size


def _timm_build(arch: str, options: dict[str, Any]) -> nn.Module:
    import timm

    return timm.create_model(arch, pretrained=False, **options)


def discovered(arch: str, options: dict[str, Any], model: nn.Module | None = None,
               input_size: Sequence[int] | None = None) -> tuple[nn.Module, Discovery]:
    """timm's `arch` built with `options` and its discovery at `input_size` (default: timm's, at ``img_size``),
    cached: a second call pays only timm's build."""
    model = _timm_build(arch, options) if model is None else model
    size = tuple(input_size) if input_size is not None else input_size_of(model, options)
    found = cached_discovery(cache_key(arch, options, size), lambda: discover(model, size))
    return model, found


def build(arch: str, **options: Any) -> nn.Module:
    """timm's `arch` with random weights and its depth units discovered (raises DiscoveryError, a ZooError, when it
    has none)."""
    model = _timm_build(arch, options)
    if next(model.parameters()).is_meta:  # on the meta device (zoo.models.registry.model_class): no discovery
        model.__class__ = prunable_class(type(model))
        return model
    try:
        _, found = discovered(arch, options, model)
    except DiscoveryError as exc:
        raise DiscoveryError(f"timm's {arch} cannot be depth-pruned: {exc}") from None
    check_prunable(found, f"timm's {arch}")
    size = input_size_of(model, options)
    return make_prunable(model, size, cache_key(arch, options, size))


def precheck(arch: str, options: dict[str, Any], input_size: Sequence[int] | None = None) -> None:
    """What can be known before any work, by the same discovery the build uses (cached for it): the model has a
    proven removable unit, and it takes the run's input size (`input_size`, else timm's)."""
    import torch

    what = f"model=timm model.name={arch}"
    backbone = [k for k in ("features_only", "out_indices", *FEATURE_OPTIONS) if k in options]
    if backbone:
        raise ModelOptionError(f"model.overrides.{backbone[0]} makes a backbone (stage outputs, no classifier), which "
                               f"train.py and prune.py cannot train or prune as a classifier: remove it (a pruned "
                               f"model's backbone form is zoo.create_model(name, pretrained=<checkpoint>, "
                               f"features_only=True)).")
    model = _timm_build(arch, options)
    if options:
        try:
            with torch.no_grad():
                model.eval()(torch.zeros(1, *input_size_of(model, options)))
        except Exception as exc:  # noqa: BLE001 - the options built a model that does not run
            raise ModelOptionError(f"{what} built with model.overrides {options} does not run "
                                   f"({type(exc).__name__}: {first_line(exc)[:200]}): an option's value has the "
                                   f"wrong type or range.") from None
    try:
        model, found = discovered(arch, options, model)
    except DiscoveryError as exc:
        raise DiscoveryError(f"{what} cannot be depth-pruned: {exc}.") from None
    check_prunable(found, what)
    size = tuple(input_size) if input_size is not None else found.input_size
    if size != found.input_size:
        try:
            with torch.no_grad():
                model.eval()(torch.zeros(1, *size))
        except Exception as exc:  # noqa: BLE001 - any failure at the run's size means the same to the user
            hint = (f"; a model built for one input size (ViT, Swin) takes the data's with "
                    f"+model.overrides.img_size={size[-1]}" if "img_size" not in options else "")
            raise DiscoveryError(f"{what} cannot be depth-pruned at input size {size}: it does not run at that size "
                                 f"({type(exc).__name__}: {first_line(exc)[:200]}){hint}.") from None


def _default_cfg(arch: str) -> dict[str, Any]:
    """timm's default pretrained config of `arch` (input size, mean/std, classes, classifier), as the registry keeps
    a declared model's."""
    import timm

    cfg = timm.get_pretrained_cfg(arch)
    values = cfg.to_dict() if cfg is not None else {}
    keep = ("input_size", "mean", "std", "num_classes", "interpolation", "crop_pct", "first_conv", "classifier")
    return {k: tuple(v) if isinstance(v, list) else v for k, v in values.items() if k in keep and v is not None}


def resolve(name: str) -> ModelEntry | None:
    """The registry entry of ``timm/<arch>`` for any model timm has (None for other names)."""
    if not name.startswith(PREFIX):
        return None
    import timm

    arch = name[len(PREFIX):]
    base, _, tag = arch.partition(".")
    if tag and timm.is_model(base):
        from timm.models import get_arch_pretrained_cfgs

        tags = [full.partition(".")[2] for full in get_arch_pretrained_cfgs(base)]
        if tag not in tags:
            listed = ", ".join(t for t in tags if t) or "none"
            raise UnknownTagError(f"Unknown tag {tag!r} for timm's {base}; timm lists: {listed} (model.tag, or "
                                  f"model.name=<arch>.<tag>).")
    if not timm.is_model(arch):
        import difflib

        close = difflib.get_close_matches(arch, timm.list_models(), n=5, cutoff=0.5)
        hint = f" Closest timm names: {', '.join(PREFIX + c for c in close)}." if close else ""
        raise UnknownModelError(f"Unknown model {name!r}: timm {timm.__version__} has no model {arch!r}.{hint} "
                                f"`timm.list_models()` lists them; `python -m zoo list --prunable 'timm/<pattern>'` "
                                f"says which can be depth-pruned.")
    entry = ModelEntry(name, FAMILY, functools.partial(build, arch), _default_cfg(arch), "classification")
    object.__setattr__(entry, "precheck", functools.partial(precheck, arch))
    return entry


def prunable(pattern: str = "*", progress: Any = None) -> list[dict[str, Any]]:
    """For every timm model matching `pattern` (``timm/convnext*``): whether it can be depth-pruned, its removable
    blocks and sub-layers (the very units ``create_model`` offers: same discovery, same cache), or the reason it
    cannot. `progress(i, n, arch)` is called before each model."""
    import timm

    rows = []
    archs = timm.list_models(pattern.removeprefix(PREFIX))
    for i, arch in enumerate(archs):
        if progress is not None:
            progress(i, len(archs), arch)
        row: dict[str, Any] = {"model": PREFIX + arch}
        try:
            _, found = discovered(arch, {})
            units = found.removable()
            reasons = sorted({u.reason for u in [*found.units, *found.left_out] if u.reason})
            row.update(prunable=bool(units), blocks=sum(u.kind == "block" for u in units),
                       sublayers=sum(u.kind == "sublayer" for u in units),
                       reason=None if units else (reasons[0] if reasons else "no residual addition"))
        except Exception as exc:  # noqa: BLE001 - a model that does not build or trace is listed with why
            row.update(prunable=False, blocks=0, sublayers=0, reason=first_line(exc)[:160])
        rows.append(row)
    return rows


register_resolver(resolve)
register_family(FAMILY, reference="timm/resnet50", small="timm/resnet18", test_input_size=(3, 32, 32),
                deploy=CLASSIFIER_DEPLOY, dynamic=True)
