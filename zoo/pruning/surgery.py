"""Depth surgery: apply a plan to a model and physically build the shallower network.

A **plan** is plain data: ``{"remove": [unit names], "merge": true}``. Removing a residual unit
replaces it by its shortcut. Removing an activation linearises its block; with ``merge`` the convs that
are no longer separated by anything non-linear are merged into one conv:

* BatchNorm is folded into each conv first (eval statistics);
* the padding of a merged run is moved to its first conv (pad the input by p = p1 + p2*s1, then valid
  convs), which makes the merge exact: the merged kernel has size k1 + (k2 - 1) * s1 and stride s1 * s2;
* a merged conv stays depthwise only when every conv in it was depthwise;
* when a whole residual block collapses into one stride-1 conv with an identity shortcut, the shortcut is
  folded into the kernel by adding 1 to the centre tap of each channel.

With ``merge: false`` the block keeps its separate (BN-folded, padding-moved) convs as a
:class:`LinearRun`: the linearised network, numerically equal to the merged one. For progressive
linearisation the removed activations can stay inside the run, fading towards identity while fine-tuning
(:func:`set_linearisation`), and :func:`finalize_merges` merges once they are linear. A block whose
activations are removed becomes a :class:`ChainBlock`. Merges never cross a block boundary, so the
latency of a plan is a sum of per-segment terms (see :func:`segments`). GroupNorm (BiT) cannot be
folded, so BiT has no act units.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..deploy.fuse import fold_bn_into_conv
from ..errors import PlanError
from ..models.depth import BlockSpec, Chain, ConvOp, DepthUnit, PassThrough, ZeroLike, check_removable, zero_branch
from . import healing
from .folding import block_inputs, fold_zeros


class ChainBlock(nn.Module):
    """A rebuilt block: ``post_act(layers(x) [+ shortcut(x)])``.

    It keeps the original block's removability (an identity shortcut, possibly folded into a merged conv); its
    remaining activations are no longer depth units.
    """

    def __init__(self, layers: nn.Sequential, shortcut: nn.Module | None, post_act: nn.Module | None,
                 removable: bool = False):
        super().__init__()
        self.layers = layers
        self.shortcut = shortcut
        self.post_act = post_act
        self._removable = removable  # private: public attributes are part of latency-table keys

    def depth_spec(self) -> BlockSpec:
        return BlockSpec("block", self._removable)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layers(x)
        if self.shortcut is not None:
            out = out + self.shortcut(x)
        return self.post_act(out) if self.post_act is not None else out


def _is_depthwise(conv: nn.Conv2d) -> bool:
    return conv.groups > 1 and conv.groups == conv.in_channels == conv.out_channels


def _check_conv(conv: nn.Conv2d) -> None:
    k, s, p, d = conv.kernel_size, conv.stride, conv.padding, conv.dilation
    plain_groups = conv.groups == 1 or _is_depthwise(conv)
    if isinstance(p, str) or k[0] != k[1] or s[0] != s[1] or p[0] != p[1] or d != (1, 1) or not plain_groups:
        raise PlanError(f"Cannot merge {conv}: only square, symmetric-padded, undilated dense or depthwise convs do.")


def _fused(op: ConvOp) -> nn.Conv2d:
    """A copy of op.conv with its BatchNorm folded in (always with a bias)."""
    conv = copy.deepcopy(op.conv)
    if op.bn is not None:
        fold_bn_into_conv(conv, op.bn)
    elif conv.bias is None:
        conv.bias = nn.Parameter(torch.zeros(conv.out_channels, device=conv.weight.device))
    return conv


@torch.no_grad()
def compose_convs(a: nn.Conv2d, b: nn.Conv2d) -> nn.Conv2d:
    """One conv equal to ``b(a(z))`` on a pre-padded input z (both valid); padding = a.pad + b.pad * a.stride."""
    for conv in (a, b):
        _check_conv(conv)
    ka, sa, pa = a.kernel_size[0], a.stride[0], a.padding[0]
    kb, sb, pb = b.kernel_size[0], b.stride[0], b.padding[0]
    k, dw_a, dw_b = ka + (kb - 1) * sa, _is_depthwise(a), _is_depthwise(b)
    depthwise = dw_a and dw_b
    in_per_group = 1 if depthwise else a.in_channels
    weight = a.weight.new_zeros(b.out_channels, in_per_group, k, k)
    bias = b.bias.clone() if b.bias is not None else a.weight.new_zeros(b.out_channels)
    a_bias = a.bias if a.bias is not None else a.weight.new_zeros(a.out_channels)
    for u, v in itertools.product(range(kb), range(kb)):
        tap = b.weight[:, :, u, v]  # [out_b, in_b per group]
        window = (slice(None), slice(None), slice(u * sa, u * sa + ka), slice(v * sa, v * sa + ka))
        if depthwise:
            weight[window] += tap[:, :, None, None] * a.weight
            bias += tap[:, 0] * a_bias
        elif dw_b:  # dense a, depthwise b: channel m of b scales row m of a
            weight[window] += tap[:, 0, None, None, None] * a.weight
            bias += tap[:, 0] * a_bias
        elif dw_a:  # depthwise a, dense b: b's input channel m sees a's channel m only
            weight[window] += tap[:, :, None, None] * a.weight[:, 0][None]
            bias += tap @ a_bias
        else:
            weight[window] += torch.einsum("om,mixy->oixy", tap, a.weight)
            bias += tap @ a_bias
    merged = nn.Conv2d(a.in_channels, b.out_channels, k, stride=sa * sb, padding=pa + pb * sa,
                       groups=b.out_channels if depthwise else 1, bias=True,
                       device=weight.device, dtype=weight.dtype)
    merged.weight.copy_(weight)
    merged.bias.copy_(bias)
    return merged


class LinearisingAct(nn.Module):
    """``alpha * x + (1 - alpha) * act(x)``: an activation blended towards identity while fine-tuning.

    `alpha` is a buffer, so checkpoints taken while it fades hold it and reload exactly.
    """

    def __init__(self, act: nn.Module, alpha: float = 0.0):
        super().__init__()
        self.act = act
        self.register_buffer("blend", torch.tensor(float(alpha)))
        self.alpha = float(alpha)

    def set_alpha(self, alpha: float) -> None:
        self.alpha = float(alpha)
        self.blend.fill_(self.alpha)

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self.alpha = float(self.blend)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.alpha >= 1.0:
            return x
        return self.alpha * x + (1.0 - self.alpha) * self.act(x)


class LinearRun(nn.Module):
    """Convs with only removed (or fading) activations between them, padding moved to the front.

    Numerically equal to its merged conv once every blend is fully linear; :meth:`merged` builds that conv.
    """

    def __init__(self, convs: list[nn.Conv2d], blends: list[nn.Module]):
        super().__init__()
        padding, stride = 0, 1
        for conv in convs:  # the merged conv's padding: p1 + p2*s1 + p3*s1*s2 + ... (as compose_convs builds it)
            _check_conv(conv)
            padding, stride = padding + conv.padding[0] * stride, stride * conv.stride[0]
        self.pad = nn.ZeroPad2d(padding)
        self.convs = nn.ModuleList()
        for conv in convs:
            conv = copy.deepcopy(conv)
            conv.padding = (0, 0)
            self.convs.append(conv)
        self.blends = nn.ModuleList(blends)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.convs[0](self.pad(x))
        for blend, conv in zip(self.blends, self.convs[1:]):
            x = conv(blend(x))
        return x

    def merged(self) -> nn.Conv2d:
        if any(isinstance(b, LinearisingAct) and b.alpha < 1.0 for b in self.blends):
            raise PlanError("Cannot merge a run whose activations are not yet fully linear (alpha < 1).")
        conv = self.convs[0]
        for nxt in self.convs[1:]:
            conv = compose_convs(conv, nxt)
        conv.padding = (self.pad.padding[0],) * 2
        return conv


def _can_fold_identity(conv: nn.Module, shortcut: nn.Module | None) -> bool:
    return (isinstance(conv, nn.Conv2d) and isinstance(shortcut, nn.Identity) and conv.stride == (1, 1)
            and conv.in_channels == conv.out_channels and conv.kernel_size[0] % 2 == 1
            and conv.padding[0] == conv.kernel_size[0] // 2)


@torch.no_grad()
def _fold_identity(conv: nn.Conv2d) -> None:
    """Add the identity shortcut to a stride-1, same-size conv: +1 on each channel's centre tap."""
    c, depthwise = conv.kernel_size[0] // 2, conv.weight.shape[1] == 1 and conv.in_channels > 1
    for ch in range(conv.out_channels):
        conv.weight[ch, 0 if depthwise else ch, c, c] += 1.0


