"""Depth units: the one mechanism through which every family exposes what depth pruning may remove.

A family states its depth structure once: the model lists where its blocks are (``depth_blocks()``) and each
block type declares itself (``depth_spec() -> BlockSpec``: its kind, whether removing it keeps shapes valid, and its
conv chain). ``depth_unit_specs()`` derives the units from that (static facts: module path, kind, stage, index,
whether removal keeps shapes valid, whether the convolutions around an activation can be merged).
:func:`depth_units` adds what depends on the input (shapes, stride, a signature for sharing latency
measurements) with one hooked forward pass. Removing a unit always means the same thing: the module at
its path is replaced by ``nn.Identity``. For a residual unit (kind ``block``, ``retention``, ``ffn``) that
leaves the shortcut; for an activation (kind ``act``) it linearises the unit, after which the
convolutions on either side can be merged into one. :mod:`zoo.surgery` does the removing (``remove_units``,
``apply_plan``); this module only describes.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import linecache
import typing
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch
from torch import nn

from ..errors import InputSizeError, PlanError

UNIT_KINDS = ("block", "act", "retention", "ffn", "sublayer")


class PassThrough(nn.Identity):
    """What a removed unit becomes: its input, whatever else it is called with (a block of a traced model may be called
    with extra arguments, such as an attention mask). An ``nn.Identity``, so a removed unit is recognised as one.
    `like`: the module it replaces, whose call signature a scripted model keeps (TorchScript takes no ``*args``)."""

    zeros = False

    def __init__(self, like: nn.Module | None = None):
        super().__init__()
        self._params = _parameters_of(like)

    def forward(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        return x

    def __prepare_scriptable__(self) -> nn.Module:
        """The same removal with `like`'s parameters spelled out (``torch.jit.script`` puts it in the model)."""
        scripted = _scriptable(self._params, self.zeros).__new__(_scriptable(self._params, self.zeros))
        scripted.__setstate__(self.__getstate__())
        return scripted

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.__dict__.setdefault("_params", "x: torch.Tensor")


class ZeroLike(PassThrough):
    """A removed residual branch's first module: zeros shaped like its input, so the branch adds nothing."""

    zeros = True

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return torch.zeros_like(x)


def _annotation(hint: Any) -> str | None:
    """`hint` as TorchScript source (None: not expressible, the parameter is left unannotated)."""
    if hint is inspect.Parameter.empty:
        return None
    if isinstance(hint, type):
        return f"torch.{hint.__name__}" if hint.__module__.startswith("torch") else hint.__name__
    text = repr(hint)
    return text if text.startswith("typing.") and "<" not in text else None


def _parameters_of(module: nn.Module | None) -> str:
    """The parameters of `module.forward` as source (``x: torch.Tensor, attn_mask: typing.Optional[...] = None``),
    the first one named ``x``; ``x: torch.Tensor`` when it has no plain signature."""
    if module is None:
        return "x: torch.Tensor"
    try:
        signature = inspect.signature(module.forward)
        hints = typing.get_type_hints(module.forward)
    except (TypeError, ValueError, NameError):
        return "x: torch.Tensor"
    parts = []
    for i, param in enumerate(signature.parameters.values()):
        if param.kind not in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
            return "x: torch.Tensor"
        default = param.default
        if default is not param.empty and not isinstance(default, (type(None), bool, int, float, str)):
            return "x: torch.Tensor"
        hint = _annotation(hints.get(param.name, param.annotation))
        text = ("x" if i == 0 else param.name) + (f": {hint}" if hint else "")
        parts.append(text + ("" if default is param.empty else f" = {default!r}"))
    return ", ".join(parts) or "x: torch.Tensor"


@functools.cache
def _scriptable(params: str, zeros: bool) -> type:
    """A subclass of :class:`ZeroLike` (`zeros`) or :class:`PassThrough` whose forward takes `params`, with source
    TorchScript can read (registered in :mod:`linecache`); its instances pickle as made again from the two."""
    base = ZeroLike if zeros else PassThrough
    name = f"Scripted{base.__name__}_{hashlib.sha1(f'{params}|{zeros}'.encode()).hexdigest()[:12]}"
    returns = "torch.zeros_like(x)" if zeros else "x"
    source = f"class {name}(Base):\n    def forward(self, {params}):\n        return {returns}\n"
    filename = f"<depthzoo {name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict[str, Any] = {"torch": torch, "typing": typing, "Base": base}
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - our own source, made from a signature
    made = namespace[name]
    made.__prepare_scriptable__ = lambda self: self
    made.__reduce_ex__ = lambda self, protocol: (_scripted_again, (params, zeros), self.__getstate__())
    return made


def _scripted_again(params: str, zeros: bool) -> nn.Module:
    """An empty instance of ``_scriptable(params, zeros)`` for unpickling (its state follows)."""
    cls = _scriptable(params, zeros)
    return cls.__new__(cls)


