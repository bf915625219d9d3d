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

With ``merge: false`` the block keeps its separate (BN-folded, padding-moved) convs: the linearised
network, numerically equal to the merged one. A block whose activations are removed becomes a
:class:`ChainBlock`. Merges never cross a block boundary, so the latency of a plan is a sum of
per-segment terms (see :func:`segments`). GroupNorm (BiT) cannot be folded, so BiT has no act units.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .depth import _check_names
from .errors import PlanError
from .fuse import fold_bn_into_conv


@dataclass
class ConvOp:
    """One conv of a block's chain: the conv, its BatchNorm, the activation after it and modules after that."""

    conv: nn.Conv2d
    bn: nn.BatchNorm2d | None
    act: nn.Module | None = None
    act_unit: str | None = None  # the act's path relative to the block, e.g. "bn1.act"
    after: list[nn.Module] = field(default_factory=list)  # e.g. blur-pool, SE: non-mergeable barriers


@dataclass
class Chain:
    """A block seen as ``post_act(chain(x) + shortcut(x))``; shortcut None means no residual."""

    ops: list[ConvOp]
    shortcut: nn.Module | None
    post_act: nn.Module | None = None


class ChainBlock(nn.Module):
    """A rebuilt block: ``post_act(layers(x) [+ shortcut(x)])``."""

    def __init__(self, layers: nn.Sequential, shortcut: nn.Module | None, post_act: nn.Module | None):
        super().__init__()
        self.layers = layers
        self.shortcut = shortcut
        self.post_act = post_act

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


def _merge_run(convs: list[nn.Conv2d], merge: bool) -> nn.Module:
    """A run of convs with nothing non-linear between them: one merged conv, or the padding-moved chain."""
    if len(convs) == 1:
        return convs[0]
    merged = convs[0]
    for conv in convs[1:]:
        merged = compose_convs(merged, conv)
    if merge:
        return merged
    valid = []
    for conv in convs:
        conv = copy.deepcopy(conv)
        conv.padding = (0, 0)
        valid.append(conv)
    return nn.Sequential(nn.ZeroPad2d(merged.padding[0]), *valid)


@torch.no_grad()
def _fold_identity(conv: nn.Conv2d) -> None:
    """Add the identity shortcut to a stride-1, same-size conv: +1 on each channel's centre tap."""
    c, k = conv.kernel_size[0] // 2, conv.weight.shape[1]
    for ch in range(conv.out_channels):
        conv.weight[ch, 0 if k == 1 else ch, c, c] += 1.0


def rebuild_block(block: nn.Module, removed_acts: set[str], merge: bool = True) -> ChainBlock:
    """The block with the given activations (paths relative to the block) removed and its convs merged."""
    chain: Chain = block.chain()
    runs: list[list[nn.Conv2d]] = [[]]
    tails: list[list[nn.Module]] = []
    for op in chain.ops:
        runs[-1].append(_fused(op))
        act = None if op.act_unit in removed_acts else op.act
        if act is not None or op.after:
            tails.append([m for m in (act, *op.after) if m is not None])
            runs.append([])
    if not runs[-1]:
        runs.pop()
    else:
        tails.append([])
    layers: list[nn.Module] = []
    for run, tail in zip(runs, tails):
        layers.append(_merge_run(run, merge))
        layers.extend(tail)
    shortcut = chain.shortcut
    only = layers[0] if len(layers) == 1 else None
    if (merge and isinstance(only, nn.Conv2d) and isinstance(shortcut, nn.Identity) and only.stride == (1, 1)
            and only.in_channels == only.out_channels and only.kernel_size[0] % 2 == 1
            and only.padding[0] == only.kernel_size[0] // 2):
        _fold_identity(only)
        shortcut = None
    return ChainBlock(nn.Sequential(*layers), shortcut, chain.post_act)


def _block_of(unit_name: str, block_names: list[str]) -> str:
    for name in block_names:
        if unit_name.startswith(name + "."):
            return name
    raise PlanError(f"Activation unit {unit_name!r} lies in no block of the model.")


def _validate_plan(plan: dict[str, Any]) -> None:
    if not isinstance(plan, dict) or not isinstance(plan.get("remove", []), list):
        raise PlanError(f"A plan is a mapping {{'remove': [unit names], 'merge': bool}}; got {plan!r}.")
    unknown = set(plan) - {"remove", "merge", "model", "meta"}
    if unknown:
        raise PlanError(f"Unknown plan keys {sorted(unknown)}; allowed: remove, merge, model, meta.")


def apply_plan(model: nn.Module, plan: dict[str, Any], inplace: bool = True) -> nn.Module:
    """Apply `plan` (see module docstring) and record it on the model as ``model.zoo_plan``."""
    _validate_plan(plan)
    if plan.get("model") and getattr(model, "zoo_name", None) and plan["model"] != model.zoo_name:
        raise PlanError(f"The plan was made for {plan['model']!r}, not for {model.zoo_name!r}.")
    removed = list(plan.get("remove", []))
    units = _check_names(model, removed)
    if not inplace:
        model = copy.deepcopy(model)
    block_names = [u.name for u in units.values() if u.kind == "block"]
    acts_by_block: dict[str, set[str]] = {}
    for name in removed:
        if units[name].kind == "act":
            block = _block_of(name, block_names)
            acts_by_block.setdefault(block, set()).add(name[len(block) + 1:])
    for name in removed:
        if units[name].kind != "act":
            model.set_submodule(name, nn.Identity())
    merge = bool(plan.get("merge", True))
    for block_name, acts in acts_by_block.items():
        if block_name in removed:
            continue
        block = model.get_submodule(block_name)
        model.set_submodule(block_name, rebuild_block(block, acts, merge))
    model.zoo_plan = {"remove": removed, "merge": merge}
    return model


@dataclass(frozen=True)
class Segment:
    """A part of the network whose latency depends only on which of its own units are removed."""

    name: str                 # module path (a block, or a RetNet sub-layer)
    acts: tuple[str, ...]     # act units inside it (full names)
    removable: bool           # the whole segment can be replaced by its shortcut

    def variants(self) -> list[frozenset[str]]:
        """Every choice for this segment, as the set of its unit names removed."""
        choices = [frozenset(c) for r in range(len(self.acts) + 1) for c in itertools.combinations(self.acts, r)]
        return choices + ([frozenset({self.name})] if self.removable else [])


def segments(model: nn.Module) -> list[Segment]:
    """The model's segments, in order: each residual unit with the act units inside it."""
    specs = model.depth_unit_specs()
    owners = [u for u in specs if u.kind != "act"]
    acts: dict[str, list[str]] = {u.name: [] for u in owners}
    for unit in specs:
        if unit.kind == "act" and unit.mergeable:
            acts[_block_of(unit.name, list(acts))].append(unit.name)
    return [Segment(u.name, tuple(acts[u.name]), u.removable) for u in owners]


def build_segment(model: nn.Module, segment: Segment, removed: frozenset[str], merge: bool = True) -> nn.Module:
    """The segment's module after removing `removed` (a copy; the model is untouched)."""
    if segment.name in removed:
        return nn.Identity()
    module = copy.deepcopy(model.get_submodule(segment.name))
    if not removed:
        return module
    relative = {name[len(segment.name) + 1:] for name in removed}
    return rebuild_block(module, relative, merge)


__all__ = ["Chain", "ChainBlock", "ConvOp", "Segment", "apply_plan", "build_segment", "compose_convs",
           "rebuild_block", "segments"]