def merge_chain_block(block: ChainBlock) -> ChainBlock:
    """Replace each LinearRun of a rebuilt block by its merged conv; fold an identity shortcut if possible."""
    layers = [m.merged() if isinstance(m, LinearRun) else m for m in block.layers]
    shortcut = block.shortcut
    if len(layers) == 1 and _can_fold_identity(layers[0], shortcut):
        _fold_identity(layers[0])
        shortcut = None
    return ChainBlock(nn.Sequential(*layers), shortcut, block.post_act, block._removable)


def rebuild_block(block: nn.Module, removed_acts: set[str], merge: bool = True, blend: bool = False) -> ChainBlock:
    """The block with the given activations (paths relative to the block) removed and its convs merged.

    ``merge=False`` keeps each run of convs as a :class:`LinearRun` (the linearised network); with
    ``blend=True`` the removed activations stay inside it as :class:`LinearisingAct` (alpha 0) so that
    fine-tuning can fade them out before :func:`merge_chain_block` merges the run.
    """
    spec = block.depth_spec()
    chain = spec.chain
    if chain is None:
        raise PlanError(f"{type(block).__name__} declares no conv chain, so it has no activation to remove.")
    names = {id(m): name for name, m in block.named_modules()}
    runs: list[tuple[list[nn.Conv2d], list[nn.Module]]] = [([], [])]
    tails: list[list[nn.Module]] = []
    for op in chain.ops:
        convs, blends = runs[-1]
        convs.append(_fused(op))
        removed = op.act is not None and names.get(id(op.act)) in removed_acts
        act = None if removed else op.act
        if act is not None or op.after:
            tails.append([m for m in (act, *op.after) if m is not None])
            runs.append(([], []))
        elif op.act is not None and removed:
            blends.append(LinearisingAct(op.act) if blend else nn.Identity())
        else:
            blends.append(nn.Identity())
    if not runs[-1][0]:
        runs.pop()
    else:
        tails.append([])
    layers: list[nn.Module] = []
    for (convs, blends), tail in zip(runs, tails):
        layers.append(convs[0] if len(convs) == 1 else LinearRun(convs, blends[: len(convs) - 1]))
        layers.extend(tail)
    rebuilt = ChainBlock(nn.Sequential(*layers), chain.shortcut, chain.post_act, spec.removable)
    return merge_chain_block(rebuilt) if merge else rebuilt


