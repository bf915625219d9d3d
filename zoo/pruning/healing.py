"""Healing a removal for free: a fitted linear map on channels, fused into a weight that is already there.

A plan's removed blocks form **gaps** (runs of blocks next to each other in forward order). For a gap, the kept block
right before it (`before`) hands the stream on; with the gap removed the stream after `before` is what the next
module gets, where the unpruned network gave it the stream after the gap. The patch is a channel map ``T = I + D``
applied to the output of the last weighted linear op of `before` (``into``: a Linear, or a Conv with groups 1),
fitted by ridge least squares on calibration batches so that the stream after `before` matches the stream after the
gap (ReplaceMe's algebra, REFERENCE section 12, on any residual network). ``T`` is then multiplied into ``into``'s
weight and bias, so the pruned network has no new parameter and no new op.

Every patch is **proven exact before it is fitted**: on the calibration input, a random change ``E`` of ``into``'s
output must change `before`'s output by exactly ``g * E`` for a per-channel ``g`` (1 for a branch that ends in the
op; a BatchNorm's or a layer scale's factor otherwise), and the gap's first block must take `before`'s output as
its input. Where no op of `before` passes (an activation after the addition, as in ResNet's basic blocks; a
depthwise conv last), the gap is refused, with that reason: no layer is ever added.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from ..errors import PlanError

RIDGE = 1e-3  # the ridge, relative to the mean eigenvalue of the op's output covariance
HEALS = ("none", "linear")


class HealError(PlanError):
    """A plan that cannot be healed as asked (no linear op to fold into, too little calibration data)."""


@dataclass
class Patch:
    """One gap's channel map: the removed blocks, the kept block before them, the op it is fused into, how many
    calibration rows fitted it, and the stream's error after the gap on them (relative to its norm) without and with
    it."""

    gap: tuple[str, ...]
    before: str
    into: str
    rows: int
    error_unhealed: float
    error_healed: float
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "gap": list(self.gap)}


def gaps(model: nn.Module, removed: Iterable[str]) -> list[tuple[str, list[str]]]:
    """(the kept block before, the run of removed blocks) for each run of removed blocks, in forward order."""
    blocks = [u.name for u in model.depth_unit_specs() if u.kind == "block"]
    removed = set(removed)
    runs: list[tuple[str, list[str]]] = []
    for i, name in enumerate(blocks):
        if name not in removed:
            continue
        if runs and blocks[i - 1] in removed and runs[-1][1][-1] == blocks[i - 1]:
            runs[-1][1].append(name)
        else:
            runs.append((blocks[i - 1] if i else "", [name]))
    return runs


def _channel_axis(module: nn.Module) -> int:
    return -1 if isinstance(module, nn.Linear) else 1


def _rows(value: torch.Tensor, axis: int) -> torch.Tensor:
    """(positions, channels) in float64: the channel axis last, everything else flattened."""
    return value.detach().movedim(axis, -1).reshape(-1, value.shape[axis]).double()


def _candidates(block: nn.Module) -> tuple[list[str], list[Any]]:
    """Hooks that list, in call order, `block`'s weighted linear ops a full channel map folds into."""
    order: list[str] = []
    names = {id(m): n for n, m in block.named_modules()}
    ops = [m for m in block.modules() if isinstance(m, nn.Linear) or (
        isinstance(m, (nn.Conv1d, nn.Conv2d)) and m.groups == 1)]
    handles = [m.register_forward_hook(lambda m, a, o: order.append(names[id(m)])) for m in ops]
    return order, handles


