"""Any ``nn.Module`` as a zoo model whose depth units are discovered (:mod:`zoo.models.discovery`): the one pipeline
behind ``zoo.create_model("timm/<name>")``, ``zoo.depth_units(<your module>, input_size=...)``, the prune job's
check before any work and ``python -m zoo list --prunable``.

The instance keeps its class's code, state dict and methods: it becomes an instance of a subclass made for its class
(:class:`DiscoveredDepth` first in the bases, the class's own annotations kept so that TorchScript reads timm's), named
in this module so that ``torch.save(model)`` pickles it and a fresh process finds the class again. A discovery is
cached on disk by (architecture, options, input size, timm and torch versions, discovery's code digest), so a second
build or ``zoo.load`` pays only the build.
"""

from __future__ import annotations

import hashlib
import importlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from torch import nn

from ..files import json_digest, read_sealed_json, syntax_of, write_sealed_json
from . import depth, discovery
from .depth import DepthMixin, DepthUnit, ZeroLike
from .depth import depth_units as _declared_units
from .discovery import Discovery, DiscoveryError, discover

NOTE = ("units discovered from the graph: residual blocks and their sub-layers, each proven equal to its branch "
        "zeroed; activations are not merged (a declared family merges them)")
SEPARATOR, DOT = "__in__", "__dot__"  # a generated class's name: Prunable<qualname>__in__<module>


class DiscoveredDepth(DepthMixin):
    """The zoo's depth interface for a model whose units were discovered (``self.zoo_discovery``). It declares no
    class annotations: TorchScript reads the model class's own."""

    zoo_depth_note = NOTE

    def depth_blocks(self) -> list[tuple[str, int, int]]:
        return [(u.name, u.stage, u.index) for u in self.zoo_discovery.units if u.kind == "block"]

    def example_input(self, batch_size: int = 1, input_size: Sequence[int] | None = None) -> Any:
        """A zero input of the size the model was discovered at unless one is given."""
        return super().example_input(batch_size, input_size or self.zoo_input_size)

    def depth_unit_specs(self) -> list[DepthUnit]:
        """Every block (removable or not: a segment) and the proven sub-layers inside it, not removed already."""
        units = []
        for unit in self.zoo_discovery.offered():
            paths = (unit.name, *unit.branch) if unit.kind == "sublayer" else (unit.name,)
            if any(_removed(self, path) for path in paths):
                continue
            units.append(DepthUnit(name=unit.name, kind=unit.kind, stage=unit.stage, index=unit.index,
                                   removable=unit.removable, merge=unit.branch))
        return units


def _removed(model: nn.Module, path: str) -> bool:
    """Whether the module at `path`, or one it lies in, was removed (replaced by an identity or zeros)."""
    module: nn.Module = model
    for part in path.split("."):
        if isinstance(module, (nn.Identity, ZeroLike)):
            return True
        module = getattr(module, part, None)
        if module is None:
            return True
    return isinstance(module, (nn.Identity, ZeroLike))


def _class_name(cls: type) -> str:
    return f"Prunable{cls.__qualname__.replace('.', '_')}{SEPARATOR}{cls.__module__.replace('.', DOT)}"


def prunable_class(cls: type) -> type:
    """The subclass of `cls` with the zoo's depth interface (made once per class; ``zoo.models.discovered.<name>``)."""
    if issubclass(cls, DiscoveredDepth):
        return cls
    name = _class_name(cls)
    made = globals().get(name)
    if made is None:
        namespace = {"__module__": __name__, "__qualname__": name,
                     "__annotations__": dict(getattr(cls, "__annotations__", {})), "__doc__": cls.__doc__}
        made = type(name, (DiscoveredDepth, cls), namespace)
        globals()[name] = made
    return made


def __getattr__(name: str) -> type:
    """A prunable class named by a pickle made in another process: made again from the class it extends."""
    if not name.startswith("Prunable") or SEPARATOR not in name:
        raise AttributeError(name)
    qualname, module_name = name[len("Prunable"):].split(SEPARATOR)
    module = importlib.import_module(module_name.replace(DOT, "."))
    for value in list(vars(module).values()):
        if isinstance(value, type) and value.__qualname__.replace(".", "_") == qualname:
            return prunable_class(value)
    raise AttributeError(name)


