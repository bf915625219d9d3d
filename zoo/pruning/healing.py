"""Healing a removal for free: a fitted linear map on channels, fused into a weight that is already there.

The stream of a residual network passes a row of residual additions (**edges**), in forward order: a unit whose
module outputs the stream after its addition (a block; RetNet's retention and FFN sub-layers), or a sub-layer whose
branch adds its last module's output to the stream inside its block (a discovered transformer block's attention and
MLP; a transformers decoder layer's). A block whose sub-layers are units is a row of their edges wherever its output
is, on the calibration input, its input plus its sub-layers' outputs (checked, not assumed: a post-norm or a sandwich
norm fails it, and the block stays one edge). A plan's removed units form **gaps** (runs of removed edges). For a
gap, the kept edge right before it (`before`) hands the stream on; with the gap removed the stream after `before` is
what follows, where the unpruned network gave it the stream after the gap. The patch is a channel map ``T = I + D``
applied to the output of the last weighted linear op of `before`'s modules (``into``: a Linear, or a Conv with groups
1), fitted by ridge least squares on calibration batches so that the stream after `before` matches the stream after
the gap (ReplaceMe's algebra, REFERENCE section 12, on any residual network). ``T`` is then multiplied into
``into``'s weight and bias, so the pruned network has no new parameter and no new op.

Every patch is **proven exact before it is fitted**: on the calibration input, a random change ``E`` of ``into``'s
output must change the stream after `before` by exactly ``g * E`` for a per-channel ``g`` (1 for a branch that ends
in the op; a BatchNorm's or a layer scale's factor otherwise), and the gap must start from the stream `before` hands
on; and the op must be one a map multiplied into its weight and bias is that map on its output (computed with a
random map on the op's own input: a weight-standardised conv, as BiT's, re-normalises its weight and fails). Where
no op of `before` passes (an activation after the addition, as in ResNet's basic blocks; a depthwise conv last; a
weight-standardised conv), or a removed sub-layer is no edge (its block is not its input plus its sub-layers), the
gap is refused with that reason: no layer is ever added. A BatchNorm fed by a patched op is left holding its new
input's statistics (its affine absorbing the change, its eval function the same), so that a fine-tune, which
normalises by batch statistics, keeps the patch.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from ..errors import PlanError

RIDGE = 1e-3  # the ridge, relative to the mean eigenvalue of the op's output covariance
HEALS = ("none", "linear")
STREAM_KINDS = ("block", "retention", "ffn")  # units whose module outputs the stream after their addition
SUB_KINDS = ("sublayer",)  # units whose module is a branch added to the stream inside their block


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


@dataclass(frozen=True)
class Edge:
    """One residual addition on the stream: a unit whose module outputs the stream (``block`` empty), or a sub-layer
    of `block` whose branch (`modules`, in call order) adds its last module's output to the stream, after the
    branches of `prior` (the ends of the block's sub-layers before it)."""

    name: str
    modules: tuple[str, ...]
    block: str = ""
    prior: tuple[str, ...] = ()

    @property
    def end(self) -> str:
        return self.modules[-1]


def _owner(name: str, blocks: Sequence[str]) -> str:
    """The block a sub-layer lives in: the innermost block unit around it, else its parent module (for a sub-layer
    named by its addition, ``owner:add``, that owner)."""
    if ":" in name:
        return name.partition(":")[0]
    around = [b for b in blocks if name.startswith(b + ".")]
    return max(around, key=len) if around else name.rpartition(".")[0]


def _branch(unit: Any) -> tuple[str, ...]:
    """A sub-layer unit's branch modules, in call order (its own module where discovery lists none)."""
    return tuple(unit.merge) or (unit.name,)


def residual_edges(model: nn.Module, x: torch.Tensor) -> tuple[list[Edge], dict[str, list[str]], dict[str, str]]:
    """The stream's edges in forward order; each unit that is a row of edges (a block whose sub-layers are units)
    with their names; and the sub-layer units that are no edge, with why. A block is a row of its sub-layers' edges
    only where, on `x`, its output is its input plus their branches' outputs."""
    specs = model.depth_unit_specs()
    blocks = [u.name for u in specs if u.kind in STREAM_KINDS]
    children: dict[str, list[Any]] = {}
    for unit in specs:
        if unit.kind in SUB_KINDS:
            children.setdefault(_owner(unit.name, blocks), []).append(unit)
    split, reasons = _additive(model, children, x), {}
    for block, subs in children.items():
        if block not in split:
            reasons.update({u.name: split_reason(u.name, block) for u in subs})
    edges: list[Edge] = []
    rows: dict[str, list[str]] = {}
    done: set[str] = set()
    for unit in specs:
        owner = unit.name if unit.kind in STREAM_KINDS else _owner(unit.name, blocks) if unit.kind in SUB_KINDS \
            else None
        if owner is None or owner in done:
            continue
        if owner in split:
            done.add(owner)
            ends: list[str] = []
            for sub in children[owner]:
                branch = _branch(sub)
                edges.append(Edge(sub.name, branch, owner, tuple(ends)))
                ends.append(branch[-1])
            rows[owner] = [sub.name for sub in children[owner]]
        elif unit.kind in STREAM_KINDS:
            done.add(owner)
            edges.append(Edge(unit.name, (unit.name,)))
    return edges, rows, reasons


def split_reason(name: str, block: str) -> str:
    return (f"{name} is a sub-layer of {block or 'the model'}, whose output is not its input plus its sub-layers' "
            f"outputs (a norm or scale after an addition): only whole units of its kind are healed there")


def _additive(model: nn.Module, children: dict[str, list[Any]], x: torch.Tensor) -> set[str]:
    """The blocks whose output equals, on `x`, their input plus their sub-layers' branch outputs."""
    capture = _Capture(model)
    for block, subs in children.items():
        if not block or any(":" in u.name for u in subs):
            continue
        capture.input(block, f"{block}/in")
        capture.output(block, f"{block}/out")
        for i, sub in enumerate(subs):
            capture.output(_branch(sub)[-1], f"{block}/{i}")
    seen = capture.run(x)
    split = set()
    for block, subs in children.items():
        parts = [seen.get(f"{block}/{i}") for i in range(len(subs))]
        out, inp = seen.get(f"{block}/out"), seen.get(f"{block}/in")
        if out is None or inp is None or any(p is None or p.shape != out.shape for p in (inp, *parts)):
            continue
        if _close(inp.double() + sum(p.double() for p in parts), out.double()):
            split.add(block)
    return split


def gaps(edges: Sequence[Edge], rows: dict[str, list[str]], removed: Iterable[str]
         ) -> list[tuple[Edge | None, list[Edge]]]:
    """(the kept edge before, the run of removed edges) for each run of removed edges next to each other in forward
    order; a removed unit that is a row of edges removes all of them."""
    gone = {name for unit in removed for name in rows.get(unit, [unit])}
    runs: list[tuple[Edge | None, list[Edge]]] = []
    for i, edge in enumerate(edges):
        if edge.name not in gone:
            continue
        if runs and i and edges[i - 1].name in gone and runs[-1][1][-1] is edges[i - 1]:
            runs[-1][1].append(edge)
        else:
            runs.append((edges[i - 1] if i else None, [edge]))
    return runs


def shown(run: Sequence[Edge], rows: dict[str, list[str]], removed: Iterable[str]) -> list[str]:
    """A run's names as the plan gave them: a removed unit that is a row of edges by its own name."""
    names = {e.name for e in run}
    out: list[str] = []
    for unit in removed:
        covered = rows.get(unit, [unit])
        if set(covered) <= names and unit not in out:
            out.append(unit)
    order = {e.name: i for i, e in enumerate(run)}
    return sorted(out, key=lambda u: order[rows.get(u, [u])[0]])


def _first(value: Any) -> torch.Tensor:
    """A module's output stream: the tensor itself, or the first of a tuple (RetNet's retention returns its state
    too)."""
    return value[0] if isinstance(value, (tuple, list)) else value


def _channel_axis(module: nn.Module) -> int:
    return -1 if isinstance(module, nn.Linear) else 1


def _rows(value: torch.Tensor, axis: int) -> torch.Tensor:
    """(positions, channels) in float64: the channel axis last, everything else flattened."""
    return value.detach().movedim(axis, -1).reshape(-1, value.shape[axis]).double()


def _candidates(model: nn.Module, paths: Sequence[str]) -> tuple[list[str], list[Any]]:
    """Hooks that list, in call order, the weighted linear ops under `paths` a full channel map folds into."""
    order: list[str] = []
    handles = []
    for path in paths:
        for name, module in model.get_submodule(path).named_modules(prefix=path):
            if isinstance(module, nn.Linear) or (isinstance(module, (nn.Conv1d, nn.Conv2d)) and module.groups == 1):
                handles.append(module.register_forward_hook(lambda m, a, o, name=name: order.append(name)))
    return order, handles


def _stream_arg(args: tuple, kwargs: dict[str, Any]) -> torch.Tensor | None:
    """The stream a block is called with: its first tensor argument, or ``hidden_states`` by keyword."""
    for value in (*args, kwargs.get("hidden_states"), *kwargs.values()):
        if torch.is_tensor(value):
            return value
    return None


class _Capture:
    """Forward hooks that keep named modules' inputs or outputs, and the stream after (or before) an edge. A module
    that is not there or does not run (a removed branch folded away) leaves no value: it adds nothing."""

    def __init__(self, model: nn.Module) -> None:
        self.model, self.values, self.handles = model, {}, []

    def _module(self, path: str) -> nn.Module | None:
        try:
            return self.model.get_submodule(path)
        except AttributeError:
            return None

    def output(self, path: str, key: str, change: torch.Tensor | None = None) -> None:
        def hook(module: nn.Module, args: tuple, output: Any) -> Any:
            self.values[key] = _first(output).detach()
            return output + change.to(output) if change is not None else output
        if (module := self._module(path)) is not None:
            self.handles.append(module.register_forward_hook(hook))

    def input(self, path: str, key: str) -> None:
        def hook(module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
            value = _stream_arg(args, kwargs)
            if value is not None:
                self.values[key] = value.detach()
        if (module := self._module(path)) is not None:
            self.handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))

    def stream(self, edge: Edge, key: str, after: bool = True) -> None:
        """Keep the stream after `edge` (`after`) or before it, as ``stream_value(edge, key, after)`` reads it."""
        if not edge.block:
            (self.output if after else self.input)(edge.name, key)
            return
        self.input(edge.block, f"{key}/in")
        for i, end in enumerate((*edge.prior, edge.end) if after else edge.prior):
            self.output(end, f"{key}/{i}")

    def stream_value(self, edge: Edge, key: str, after: bool = True) -> torch.Tensor:
        if not edge.block:
            return self.values[key]
        total = self.values[f"{key}/in"]
        for i in range(len(edge.prior) + after):
            if f"{key}/{i}" in self.values:
                total = total + self.values[f"{key}/{i}"]
        return total

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