@dataclass(frozen=True)
class DepthUnit:
    """One removable-or-not piece of a network's depth.

    name: module path inside the model (``blocks.3.1``, ``blocks.3.1.bn1.act``, ``blocks.2.ffn``).
    kind: ``block`` (residual block), ``act`` (activation between BN-folded convs), ``retention``/``ffn``
        (residual sub-layers of a RetNet block).
    removable: replacing the unit by identity keeps every shape valid (residual with identity shortcut,
        or an activation).
    mergeable: (acts) both neighbouring convs fold their BatchNorm, so with the activation gone they merge
        exactly into one conv; False across GroupNorm/LayerNorm or a non-linear module such as SE.
    merge: (acts) module paths of the conv+norm before and after the activation; (sublayers, found in a traced
        model's transformer blocks: :mod:`zoo.models.discovery`) the modules of the residual branch, in call order.
    in_shape/out_shape: per-sample shapes for the input size given to :func:`depth_units`.
    """

    name: str
    kind: str
    stage: int
    index: int
    removable: bool
    mergeable: bool = False
    merge: tuple[str, ...] = ()
    in_shape: tuple[int, ...] | None = None
    out_shape: tuple[int, ...] | None = None
    stride: int = 1
    params: int = 0
    signature: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ConvOp:
    """One conv of a block's chain: the conv, the BatchNorm after it (None: none), the activation after that, and
    any modules after the activation (blur-pool, SE) that a merge cannot cross."""

    conv: nn.Conv2d
    bn: nn.Module | None
    act: nn.Module | None = None
    after: list[nn.Module] = field(default_factory=list)


@dataclass
class Chain:
    """A block seen as ``post_act(ops(x) + shortcut(x))``; shortcut None means no residual."""

    ops: list[ConvOp]
    shortcut: nn.Module | None
    post_act: nn.Module | None = None


@dataclass
class BlockSpec:
    """What a block type declares, once, for depth pruning (its ``depth_spec()``).

    kind: ``block`` (a residual block), ``retention`` or ``ffn`` (RetNet's residual sub-layers).
    removable: replacing the block by identity keeps every shape valid (an identity shortcut).
    chain: the block's convs in order, when it is a chain of conv + BatchNorm + activation. Its mergeable
        activations (depth units of kind ``act``), the surgery that merges their convs and the latency table's
        segment variants all follow from it. None: the block has no mergeable activation (e.g. GroupNorm blocks).
    """

    kind: str = "block"
    removable: bool = False
    chain: Chain | None = None

    def acts(self, block: nn.Module) -> list[tuple[str, tuple[str, ...]]]:
        """(activation path, (conv, bn, next conv, next bn) paths) of each mergeable activation, relative to
        `block`: an activation between two convs whose BatchNorm folds, with nothing else in between."""
        if self.chain is None:
            return []
        names = {id(m): name for name, m in block.named_modules()}
        ops, found = self.chain.ops, []
        for op, nxt in zip(ops, ops[1:]):
            if op.act is not None and not op.after and _folds(op.bn) and _folds(nxt.bn):
                merge = tuple(names[id(m)] for m in (op.conv, op.bn, nxt.conv, nxt.bn) if m is not None)
                found.append((names[id(op.act)], merge))
        return found


def _folds(norm: nn.Module | None) -> bool:
    """A norm that can be folded into the conv before it (eval statistics): BatchNorm, or none at all."""
    return norm is None or (isinstance(norm, nn.BatchNorm2d) and norm.track_running_stats)


class DepthMixin:
    """What every zoo model shares: its task kind, an example input and its depth units.

    A family declares where its blocks are (:meth:`depth_blocks`) and each block type declares its structure
    (``depth_spec() -> BlockSpec``); the depth units follow from those two declarations.
    """

    task: str = "classification"  # or "language_model"
    recurrent: bool = False  # has a recurrent state (``init_state``) and a one-token decode step

    def depth_blocks(self) -> Iterable[tuple[str, int, int]]:  # pragma: no cover - every family overrides
        """(module path, stage, index) of every block that may carry depth units, in forward order."""
        raise NotImplementedError

    def depth_unit_specs(self) -> list[DepthUnit]:
        """Every depth unit (static facts), from the blocks' declarations; removed blocks are skipped."""
        units = []
        for path, stage, index in self.depth_blocks():
            block = self.get_submodule(path)
            if isinstance(block, nn.Identity):
                continue
            spec = block.depth_spec()
            for act, merge in spec.acts(block):
                units.append(DepthUnit(name=f"{path}.{act}", kind="act", stage=stage, index=index, removable=True,
                                       mergeable=True, merge=tuple(f"{path}.{m}" for m in merge)))
            units.append(DepthUnit(name=path, kind=spec.kind, stage=stage, index=index, removable=spec.removable))
        return units

    def example_input(self, batch_size: int = 1, input_size: Sequence[int] | None = None) -> torch.Tensor:
        """A zero input of the model's default (or the given) per-sample size, on the model's device."""
        size = tuple(input_size or self.default_cfg["input_size"])
        device = next(self.parameters()).device
        return torch.zeros(batch_size, *size, device=device)

    def depth_units(self, input_size: Sequence[int] | None = None) -> list[DepthUnit]:
        return depth_units(self, input_size)