def _within(path: str, outer: str) -> bool:
    return path == outer or path.startswith(outer + ".")


def _paths(unit: DepthUnit) -> tuple[str, ...]:
    """The module paths a unit's removal replaces: a sub-layer's branch, else the unit's own module."""
    return unit.merge if unit.kind == "sublayer" else (unit.name,)


def covers(outer: DepthUnit, inner: DepthUnit) -> bool:
    """Whether removing `outer` removes `inner` with it: every module `inner`'s removal replaces lies in one that
    `outer`'s replaces (a residual sub-layer nested in another's branch, anything inside a removed block)."""
    if outer.name == inner.name or outer.kind == "act":
        return False
    return all(any(_within(p, q) for q in _paths(outer)) for p in _paths(inner))


def uncovered(units: dict[str, DepthUnit], removed: list[str] | frozenset[str]) -> list[str]:
    """`removed` without the units another removed unit covers (their removal is already done by it), in order.
    Units whose removals touch the same modules without one covering the other cannot be applied together: a
    :class:`PlanError` (discovery never offers such a pair: branches of residual additions nest or are disjoint)."""
    chosen = [units[n] for n in dict.fromkeys(removed)]
    kept = [u for u in chosen if u.kind == "act" or not any(covers(o, u) for o in chosen)]
    for a, b in itertools.combinations([u for u in kept if u.kind != "act"], 2):
        if any(_within(p, q) or _within(q, p) for p in _paths(a) for q in _paths(b)):
            raise PlanError(f"Units {a.name!r} and {b.name!r} overlap without one containing the other: they cannot "
                            f"be removed together.")
    return [u.name for u in kept]


def _block_of(unit_name: str, block_names: list[str]) -> str:
    for name in block_names:
        if unit_name.startswith(name + "."):
            return name
    raise PlanError(f"Activation unit {unit_name!r} lies in no block of the model.")