def _gain(model: nn.Module, before: Edge, into: str, x: torch.Tensor) -> torch.Tensor | None:
    """The per-channel factor by which a change of `into`'s output reaches the stream after `before`, exactly; None
    when it does not reach it that way (an activation after the addition, a layout change, a mix of channels)."""
    capture = _Capture(model)
    capture.output(into, "op")
    capture.stream(before, "out")
    capture.run(x)
    op, out = capture.values["op"], capture.stream_value(before, "out")
    if op.shape != out.shape:
        return None
    axis = _channel_axis(model.get_submodule(into))
    change = torch.randn(op.shape, generator=torch.Generator().manual_seed(0)).to(op)
    capture.output(into, "op", change)
    capture.stream(before, "out")
    capture.run(x)
    moved = capture.stream_value(before, "out") - out
    e, r = _rows(change, axis), _rows(moved, axis)
    gain = (e * r).sum(0) / (e * e).sum(0)
    scale = float(r.abs().max()) or 1.0
    if not torch.isfinite(gain).all() or bool((gain == 0).any()) or float((r - e * gain).abs().max()) > 1e-4 * scale:
        return None
    return gain


def _target(model: nn.Module, before: Edge, x: torch.Tensor) -> tuple[str, torch.Tensor] | str:
    """The op of `before` a patch folds into and its gain, or why none."""
    order, handles = _candidates(model, before.modules)
    try:
        with torch.no_grad():
            model(x)
    finally:
        for handle in handles:
            handle.remove()
    not_fusable = []
    for path in reversed(list(dict.fromkeys(order))):
        gain = _gain(model, before, path, x)
        if gain is None:
            continue
        if _fusable(model, path, x):
            return path, gain
        not_fusable.append(path)
    if not_fusable:
        return (f"{not_fusable[0]} of {before.name} reaches the stream, but a map multiplied into its weight is not "
                f"that map on its output (its forward transforms the weight, as a weight-standardised conv does)")
    return (f"no Linear or full Conv of {before.name} reaches the stream after it unchanged (an activation after its "
            f"addition, a depthwise or no weighted op last)")