def code_digest() -> str:
    """A digest of the code a discovery depends on (this module, :mod:`~zoo.models.discovery` and the removals of
    :mod:`~zoo.models.depth`; docstrings and comments left out): a discovery made by other code is not reused."""
    modules = (depth, discovery, importlib.import_module(__name__))
    text = "".join(syntax_of(Path(m.__file__).read_text()) for m in modules)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_dir() -> Path:
    return Path(os.environ.get("DEPTHZOO_CACHE", Path.home() / ".cache" / "depthzoo")) / "discovery"


def cache_key(arch: str, options: dict[str, Any], input_size: Sequence[int]) -> dict[str, Any]:
    """What determines a timm architecture's discovery. The classifier's width (num_classes) is left out: it is no
    residual unit and changes none."""
    import timm
    import torch

    return {"arch": arch, "options": {k: repr(v) for k, v in sorted(options.items()) if k != "num_classes"},
            "input_size": list(input_size), "timm": timm.__version__, "torch": torch.__version__,
            "code": code_digest()}


_MEMORY: dict[str, Discovery] = {}


def cached_discovery(key: dict[str, Any] | None, run: Callable[[], Discovery]) -> Discovery:
    """`run()`'s discovery, read from the cache where `key` matches one made before (in memory, then on disk)."""
    if key is None:
        return run()
    digest = json_digest(key, 20)
    if digest in _MEMORY:
        return _MEMORY[digest]
    path = cache_dir() / f"{digest}.json"
    found = None
    if path.exists():
        try:
            payload = read_sealed_json(path)
            found = Discovery.from_dict(payload["discovery"]) if payload.get("key") == key else None
        except Exception:  # noqa: BLE001 - a damaged or foreign cache file is made again
            found = None
    if found is None:
        found = run()
        try:
            write_sealed_json(path, {"key": key, "discovery": found.to_dict()})
        except OSError:
            pass  # a read-only cache folder: discovery is made again next time
    _MEMORY[digest] = found
    return found


def make_prunable(model: nn.Module, input_size: Sequence[int], key: dict[str, Any] | None = None,
                  found: Discovery | None = None) -> nn.Module:
    """Give `model` (in place) the zoo's depth interface, its units discovered at per-sample `input_size` (cached
    under `key`; or `found`, already made). Raises :class:`DiscoveryError` when the graph does not trace."""
    found = found or cached_discovery(key, lambda: discover(model, input_size))
    model.__class__ = prunable_class(type(model))
    model.zoo_discovery, model.zoo_input_size = found, tuple(input_size)
    return model


def check_prunable(found: Discovery, what: str) -> None:
    """Refuse a model with no removable unit, saying what its additions were."""
    if not found.removable():
        reasons = sorted({u.reason for u in [*found.units, *found.left_out] if u.reason})
        detail = f"; {reasons[0]}" if reasons else ""
        raise DiscoveryError(f"{what} cannot be depth-pruned: it has no removable residual unit "
                             f"({found.additions} same-shape addition(s), {len(found.units)} candidate unit(s)"
                             f"{detail}), so there is nothing to remove by depth.")


def ensure_prunable(model: nn.Module, input_size: Sequence[int] | None) -> nn.Module:
    """`model` itself if it declares its depth units, else made prunable in place by discovery at `input_size`
    (required), refused with the reason when it has no removable unit."""
    if hasattr(model, "depth_unit_specs"):
        return model
    if input_size is None:
        raise DiscoveryError(f"{type(model).__name__} declares no depth units, so they are discovered from its graph: "
                             f"give the per-sample input size, e.g. zoo.depth_units(model, input_size=(3, 32, 32)).")
    if not isinstance(model, nn.Module) or not all(isinstance(s, int) and s > 0 for s in input_size):
        raise DiscoveryError(f"zoo.depth_units takes an nn.Module and a per-sample input size of positive integers; "
                             f"got {type(model).__name__} and {tuple(input_size)!r}.")
    found = discover(model, tuple(input_size))
    check_prunable(found, type(model).__name__)
    return make_prunable(model, input_size, None, found)


def depth_units(model: nn.Module, input_size: Sequence[int] | None = None) -> list[DepthUnit]:
    """The depth units of any model (:func:`zoo.models.depth.depth_units`). A module that declares none (your own
    ``nn.Module``) gets them by discovery at per-sample `input_size`, and from then on is a prunable model in place:
    ``zoo.apply_plan``, the latency table and the search take it."""
    return _declared_units(ensure_prunable(model, input_size), input_size)


__all__ = ["DiscoveredDepth", "cache_key", "check_prunable", "depth_units", "ensure_prunable", "make_prunable",
           "prunable_class"]