PLAN_KEYS = ("remove", "merge", "blend", "model", "meta")


def _validate_plan(plan: dict[str, Any]) -> None:
    if not isinstance(plan, dict) or not isinstance(plan.get("remove", []), list):
        raise PlanError(f"A plan is a mapping {{'remove': [unit names], 'merge': bool}}; got {plan!r}.")
    unknown = set(plan) - set(PLAN_KEYS)
    if unknown:
        raise PlanError(f"Unknown plan keys {sorted(unknown)}; allowed: {', '.join(PLAN_KEYS)}.")
    if not all(isinstance(name, str) for name in plan.get("remove", [])):
        raise PlanError(f"A plan's 'remove' list holds unit names (strings); got {plan['remove']!r}.")
    for key in ("merge", "blend"):
        if key in plan and not isinstance(plan[key], bool):
            raise PlanError(f"A plan's {key!r} is true or false; got {plan[key]!r}.")


def _combined(model: nn.Module, removed: list[str], merge: bool, blend: bool) -> dict[str, Any]:
    """The plan recorded on `model` after this one: an earlier plan's removals come first (same merge/blend)."""
    before = getattr(model, "zoo_plan", None) or {"remove": []}
    if before["remove"] and (bool(before.get("merge", True)) != merge or bool(before.get("blend")) != blend):
        raise PlanError(f"This model was pruned with merge={before.get('merge', True)}, "
                        f"blend={bool(before.get('blend'))}; a further plan must use the same settings.")
    plan: dict[str, Any] = {"remove": [*before["remove"], *removed], "merge": merge}
    if blend:
        plan["blend"] = True
    return plan


def apply_plan(model: nn.Module, plan: dict[str, Any], inplace: bool = True, blend: bool | None = None,
               heal: str = "none", calibration: Sequence[torch.Tensor] | None = None,
               ridge: float = healing.RIDGE, strict: bool = True) -> nn.Module:
    """Apply `plan` (see module docstring) and record it on the model as ``model.zoo_plan``.

    ``heal="linear"`` fits, for each run of removed residual units, a channel map on the `calibration` inputs and
    fuses it into the last linear op of the kept unit before the run (:mod:`zoo.pruning.healing`;
    ``model.zoo_heal`` lists the patches, ``model.zoo_unhealed`` the runs left as they were, with why); a run it
    cannot heal raises :class:`~zoo.pruning.healing.HealError` before anything is changed, or, with
    ``strict=False``, is left unhealed. The maps are fitted on a pruned copy: with ``inplace=False`` that copy is
    the result; in place, they are fused into `model` after its own surgery.

    ``blend=True`` (with ``merge: false``; or ``"blend": true`` in the plan) keeps removed activations as fading
    :class:`LinearisingAct` modules for progressive linearisation; :func:`finalize_merges` merges afterwards.
    A model pruned before records the union of both plans, so ``zoo.load(zoo.save_checkpoint(model))`` rebuilds it.
    """
    _validate_plan(plan)
    if plan.get("model") and getattr(model, "zoo_name", None) and plan["model"] != model.zoo_name:
        raise PlanError(f"The plan was made for {plan['model']!r}, not for {model.zoo_name!r}.")
    removed = list(plan.get("remove", []))
    merge = bool(plan.get("merge", True))
    blend = bool(plan.get("blend", False)) if blend is None else blend
    if blend and merge:
        raise PlanError("A blended plan (fading activations) must have merge: false; merge with finalize_merges.")
    units = check_removable(model, removed)
    record = _combined(model, removed, merge, blend)
    healing.check_heal(heal, calibration)
    patches: list[tuple[healing.Patch, torch.Tensor]] = []
    if heal == "linear":  # fitted on a pruned copy, so that every refusal comes before the model changes
        gaps = _gap_targets(model, removed, calibration)
        healed = apply_plan(model, plan, inplace=False, blend=blend)
        set_linearisation(healed, 1.0)  # fitted on the network as it ends up: removed activations gone
        patches, unhealed = healing.heal(healed, gaps, list(calibration), ridge, strict)
        set_linearisation(healed, 0.0)  # fading activations start where a fresh plan's do
        healed.zoo_heal = [patch.to_dict() for patch, _ in patches]
        healed.zoo_unhealed = unhealed
        if not inplace:
            return healed
    if not inplace:
        model = copy.deepcopy(model)
    block_names = [u.name for u in units.values() if u.kind == "block"]
    acts_by_block: dict[str, set[str]] = {}
    for name in removed:
        if units[name].kind == "act":
            block = _block_of(name, block_names)
            acts_by_block.setdefault(block, set()).add(name[len(block) + 1:])
    kept = uncovered(units, removed)
    for name in kept:
        if units[name].kind == "sublayer":
            remove_branch(model, model, units[name].merge)
        elif units[name].kind != "act":
            model.set_submodule(name, removed_module(model, name, model.get_submodule(name)))
    _fold(model, [_block_of(n, block_names) for n in kept if units[n].kind == "sublayer"])
    for block_name, acts in acts_by_block.items():
        if block_name in removed:
            continue
        block = model.get_submodule(block_name)
        model.set_submodule(block_name, rebuild_block(block, acts, merge, blend))
    for patch, patch_map in patches:  # the same surgery as the copy's: the same op at the same path
        healing.fuse(model, patch.into, patch_map)
    model.zoo_plan = record
    if heal == "linear":
        model.zoo_heal, model.zoo_unhealed = healed.zoo_heal, healed.zoo_unhealed
    return model