def _on_channels(t: torch.Tensor, value: torch.Tensor, axis: int) -> torch.Tensor:
    """`t` (out, in channels) applied to `value` along its channel `axis`."""
    return (value.movedim(axis, -1) @ t.T.to(value)).movedim(-1, axis)


def _fusable(model: nn.Module, into: str, x: torch.Tensor) -> bool:
    """Whether a channel map multiplied into `into`'s weight and bias (:func:`fuse`) is that map applied to its
    output, computed on the op's own input with a random map: not so where the forward transforms the weight (weight
    standardisation re-normalises each output channel's weight)."""
    op = model.get_submodule(into)
    seen: dict[str, Any] = {}
    handle = op.register_forward_hook(lambda m, args, out: seen.update(args=args, out=out))
    try:
        with torch.no_grad():
            model(x)
    finally:
        handle.remove()
    if "out" not in seen:
        return False
    axis = _channel_axis(op)
    channels = seen["out"].shape[axis]
    t = torch.eye(channels) + torch.randn(channels, channels, generator=torch.Generator().manual_seed(1)) / channels
    trial = copy.deepcopy(op)
    fuse(trial, "", t)
    with torch.no_grad():
        fused, wanted = trial(*seen["args"]), _on_channels(t, seen["out"], axis)
    return _close(fused, wanted, 1e-4)


