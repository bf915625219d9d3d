"""Healing a removal for free: a fitted linear map on channels, fused into a weight that is already there.

A plan's removed residual units (blocks; RetNet's retention and FFN sub-layers: units whose module outputs the
stream) form **gaps** (runs of them next to each other in forward order). For a gap, the kept unit right before it
(`before`) hands the stream on; with the gap removed the stream after `before` is what the next
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
RESIDUAL_KINDS = ("block", "retention", "ffn")  # units whose module's output is the stream (gaps are runs of them)


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
    """(the kept unit before, the run of removed units) for each run of removed residual units (blocks; RetNet's
    retention and FFN sub-layers) next to each other in forward order."""
    blocks = [u.name for u in model.depth_unit_specs() if u.kind in RESIDUAL_KINDS]
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


def not_healed(kinds: dict[str, str], removed: Iterable[str]) -> dict[str, str]:
    """The removed units no gap covers (a discovered block's sub-layer: its branch ends inside the block), with why,
    from each unit's kind (of the unpruned model); they stay removed, unhealed."""
    return {name: f"{name} is a sub-layer of its block ({kinds[name]}): only runs of whole residual units are healed"
            for name in removed if kinds.get(name) == "sublayer"}


def _first(value: Any) -> torch.Tensor:
    """A module's output stream: the tensor itself, or the first of a tuple (RetNet's retention returns its state
    too)."""
    return value[0] if isinstance(value, (tuple, list)) else value


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
        def hook(module: nn.Module, args: tuple, output: Any) -> Any:
            self.values[key] = _first(output).detach()
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


@dataclass
class Gap:
    """A run of removed residual units, the kept unit before it, and what the unpruned network's stream was after
    the run on each calibration input (the target), or why it cannot be healed."""

    before: str
    blocks: list[str]
    targets: list[torch.Tensor]
    reason: str = ""


def gap_targets(model: nn.Module, removed: Sequence[str], calibration: Sequence[torch.Tensor]) -> list[Gap]:
    """Every gap of `removed` with its targets, on the unpruned `model`."""
    found = [Gap(before, blocks, []) for before, blocks in gaps(model, removed)]
    for gap in found:
        if not gap.before:
            gap.reason = f"the gap {gap.blocks[0]}.. starts the network: no kept block before it to fold a patch into"
    live = [g for g in found if not g.reason]
    for x in calibration:
        capture = _Capture(model)
        for i, gap in enumerate(live):
            capture.output(gap.before, f"after{i}")
            capture.input(gap.blocks[0], f"in{i}")
            capture.output(gap.blocks[-1], f"out{i}")
        seen = capture.run(x)
        for i, gap in enumerate(live):
            if not torch.equal(seen[f"in{i}"], seen[f"after{i}"]):
                gap.reason = (f"its first block does not take {gap.before}'s output as its input (a module between "
                              f"them)")
            gap.targets.append(seen[f"out{i}"])
    for gap in found:
        if gap.reason and not gap.reason.startswith("the gap"):
            gap.reason = f"cannot heal the gap {', '.join(gap.blocks)}: {gap.reason}"
    return found


def fit_patch(pruned: nn.Module, gap: Gap, calibration: Sequence[torch.Tensor], ridge: float = RIDGE
              ) -> tuple[Patch, torch.Tensor]:
    """Fit one gap's channel map on the `pruned` network (its gap removed, earlier gaps' patches in): the stream after
    the kept block must become the unpruned network's stream after the gap (`gap.targets`). Returns the patch and the
    map ``T`` for the op's output; raises :class:`HealError` where the gap cannot be healed."""
    started = time.perf_counter()
    if gap.reason:
        raise HealError(gap.reason)
    found = _target(pruned, gap.before, calibration[0])
    if isinstance(found, str):
        raise HealError(f"cannot heal the gap {', '.join(gap.blocks)}: {found}")
    into, gain = found
    axis = _channel_axis(pruned.get_submodule(into))
    zs, wants, ys = [], [], []
    for x, target in zip(calibration, gap.targets):
        capture = _Capture(pruned)
        capture.output(into, "z")
        capture.output(gap.before, "after")
        seen = capture.run(x)
        if seen["after"].shape != target.shape:
            raise HealError(f"cannot heal the gap {', '.join(gap.blocks)}: {gap.before}'s output is shaped "
                            f"{tuple(seen['after'].shape)}, the stream after the gap {tuple(target.shape)}")
        zs.append(_rows(seen["z"], axis))
        wants.append(_rows(target - seen["after"], axis))  # the change wanted in the stream
        ys.append(_rows(target, axis))
    z, want, y = torch.cat(zs), torch.cat(wants), torch.cat(ys)
    d = want / gain  # the change wanted at the op's output
    channels = z.shape[1]
    if ridge <= 0 and z.shape[0] < channels:
        raise HealError(_too_few(z.shape[0], channels))
    gram = z.T @ z
    if ridge <= 0 and (rank := int(torch.linalg.matrix_rank(gram))) < channels:
        raise HealError(f"cannot heal the gap {', '.join(gap.blocks)}: its calibration rows span {rank} of the "
                        f"{channels} channels of {into}, so the plain least squares has no unique map; use a ridge "
                        f"(heal_ridge > 0) or more varied calibration batches")
    damp = ridge * float(torch.trace(gram)) / channels
    eye = torch.eye(channels, dtype=gram.dtype, device=gram.device)
    try:
        delta = torch.linalg.solve(gram + damp * eye, z.T @ d).T  # D: out = z @ D.T
    except torch.linalg.LinAlgError as exc:
        raise HealError(f"cannot heal the gap {', '.join(gap.blocks)}: the least squares for {into} is singular "
                        f"({exc}); use a ridge (heal_ridge > 0)") from exc
    norm = float(y.norm()) or 1.0
    unhealed, healed = float(want.norm()) / norm, float((want - (z @ delta.T) * gain).norm()) / norm
    patch = Patch(tuple(gap.blocks), gap.before, into, z.shape[0], unhealed, healed, time.perf_counter() - started)
    return patch, eye + delta


def fuse(model: nn.Module, into: str, patch_map: torch.Tensor) -> None:
    """Multiply the channel map into the op's weight and bias, in place (the op's output becomes ``T @ output``)."""
    op = model.get_submodule(into)
    with torch.no_grad():
        t = patch_map.to(op.weight.dtype).to(op.weight.device)
        op.weight.copy_(torch.einsum("oc,c...->o...", t, op.weight))
        if op.bias is not None:
            op.bias.copy_(t @ op.bias)


def heal(pruned: nn.Module, found: Sequence[Gap], calibration: Sequence[torch.Tensor], ridge: float = RIDGE,
         strict: bool = True) -> tuple[list[tuple[Patch, torch.Tensor]], dict[str, str]]:
    """Fit and fuse each gap's patch into `pruned`, in forward order (each fit sees the patches before it); returns
    the patches and the gaps left as they were, with why (`strict`: the first such gap raises :class:`HealError`,
    before any patch is fused)."""
    if strict and (bad := next((g for g in found if g.reason), None)) is not None:
        raise HealError(bad.reason)
    mode = pruned.training
    pruned.eval()
    patches, unhealed = [], {}
    try:
        for gap in found:
            try:
                patch, patch_map = fit_patch(pruned, gap, calibration, ridge)
            except HealError as exc:
                if strict:
                    raise
                unhealed[", ".join(gap.blocks)] = str(exc)
                continue
            fuse(pruned, patch.into, patch_map)
            patches.append((patch, patch_map))
    finally:
        pruned.train(mode)
    return patches, unhealed


def check_healable(model: nn.Module, pruned: nn.Module, removed: Sequence[str], calibration: Sequence[torch.Tensor],
                   ridge: float | None = None) -> None:
    """Raise :class:`HealError` if a gap of `removed` cannot be healed: no kept block before it, a module between
    that block and the gap, no op of that block (in `pruned`, the model with the plan applied) to fold a patch into
    and, with a `ridge` of 0, fewer calibration rows than the op has channels. Fits nothing; both models are left in
    the mode they were in."""
    modes = model.training, pruned.training
    try:
        model.eval()
        pruned.eval()
        for gap in gap_targets(model, removed, calibration[:1]):
            if gap.reason:
                raise HealError(gap.reason)
            found = _target(pruned, gap.before, calibration[0])
            if isinstance(found, str):
                raise HealError(f"cannot heal the gap {', '.join(gap.blocks)}: {found}")
            if ridge is not None and ridge <= 0:
                channels, rows = _rows_of(pruned, found[0], calibration)
                if rows < channels:
                    raise HealError(f"cannot heal the gap {', '.join(gap.blocks)}: {_too_few(rows, channels)}")
    finally:
        model.train(modes[0])
        pruned.train(modes[1])


def _rows_of(model: nn.Module, into: str, calibration: Sequence[torch.Tensor]) -> tuple[int, int]:
    """(channels, calibration rows) of the op `into`'s output over every calibration batch."""
    rows, channels = 0, 0
    for x in calibration:
        capture = _Capture(model)
        capture.output(into, "z")
        shape = capture.run(x)["z"].shape
        channels = shape[_channel_axis(model.get_submodule(into))]
        rows += shape.numel() // channels
    return channels, rows


def rows_problem(model: nn.Module, batch: torch.Tensor, batches: int) -> str | None:
    """With a ridge of 0, whether `batches` calibration batches like `batch` give every gap a search may choose at
    least as many rows as its op has channels (None: they do), for each kept unit a gap could follow."""
    units = [u.name for u in model.depth_unit_specs() if u.kind in RESIDUAL_KINDS]
    for before in dict.fromkeys(units[:-1]):
        found = _target(model, before, batch)
        if isinstance(found, str):
            continue  # a gap after it is left unhealed: no rows needed
        channels, rows = _rows_of(model, found[0], [batch] * batches)
        if rows < channels:
            return f"a gap after {before}: {_too_few(rows, channels)}"
    return None


def _too_few(rows: int, channels: int) -> str:
    return (f"{rows} calibration rows fit a {channels}x{channels} map only with a ridge (heal_ridge > 0) or more "
            f"calibration batches (at least {channels} rows)")


def check_heal(heal: str, calibration: Any) -> None:
    if heal not in HEALS:
        raise HealError(f"heal={heal!r} is not one of {', '.join(HEALS)}")
    if heal == "linear" and (calibration is None or torch.is_tensor(calibration) or not len(calibration)):
        raise HealError("heal='linear' needs calibration batches: a list of input tensors (not one tensor)")