def removed_module(model: nn.Module, path: str, old: nn.Module, zeros: bool = False) -> nn.Module:
    """What the module at `path` (of `model`) becomes when its unit is removed: the model's own removal where it
    declares one (``model.removed_module(path, old, zeros)``: a transformers layer called with its stream by keyword,
    or returning it in a tuple), else :class:`PassThrough` (its input) or, for a branch's first module (`zeros`),
    :class:`~zoo.models.depth.ZeroLike`."""
    own = getattr(model, "removed_module", None)
    if own is not None:
        return own(path, old, zeros)
    return ZeroLike(old) if zeros else PassThrough(old)


def remove_branch(model: nn.Module, root: nn.Module, paths: Sequence[str], prefix: str = "") -> None:
    """Remove a residual branch (`paths`, in call order, relative to `root`, a module of `model` at `prefix`): as
    :func:`~zoo.models.depth.zero_branch`, by the model's own removals where it declares them."""
    if not hasattr(model, "removed_module"):
        zero_branch(root, paths)
        return
    for position, path in enumerate(paths):
        root.set_submodule(path, removed_module(model, prefix + path, root.get_submodule(path), zeros=position == 0))


def _gap_targets(model: nn.Module, removed: list[str], calibration: Any) -> list[healing.Gap]:
    """The unpruned model's stream after each gap of `removed` on the calibration inputs (eval mode; the model's mode
    is kept)."""
    with healing.evaluating(model):
        return healing.gap_targets(model, removed, list(calibration))


def _inputs_of(model: nn.Module, names: list[str]) -> dict[str, tuple[tuple, dict]]:
    """Each named module's input in a forward of `model` on its example input ({} where it does not run here, as on
    the meta device)."""
    if not names or not hasattr(model, "example_input"):
        return {}
    try:
        return block_inputs(model, names, model.example_input(1))
    except Exception:  # noqa: BLE001 - a model that does not run here keeps its zeros
        return {}


def _fold(model: nn.Module, blocks: list[str]) -> None:
    """Fold the zeros of removed sub-layers out of `blocks` (:func:`~zoo.pruning.folding.fold_zeros`), each checked
    on its own input."""
    blocks = list(dict.fromkeys(blocks))
    for name, (args, kwargs) in _inputs_of(model, blocks).items():
        model.set_submodule(name, fold_zeros(model.get_submodule(name), args, kwargs))


def remove_units(model: nn.Module, names: list[str] | tuple[str, ...], inplace: bool = False) -> nn.Module:
    """Remove depth units: residual units become their shortcut, removed activations linearise their block.

    The same as ``apply_plan(model, {"remove": names, "merge": False})``: the convs around a removed activation stay
    separate (BatchNorm folded) and the plan is recorded, so a saved model reloads exactly.
    """
    if isinstance(names, str) or not isinstance(names, (list, tuple)):
        raise PlanError(f"remove_units takes a list of unit names (zoo.depth_units(model)); got {names!r}.")
    return apply_plan(model, {"remove": list(names), "merge": False}, inplace=inplace)


