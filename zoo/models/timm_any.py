"""Any timm model as a zoo model: ``zoo.create_model("timm/<name>")``, ``python prune.py model=timm model.name=<name>``.

No family file: the model is timm's own (its names, weights, tags and eval config), and its depth units are
discovered from its graph (:mod:`zoo.models.discovery`): whole residual blocks, and the attention and MLP sub-layers of
transformer blocks where removing them is exact. The instance gets the zoo's depth interface by a subclass made for its
class (:class:`DiscoveredDepth` first in the bases), so its state dict, its modules and timm's methods stay as they are.
What tracing cannot show stays with the declared families: merged activations (a discovered model is pruned by
blocks and sub-layers only, and says so), TResNet's anti-aliasing, RetNet's recurrent forms.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from torch import nn

from ..errors import UnknownModelError
from .depth import DepthMixin, DepthUnit
from .discovery import DiscoveredBlock, DiscoveryError, ZeroLike, discover
from .registry import CLASSIFIER_DEPLOY, ModelEntry, register_family, register_resolver

PREFIX = "timm/"
FAMILY = "timm"
NOTE = ("units discovered from the graph: residual blocks and transformer sub-layers; activations are not merged (a "
        "declared family merges them)")


class DiscoveredDepth(DepthMixin):
    """The zoo's depth interface for a model whose blocks were discovered (``self.zoo_blocks``)."""

    zoo_blocks: list[DiscoveredBlock]
    zoo_input_size: tuple[int, ...]
    zoo_depth_note = NOTE

    def depth_blocks(self) -> list[tuple[str, int, int]]:
        return [(b.path, b.stage, b.index) for b in self.zoo_blocks]

    def example_input(self, batch_size: int = 1, input_size: Sequence[int] | None = None) -> Any:
        """A zero input of the size the model was built for (timm's, or ``img_size``'s) unless one is given."""
        return super().example_input(batch_size, input_size or self.zoo_input_size)

    def depth_unit_specs(self) -> list[DepthUnit]:
        """Each discovered block (removable or not), preceded by its sub-layers where they may be removed alone."""
        units = []
        for block in self.zoo_blocks:
            if isinstance(self.get_submodule(block.path), nn.Identity):
                continue
            if block.sublayers:
                for name, branch in zip(block.names, block.branches):
                    if not isinstance(self.get_submodule(branch[0]), ZeroLike):  # not removed already
                        units.append(DepthUnit(name=name, kind="sublayer", stage=block.stage, index=block.index,
                                               removable=True, merge=tuple(branch)))
            units.append(DepthUnit(name=block.path, kind="block", stage=block.stage, index=block.index,
                                   removable=block.removable))
        return units


@functools.cache
def prunable_class(cls: type) -> type:
    """A subclass of a timm model class with the zoo's depth interface first (made once per class)."""
    return type(f"Prunable{cls.__name__}", (DiscoveredDepth, cls), {"__module__": cls.__module__})


def input_size_of(model: nn.Module, options: dict[str, Any]) -> tuple[int, ...]:
    """The per-sample input the model is traced at: timm's, at the image size it was built for."""
    size = tuple(getattr(model, "pretrained_cfg", {}).get("input_size", (3, 224, 224)))
    image = options.get("img_size")
    if image is not None:
        height, width = (image, image) if isinstance(image, int) else tuple(image)
        size = (size[0], height, width)
    return size


def build(arch: str, **options: Any) -> nn.Module:
    """timm's `arch` with random weights and its depth units discovered (raises DiscoveryError, a ZooError, when it
    has none)."""
    import timm

    def make() -> nn.Module:
        return timm.create_model(arch, pretrained=False, **options)

    model = make()
    size = input_size_of(model, options)
    blocks: list[DiscoveredBlock] = []
    if not next(model.parameters()).is_meta:  # on the meta device (zoo.models.registry.model_class): no tracing
        try:
            blocks = discover(make, model, size)
        except DiscoveryError as exc:
            raise DiscoveryError(f"timm's {arch} cannot be depth-pruned: {exc}.") from None
    model.__class__ = prunable_class(type(model))
    model.zoo_blocks, model.zoo_input_size = blocks, size
    return model


def precheck(arch: str, options: dict[str, Any], input_size: Sequence[int] | None = None) -> None:
    """What can be known before any work: the model traces at the run's input size (`input_size`, else timm's) and has
    a removable unit (on the meta device; raises DiscoveryError naming what is missing)."""
    import timm
    import torch

    from .discovery import _outermost, _owner_blocks, trace

    with torch.device("meta"):
        model = timm.create_model(arch, pretrained=False, **options)
    size = tuple(input_size) if input_size is not None else input_size_of(model, options)
    try:
        graph, weights = trace(model, torch.empty(1, *size, device="meta"))
    except DiscoveryError as exc:
        fixed = "img_size" in str(exc) or "doesn't match model" in str(exc) or "Input height" in str(exc)
        hint = (f"; a model built for one input size (ViT, Swin) takes the data's with "
                f"+model.overrides.img_size={size[-1]}" if fixed and "img_size" not in options else "")
        raise DiscoveryError(f"model=timm model.name={arch} cannot be depth-pruned at input size {size}: {exc}"
                             f"{hint}.") from None
    blocks = _outermost(_owner_blocks(graph, weights))
    if not any(b.removable for b in blocks):
        raise DiscoveryError(f"model=timm model.name={arch} cannot be depth-pruned: it has no residual block whose "
                             f"shortcut is its input ({len(blocks)} module(s) with a residual addition, none "
                             f"removable), so there is nothing to remove by depth.")


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


def prunable(pattern: str = "*") -> list[dict[str, Any]]:
    """For every timm model matching `pattern` (``timm/convnext*``): whether it can be depth-pruned, its removable
    blocks and sub-layers, or the reason it cannot (traced on the meta device: no weights, no memory)."""
    import timm

    rows = []
    for arch in timm.list_models(pattern.removeprefix(PREFIX)):
        row: dict[str, Any] = {"model": PREFIX + arch}
        try:
            import torch

            from .discovery import _outermost, _owner_blocks, trace

            with torch.device("meta"):
                model = timm.create_model(arch, pretrained=False)
            graph, weights = trace(model, torch.empty(1, *input_size_of(model, {}), device="meta"))
            blocks = [b for b in _outermost(_owner_blocks(graph, weights)) if b.removable]
            row.update(prunable=bool(blocks), blocks=len(blocks),
                       sublayers=sum(len(b.branches) for b in blocks if len(b.branches) > 1),
                       reason=None if blocks else "no residual block whose shortcut is its input")
        except Exception as exc:  # noqa: BLE001 - a model that does not build or trace is listed with why
            row.update(prunable=False, blocks=0, sublayers=0, reason=str(exc).strip().splitlines()[0][:160])
        rows.append(row)
    return rows


register_resolver(resolve)
register_family(FAMILY, reference="timm/resnet50", small="timm/resnet18", test_input_size=(3, 32, 32),
                deploy=CLASSIFIER_DEPLOY, dynamic=True)