@dataclass
class Gap:
    """A run of removed edges (`edges`; `blocks`: their names as the plan gave them), the kept edge before it, and
    what the unpruned network's stream was after the run on each calibration input (the target), or why it cannot
    be healed."""

    before: Edge | None
    edges: list[Edge]
    blocks: list[str]
    targets: list[torch.Tensor]
    reason: str = ""


def _close(a: torch.Tensor, b: torch.Tensor, tolerance: float = 1e-5) -> bool:
    return a.shape == b.shape and float((a - b).abs().max()) <= tolerance * (float(b.abs().max()) or 1.0)


def gap_targets(model: nn.Module, removed: Sequence[str], calibration: Sequence[torch.Tensor]) -> list[Gap]:
    """Every gap of `removed` with its targets, on the unpruned `model`; a removed sub-layer that is no edge is a gap
    with its reason."""
    edges, rows, reasons = residual_edges(model, calibration[0])
    found = [Gap(before, run, shown(run, rows, removed), []) for before, run in gaps(edges, rows, removed)]
    for gap in found:
        if gap.before is None:
            gap.reason = f"the gap {gap.blocks[0]}.. starts the network: no kept unit before it to fold a patch into"
    live = [g for g in found if not g.reason]
    for x in calibration:
        capture = _Capture(model)
        for i, gap in enumerate(live):
            capture.stream(gap.before, f"after{i}")
            capture.stream(gap.edges[0], f"in{i}", after=False)
            capture.stream(gap.edges[-1], f"out{i}")
        capture.run(x)
        for i, gap in enumerate(live):
            if not _close(capture.stream_value(gap.edges[0], f"in{i}", after=False),
                          capture.stream_value(gap.before, f"after{i}")):
                gap.reason = f"it does not start from the stream {gap.before.name} hands on (a module between them)"
            gap.targets.append(capture.stream_value(gap.edges[-1], f"out{i}"))
    for gap in found:
        if gap.reason and not gap.reason.startswith("the gap"):
            gap.reason = f"cannot heal the gap {', '.join(gap.blocks)}: {gap.reason}"
    return found + [Gap(None, [], [name], [], f"cannot heal {name}: {reasons[name]}") for name in removed
                    if name in reasons]


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
        capture.stream(gap.before, "after")
        capture.run(x)
        after = capture.stream_value(gap.before, "after")
        if after.shape != target.shape:
            raise HealError(f"cannot heal the gap {', '.join(gap.blocks)}: the stream after {gap.before.name} is "
                            f"shaped {tuple(after.shape)}, the stream after the gap {tuple(target.shape)}")
        zs.append(_rows(capture.values["z"], axis))
        wants.append(_rows(target - after, axis))  # the change wanted in the stream
        ys.append(_rows(target, axis))
    z, want, y = torch.cat(zs), torch.cat(wants), torch.cat(ys)
    patch_map, unhealed, healed = solve_map(z, want, y, gain, ridge, into, ", ".join(gap.blocks))
    patch = Patch(tuple(gap.blocks), gap.before.name, into, z.shape[0], unhealed, healed, time.perf_counter() - started)
    return patch, patch_map