class _Capture:
    """Forward hooks that keep named modules' inputs or outputs."""

    def __init__(self, model: nn.Module) -> None:
        self.model, self.values, self.handles = model, {}, []

    def output(self, path: str, key: str, change: torch.Tensor | None = None) -> None:
        def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
            self.values[key] = output.detach()
            return output + change.to(output) if change is not None else output
        self.handles.append(self.model.get_submodule(path).register_forward_hook(hook))

    def input(self, path: str, key: str) -> None:
        def hook(module: nn.Module, args: tuple) -> None:
            self.values[key] = args[0].detach()
        self.handles.append(self.model.get_submodule(path).register_forward_pre_hook(hook))

    def run(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        self.values = {}
        try:
            with torch.no_grad():
                self.model(x)
        finally:
            for handle in self.handles:
                handle.remove()
            self.handles = []
        return self.values


def _gain(model: nn.Module, before: str, into: str, x: torch.Tensor) -> torch.Tensor | None:
    """The per-channel factor by which a change of `into`'s output reaches `before`'s output, exactly; None when it
    does not reach it that way (an activation after the addition, a layout change, a mix of channels)."""
    capture = _Capture(model)
    capture.output(into, "op")
    capture.output(before, "out")
    base = capture.run(x)
    if base["op"].shape != base["out"].shape:
        return None
    axis = _channel_axis(model.get_submodule(into))
    change = torch.randn(base["op"].shape, generator=torch.Generator().manual_seed(0)).to(base["op"])
    capture.output(into, "op", change)
    capture.output(before, "out")
    moved = capture.run(x)["out"] - base["out"]
    e, r = _rows(change, axis), _rows(moved, axis)
    gain = (e * r).sum(0) / (e * e).sum(0)
    scale = float(r.abs().max()) or 1.0
    if not torch.isfinite(gain).all() or bool((gain == 0).any()) or float((r - e * gain).abs().max()) > 1e-4 * scale:
        return None
    return gain


def _target(model: nn.Module, before: str, x: torch.Tensor) -> tuple[str, torch.Tensor] | str:
    """The op of `before` a patch folds into and its gain, or why none."""
    block = model.get_submodule(before)
    order, handles = _candidates(block)
    try:
        with torch.no_grad():
            model(x)
    finally:
        for handle in handles:
            handle.remove()
    for name in reversed(list(dict.fromkeys(order))):
        path = f"{before}.{name}" if name else before
        gain = _gain(model, before, path, x)
        if gain is not None:
            return path, gain
    return (f"no Linear or full Conv of {before} reaches its output unchanged (an activation after its addition, a "
            f"depthwise or no weighted op last)")


def fit_patch(model: nn.Module, before: str, gap: Sequence[str], calibration: Sequence[torch.Tensor],
              ridge: float = RIDGE) -> tuple[Patch, torch.Tensor]:
    """Fit the channel map for one gap on the unpruned `model` (see the module docstring); returns the patch and the
    map ``T`` (channels x channels) for the op's output. Raises :class:`HealError` where the gap cannot be healed."""
    started = time.perf_counter()
    if not before:
        raise HealError(f"the gap {gap[0]}.. starts the network: no kept block before it to fold a patch into")
    found = _target(model, before, calibration[0])
    if isinstance(found, str):
        raise HealError(f"cannot heal the gap {', '.join(gap)}: {found}")
    into, gain = found
    axis = _channel_axis(model.get_submodule(into))
    zs, wants, ys = [], [], []
    for x in calibration:
        capture = _Capture(model)
        capture.output(into, "z")
        capture.output(before, "after")
        capture.input(gap[0], "gap_in")
        capture.output(gap[-1], "gap_out")
        seen = capture.run(x)
        if not torch.equal(seen["gap_in"], seen["after"]):
            raise HealError(f"cannot heal the gap {', '.join(gap)}: its first block does not take {before}'s output "
                            f"as its input (a module between them)")
        zs.append(_rows(seen["z"], axis))
        wants.append(_rows(seen["gap_out"] - seen["after"], axis))  # the change wanted in the stream
        ys.append(_rows(seen["gap_out"], axis))
    z, want, y = torch.cat(zs), torch.cat(wants), torch.cat(ys)
    d = want / gain  # the change wanted at the op's output
    channels = z.shape[1]
    if ridge <= 0 and z.shape[0] < channels:
        raise HealError(f"{z.shape[0]} calibration rows fit a {channels}x{channels} map only with a ridge "
                        f"(heal_ridge > 0) or more calibration batches (at least {channels} rows)")
    gram = z.T @ z
    damp = ridge * float(torch.trace(gram)) / channels
    delta = torch.linalg.solve(gram + damp * torch.eye(channels, dtype=gram.dtype), z.T @ d).T  # D: out = z @ D.T
    norm = float(y.norm()) or 1.0
    unhealed, healed = float(want.norm()) / norm, float((want - (z @ delta.T) * gain).norm()) / norm
    patch = Patch(tuple(gap), before, into, z.shape[0], unhealed, healed, time.perf_counter() - started)
    return patch, torch.eye(channels, dtype=delta.dtype) + delta


def fuse(model: nn.Module, into: str, patch_map: torch.Tensor) -> None:
    """Multiply the channel map into the op's weight and bias, in place (the op's output becomes ``T @ output``)."""
    op = model.get_submodule(into)
    with torch.no_grad():
        t = patch_map.to(op.weight.dtype).to(op.weight.device)
        op.weight.copy_(torch.einsum("oc,c...->o...", t, op.weight))
        if op.bias is not None:
            op.bias.copy_(t @ op.bias)


def heal_plan(model: nn.Module, removed: Sequence[str], calibration: Sequence[torch.Tensor], ridge: float = RIDGE
              ) -> list[tuple[Patch, torch.Tensor]]:
    """Every gap of `removed` fitted on the unpruned `model` (in eval mode), in forward order."""
    runs = gaps(model, removed)
    for before, gap in runs:
        if before and any(name.startswith(before + ".") for name in removed):
            raise HealError(f"cannot heal the gap {', '.join(gap)}: {before}, the block its patch folds into, is "
                            f"rebuilt by the plan's removed activations")
    mode = model.training
    model.eval()
    try:
        return [fit_patch(model, before, gap, calibration, ridge) for before, gap in runs]
    finally:
        model.train(mode)


def check_heal(heal: str, calibration: Any) -> None:
    if heal not in HEALS:
        raise HealError(f"heal={heal!r} is not one of {', '.join(HEALS)}")
    if heal == "linear" and not calibration:
        raise HealError("heal='linear' needs calibration batches (a list of input tensors)")