def set_linearisation(model: nn.Module, alpha: float) -> None:
    """Set the blend of every fading activation (0: original activation, 1: identity)."""
    for module in model.modules():
        if isinstance(module, LinearisingAct):
            module.set_alpha(alpha)


def finalize_merges(model: nn.Module) -> nn.Module:
    """Merge every linearised run of a model built with ``merge: false`` in place; the plan becomes merged."""
    set_linearisation(model, 1.0)
    for name, module in list(model.named_modules()):
        if isinstance(module, ChainBlock):
            model.set_submodule(name, merge_chain_block(module))
    if getattr(model, "zoo_plan", None):
        model.zoo_plan = {"remove": model.zoo_plan["remove"], "merge": True}
    return model


@dataclass(frozen=True)
class Segment:
    """A part of the network whose latency depends only on which of its own units are removed."""

    name: str                 # module path (a block, or a RetNet sub-layer)
    acts: tuple[str, ...]     # units inside it (full names): mergeable activations, sub-layers
    removable: bool           # the whole segment can be replaced by its shortcut
    nested: tuple[tuple[str, str], ...] = ()  # (outer, inner): removing outer removes inner with it

    def variants(self) -> list[frozenset[str]]:
        """Every distinct choice for this segment, as the set of its unit names removed (a set holding a unit and one
        nested in it is the same network as the outer unit alone, so it is left out)."""
        choices = [frozenset(c) for r in range(len(self.acts) + 1) for c in itertools.combinations(self.acts, r)
                   if not any(o in c and i in c for o, i in self.nested)]
        return choices + ([frozenset({self.name})] if self.removable else [])

    def variant_of(self, removed: set[str] | frozenset[str]) -> frozenset[str]:
        """This segment's variant when the units `removed` are (a unit nested in another removed one drops out)."""
        if self.name in removed:
            return frozenset({self.name})
        chosen = {a for a in self.acts if a in removed}
        return frozenset(chosen - {i for o, i in self.nested if o in chosen})


INSIDE = ("act", "sublayer")  # units that live inside a block: the block's segment varies over them


def segments(model: nn.Module) -> list[Segment]:
    """The model's segments, in order: each residual unit with the units inside it (mergeable activations; the
    sub-layers of a traced transformer block)."""
    specs = model.depth_unit_specs()
    owners = [u for u in specs if u.kind not in INSIDE]
    for a, b in itertools.combinations(owners, 2):
        assert not (_within(a.name, b.name) or _within(b.name, a.name)), f"segments {a.name} and {b.name} overlap"
    acts: dict[str, list[DepthUnit]] = {u.name: [] for u in owners}
    for unit in specs:
        if (unit.kind == "act" and unit.mergeable) or unit.kind == "sublayer":
            acts[_block_of(unit.name, list(acts))].append(unit)
    found = []
    for owner in owners:
        inside = acts[owner.name]
        nested = tuple((o.name, i.name) for o in inside for i in inside if covers(o, i))
        found.append(Segment(owner.name, tuple(u.name for u in inside), owner.removable, nested))
    return found


def build_segment(model: nn.Module, segment: Segment, removed: frozenset[str], merge: bool = True) -> nn.Module:
    """The segment's module after removing `removed` (a copy; the model is untouched)."""
    if segment.name in removed:
        return removed_module(model, segment.name, model.get_submodule(segment.name))
    module = copy.deepcopy(model.get_submodule(segment.name))
    if not removed:
        return module
    units = {u.name: u for u in model.depth_unit_specs()}
    prefix = segment.name + "."
    sublayers = [n for n in uncovered(units, removed) if units[n].kind == "sublayer"]
    for name in sublayers:
        remove_branch(model, module, [m[len(prefix):] for m in units[name].merge], prefix)
    if sublayers and (inputs := _inputs_of(model, [segment.name])):
        module = fold_zeros(module, *inputs[segment.name])
    relative = {name[len(prefix):] for name in removed if units[name].kind == "act"}
    return rebuild_block(module, relative, merge) if relative else module


__all__ = ["Chain", "ChainBlock", "ConvOp", "LinearRun", "LinearisingAct", "Segment", "apply_plan", "build_segment",
           "compose_convs", "finalize_merges", "rebuild_block", "remove_units", "segments", "set_linearisation"]