def solve_map(z: torch.Tensor, want: torch.Tensor, y: torch.Tensor, gain: torch.Tensor, ridge: float, into: str,
              gap: str) -> tuple[torch.Tensor, float, float]:
    """The ridge least squares of a gap's map ``T = I + D`` (rows: the op's outputs `z`, the change `want` wanted in
    the stream, the stream `y` it is measured against; `gain`: the op's per-channel factor to the stream), with the
    stream's relative error without and with it."""
    patch_map = _solve(z.T @ z, z.T @ want / gain, z.shape[0], ridge, into, gap)
    delta = patch_map - torch.eye(z.shape[1], dtype=z.dtype, device=z.device)
    norm = float(y.norm()) or 1.0
    return patch_map, float(want.norm()) / norm, float((want - (z @ delta.T) * gain).norm()) / norm


def _solve(gram: torch.Tensor, cross: torch.Tensor, rows: int, ridge: float, into: str, gap: str) -> torch.Tensor:
    """``I + D`` from the op outputs' Gram matrix ``z^T z`` and ``z^T d`` (`d`: the change wanted at the op's output)
    over `rows` rows: ``D^T = (z^T z + damp I)^-1 z^T d``, `damp` the ridge relative to the mean eigenvalue."""
    channels = gram.shape[0]
    if ridge <= 0 and rows < channels:
        raise HealError(_too_few(rows, channels))
    if ridge <= 0 and (rank := int(torch.linalg.matrix_rank(gram))) < channels:
        raise HealError(f"cannot heal the gap {gap}: its calibration rows span {rank} of the {channels} channels of "
                        f"{into}, so the plain least squares has no unique map; use a ridge (heal_ridge > 0) or more "
                        f"varied calibration batches")
    damp = ridge * float(torch.trace(gram)) / channels
    eye = torch.eye(channels, dtype=gram.dtype, device=gram.device)
    try:
        return eye + torch.linalg.solve(gram + damp * eye, cross).T  # D: out = z @ D.T
    except torch.linalg.LinAlgError as exc:
        raise HealError(f"cannot heal the gap {gap}: the least squares for {into} is singular ({exc}); use a ridge "
                        f"(heal_ridge > 0)") from exc


class GapMaps:
    """Each gap's map fitted on the unpruned network alone (its op's outputs, the stream after the kept edge and after
    the gap, all of `model` as it is), so that it depends only on the gap's two ends and is fitted once however many
    plans contain that gap: what a search scores plans healed with (the plan it ships is healed gap by gap, each fit
    seeing the patches before it). A fit accumulates ``z^T z`` and ``z^T d`` over the calibration batches in one
    pass (no activation is kept); a gap that cannot be healed maps to None."""

    def __init__(self, model: nn.Module, calibration: Sequence[torch.Tensor], ridge: float = RIDGE):
        self.model, self.calibration, self.ridge = model, list(calibration), ridge
        with evaluating(model):
            self.edges, self.rows, _ = residual_edges(model, self.calibration[0])
        self.targets: dict[str, tuple[str, torch.Tensor] | str] = {}
        self.maps: dict[tuple[str, ...], tuple[str, torch.Tensor] | None] = {}

    def patches(self, removed: Iterable[str]) -> list[tuple[str, torch.Tensor]]:
        """(the op, its map) for every gap of `removed` that can be healed."""
        found = []
        for before, run in gaps(self.edges, self.rows, removed):
            if before is None:
                continue
            key = (before.name, *(e.name for e in run))
            if key not in self.maps:
                with evaluating(self.model):
                    self.maps[key] = self._fit(before, run[-1])
            if self.maps[key] is not None:
                found.append(self.maps[key])
        return found

    def _fit(self, before: Edge, last: Edge) -> tuple[str, torch.Tensor] | None:
        if before.name not in self.targets:
            self.targets[before.name] = _target(self.model, before, self.calibration[0])
        target = self.targets[before.name]
        if isinstance(target, str):
            return None
        into, gain = target
        axis = _channel_axis(self.model.get_submodule(into))
        gram = cross = None
        rows = 0
        for x in self.calibration:
            capture = _Capture(self.model)
            capture.output(into, "z")
            capture.stream(before, "after")
            capture.stream(last, "y")
            capture.run(x)
            after, y = capture.stream_value(before, "after"), capture.stream_value(last, "y")
            if after.shape != y.shape:
                return None
            z = _rows(capture.values["z"], axis)
            d = _rows(y - after, axis) / gain
            gram, cross = (z.T @ z, z.T @ d) if gram is None else (gram + z.T @ z, cross + z.T @ d)
            rows += z.shape[0]
        try:
            return into, _solve(gram, cross, rows, self.ridge, into, last.name)
        except HealError:
            return None