def module_signature(module: nn.Module, in_shape: Sequence[int]) -> str:
    """A short hash of a module's architecture and input shape: equal blocks share latency entries."""
    text = f"{type(module).__qualname__}|{module!r}|{tuple(in_shape)}"
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def _first_tensor(value: Any) -> torch.Tensor | None:
    if torch.is_tensor(value):
        return value
    if isinstance(value, (tuple, list)) and value and torch.is_tensor(value[0]):
        return value[0]
    return None


def run_example(model: nn.Module, example: Any, input_size: Sequence[int] | None = None) -> Any:
    """``model(example)``, with an input the model cannot take (a wrong channel count, rank or size) refused as a
    :class:`~zoo.errors.InputSizeError` that names the input size the model takes, not PyTorch's raw error."""
    try:
        return model(*example) if isinstance(example, tuple) else model(example)
    except (RuntimeError, ValueError, IndexError, AssertionError) as exc:
        if isinstance(exc, InputSizeError):
            raise
        takes = tuple(getattr(model, "default_cfg", {}).get("input_size", ()) or ())
        given = tuple(input_size) if input_size is not None else tuple(getattr(example, "shape", ())[1:])
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputSizeError(f"input_size={given} does not fit {getattr(model, 'zoo_name', type(model).__name__)} "
                             f"({first}); it takes {takes or 'its own input size'} per sample "
                             f"({'tokens' if len(takes) == 1 else 'channels, height, width'}).") from None


@torch.no_grad()
def depth_units(model: nn.Module, input_size: Sequence[int] | None = None) -> list[DepthUnit]:
    """The model's depth units with shapes, stride, parameter count and signature filled in.

    Runs one forward of a batch-1 zero input (``model.example_input``); works on the ``meta`` device.
    Units whose module was already removed (identity) are skipped.
    """
    specs = [u for u in model.depth_unit_specs() if not isinstance(model.get_submodule(u.name), nn.Identity)]
    shapes: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}
    handles = []
    for unit in specs:
        def hook(mod, args, output, name=unit.name):
            x, y = _first_tensor(args), _first_tensor(output)
            if x is not None and y is not None and name not in shapes:
                shapes[name] = (tuple(x.shape[1:]), tuple(y.shape[1:]))

        handles.append(model.get_submodule(unit.name).register_forward_hook(hook))
    was_training = model.training
    try:
        model.eval()
        run_example(model, model.example_input(1, input_size), input_size)
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()
    units = []
    for unit in specs:
        in_shape, out_shape = shapes[unit.name]
        module = model.get_submodule(unit.name)
        stride = in_shape[-1] // out_shape[-1] if len(in_shape) == 3 else 1
        units.append(
            replace(
                unit,
                in_shape=in_shape,
                out_shape=out_shape,
                stride=stride,
                params=sum(p.numel() for p in module.parameters()),
                signature=module_signature(module, in_shape),
            )
        )
    return units


def check_removable(model: nn.Module, names: Iterable[str]) -> dict[str, DepthUnit]:
    """The model's depth units by name, after checking that every name in `names` is one that may be removed."""
    names = list(names)
    if not hasattr(model, "depth_unit_specs"):
        raise PlanError(f"{type(model).__name__} declares no depth units: find them first with "
                        f"zoo.depth_units(model, input_size=(...)) (discovery from its graph), then apply the plan.")
    by_name = {u.name: u for u in model.depth_unit_specs()}
    bad = [n for n in names if n not in by_name]
    if bad:
        removable = [u.name for u in by_name.values() if u.removable]
        raise PlanError(
            f"Unit(s) {', '.join(map(repr, bad[:5]))} are not depth units of "
            f"{getattr(model, 'zoo_name', 'this model')}. "
            f"Removable units are: {', '.join(removable[:12])}{' ...' if len(removable) > 12 else ''} "
            f"(see zoo.depth_units(model))."
        )
    fixed = [n for n in names if not by_name[n].removable]
    if fixed:
        raise PlanError(
            f"Unit(s) {', '.join(map(repr, fixed[:5]))} cannot be removed: their removal would change shapes "
            f"(a block with a downsampling or projection shortcut). Only units with removable=True can be."
        )
    return by_name


def zero_branch(root: nn.Module, modules: Sequence[str]) -> None:
    """Remove a residual branch of `root`'s module tree: its first module becomes :class:`ZeroLike`, the rest
    :class:`PassThrough` (paths relative to `root`)."""
    for position, path in enumerate(modules):
        old = root.get_submodule(path)
        root.set_submodule(path, ZeroLike(old) if position == 0 else PassThrough(old))