@contextlib.contextmanager
def evaluating(*models: nn.Module) -> Iterator[None]:
    """`models` in eval mode inside, each in its own mode after."""
    modes = [model.training for model in models]
    for model in models:
        model.eval()
    try:
        yield
    finally:
        for model, mode in zip(models, modes):
            model.train(mode)


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
    patches, unhealed = [], {}
    with evaluating(pruned):
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
        settle_norms(pruned, [patch.into for patch, _ in patches], calibration)
    return patches, unhealed


def settle_norms(model: nn.Module, ops: Sequence[str], calibration: Sequence[torch.Tensor]) -> list[str]:
    """Make each BatchNorm fed by a patched op's output hold its new input's statistics, its function in eval mode
    unchanged: the running mean and variance become those of its input on the calibration batches (a map mixes
    channels, so the old ones no longer describe it), and its affine absorbs the change. Without this a fine-tune,
    which normalises by batch statistics, would undo the patch's scales. Returns the BatchNorms settled."""
    fed = _norms_fed_by(model, ops, calibration[0])
    if not fed:
        return []
    inputs: dict[str, list[torch.Tensor]] = {name: [] for name in fed}
    handles = [model.get_submodule(name).register_forward_hook(
        lambda m, args, out, name=name: inputs[name].append(_rows(args[0], 1))) for name in fed]
    try:
        with evaluating(model), torch.no_grad():
            for x in calibration:
                model(x)
    finally:
        for handle in handles:
            handle.remove()
    for name in fed:
        norm, rows = model.get_submodule(name), torch.cat(inputs[name])
        mean, var = rows.mean(0), rows.var(0, unbiased=False)
        old_scale, new_scale = (norm.running_var.double() + norm.eps).sqrt(), (var + norm.eps).sqrt()
        with torch.no_grad():  # gamma (x - m') / s' + beta' = gamma_old (x - m) / s + beta_old, for every x
            norm.bias.copy_(norm.bias.double() + norm.weight.double() * (mean - norm.running_mean.double()) / old_scale)
            norm.weight.copy_(norm.weight.double() * new_scale / old_scale)
            norm.running_mean.copy_(mean)
            norm.running_var.copy_(var)
    return fed


def _norms_fed_by(model: nn.Module, ops: Sequence[str], x: torch.Tensor) -> list[str]:
    """The BatchNorms (with running statistics and an affine to absorb their change) whose input is one of `ops`'
    outputs (the same tensor), on input `x`."""
    outputs: list[torch.Tensor] = []
    fed: list[str] = []
    handles = [model.get_submodule(op).register_forward_hook(lambda m, a, out: outputs.append(out)) for op in ops]
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.track_running_stats and module.affine:
            handles.append(module.register_forward_hook(lambda m, args, out, name=name: fed.append(name) if any(
                args[0] is seen for seen in outputs) else None))
    try:
        with evaluating(model), torch.no_grad():
            model(x)
    finally:
        for handle in handles:
            handle.remove()
    return list(dict.fromkeys(fed))


def check_healable(model: nn.Module, pruned: nn.Module, removed: Sequence[str], calibration: Sequence[torch.Tensor],
                   ridge: float | None = None) -> None:
    """Raise :class:`HealError` if a gap of `removed` cannot be healed: no kept block before it, a module between
    that block and the gap, no op of that block (in `pruned`, the model with the plan applied) to fold a patch into
    and, with a `ridge` of 0, fewer calibration rows than the op has channels. Fits nothing; both models are left in
    the mode they were in."""
    with evaluating(model, pruned):
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
    least as many rows as its op has channels (None: they do), for each kept edge a gap could follow."""
    edges, _, _ = residual_edges(model, batch)
    for before in edges[:-1]:
        found = _target(model, before, batch)
        if isinstance(found, str):
            continue  # a gap after it is left unhealed: no rows needed
        channels, rows = _rows_of(model, found[0], [batch] * batches)
        if rows < channels:
            return f"a gap after {before.name}: {_too_few(rows, channels)}"
    return None


def _too_few(rows: int, channels: int) -> str:
    return (f"{rows} calibration rows fit a {channels}x{channels} map only with a ridge (heal_ridge > 0) or more "
            f"calibration batches (at least {channels} rows)")


def check_heal(heal: str, calibration: Any) -> None:
    if heal not in HEALS:
        raise HealError(f"heal={heal!r} is not one of {', '.join(HEALS)}")
    if heal == "linear" and (calibration is None or torch.is_tensor(calibration) or not len(calibration)):
        raise HealError("heal='linear' needs calibration batches: a list of input tensors (not one tensor)")
