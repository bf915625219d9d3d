"""Depth units discovered from a model's graph, for models that declare none (any timm model).

The model is traced once by ``torch.export`` (on the meta device: no memory, no weights) and every residual addition is
found: an ``add`` whose two operands have the same shape, inside the module that does it (its *owner*). The owner is a
**removable block** when its output is its input plus branches only: following the additions back from the owner's
output (through elementwise activations after the last one, as in a ResNet block), each has one operand on the stream
that starts at the owner's input and one branch computed inside the owner. Replacing such a block by ``nn.Identity``
leaves its input: the shortcut. An owner whose addition has a computed shortcut (a downsampling block) is a block that
cannot be removed.

A block with more than one branch (a ViT/DeiT block: attention, then MLP) also has each branch as a **sub-layer**
unit. Removing a sub-layer replaces the first module of its branch by :class:`ZeroLike` and the rest of the branch by
``nn.Identity``, so the branch adds nothing; a block is offered by sub-layers only when removing every branch that way
gives back the block's input exactly (checked on a random input), else by whole blocks only, and says so. Blocks nested
in another removable block are left to their outer block. What tracing cannot show (merged activations, recurrent
forms) stays with the declared families.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..errors import ZooError
from .depth import PassThrough

ADDS = ("aten.add.Tensor", "aten.add_.Tensor")
VIEWS = ("view", "reshape", "_unsafe_view", "permute", "contiguous", "clone", "alias", "flatten", "unflatten")
ELEMENTWISE = ("relu", "relu_", "gelu", "silu", "silu_", "hardswish", "hardswish_", "relu6", "hardtanh", "hardtanh_",
               "leaky_relu", "leaky_relu_", "sigmoid", "clone", "contiguous", "alias", "detach")


class DiscoveryError(ZooError):
    """A model whose depth units cannot be discovered: its graph does not trace, or it has no removable unit."""


class ZeroLike(nn.Module):
    """A removed residual branch's first module: zeros shaped like its input, so the branch adds nothing."""

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return torch.zeros_like(x)


@dataclass
class DiscoveredBlock:
    """A module whose forward ends in residual additions. `branches`: per addition, the paths of the owner's direct
    children that compute its branch, in call order (empty when unknown). `sublayers`: whether each branch may be
    removed alone (verified)."""

    path: str
    removable: bool
    stage: int = 0
    index: int = 0
    branches: list[list[str]] = field(default_factory=list)
    sublayers: bool = False
    names: list[str] = field(default_factory=list)  # each branch's unit name: its module with the most parameters


def _path(text: str) -> str:
    """A module path of ``nn_module_stack`` in ``named_modules`` form (``L['self'].stages[0]`` -> ``stages.0``)."""
    text = re.sub(r"^L\['self'\]\.?", "", text)
    text = re.sub(r"\[(\d+)\]", r".\1", text)
    text = re.sub(r"\._modules\['([^']+)'\]", r".\1", text)
    return text.strip(".")


def _stack(node: torch.fx.Node) -> list[str]:
    return [_path(path) for path, _ in (node.meta.get("nn_module_stack") or {}).values()]


def _inside(node: Any, owner: str) -> bool:
    return isinstance(node, torch.fx.Node) and node.op != "placeholder" and owner in _stack(node)


def _shape(node: Any) -> tuple[int, ...] | None:
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return tuple(value.shape) if torch.is_tensor(value) else None


def trace(model: nn.Module, example: torch.Tensor) -> tuple[torch.fx.Graph, set[str]]:
    """The model's ATen graph from ``torch.export`` (non-strict) and the names of its placeholders that are weights,
    buffers or constants (not activations); a model that does not trace raises :class:`DiscoveryError` with the
    reason."""
    try:
        program = torch.export.export(model.eval(), (example,), strict=False)
    except Exception as exc:  # noqa: BLE001 - any failure to trace means the same to the user
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DiscoveryError(f"torch.export cannot trace it ({type(exc).__name__}: {first[:300]}), so its residual "
                             f"blocks cannot be found") from None
    signature = program.graph_signature
    weights = {*signature.inputs_to_parameters, *signature.inputs_to_buffers,
               *getattr(signature, "inputs_to_lifted_tensor_constants", {})}
    return program.graph, weights


def _child_of(owner: str, path: str) -> str | None:
    """The owner's direct child that `path` lies in (None: the owner itself or outside it)."""
    prefix = owner + "." if owner else ""
    if not path.startswith(prefix) or path == owner:
        return None
    return prefix + path[len(prefix):].split(".")[0]


def _branch_children(branch: torch.fx.Node, owner: str, stream: set[torch.fx.Node]) -> list[str]:
    """The owner's direct children that compute `branch` (its producers inside the owner, back to the stream), in
    call order."""
    seen, todo = set(), [branch]
    while todo:
        node = todo.pop()
        if node in seen or node in stream or not _inside(node, owner):
            continue
        seen.add(node)
        todo.extend(node.all_input_nodes)
    children: list[str] = []
    for node in branch.graph.nodes:  # graph order is call order
        if node in seen:
            child = next((c for c in (_child_of(owner, p) for p in reversed(_stack(node))) if c), None)
            if child is not None and child not in children:
                children.append(child)
    return children


def _op(node: Any) -> str:
    """``relu`` for ``aten.relu.default``; "" for anything but an ATen call."""
    target = str(node.target) if isinstance(node, torch.fx.Node) and node.op == "call_function" else ""
    return target.split(".")[1] if target.startswith("aten.") else ""


def _tail(last: torch.fx.Node, owner: str) -> torch.fx.Node:
    """The last addition, or the elementwise activations and reshapes after it that stay inside the owner (a ResNet
    block's activation; a Swin block's reshape back to its input's layout)."""
    tail = last
    while len(tail.users) == 1:
        (user,) = tail.users
        if not _inside(user, owner) or _op(user) not in (*ELEMENTWISE, *VIEWS):
            break
        tail = user
    return tail


def _unview(node: Any, owner: str) -> Any:
    """The node a chain of reshapes inside the owner starts from (the stream passes through them)."""
    while _inside(node, owner) and _op(node) in VIEWS and node.args and isinstance(node.args[0], torch.fx.Node):
        node = node.args[0]
    return node


def _stream(adds: list[torch.fx.Node], owner: str, weights: set[str]) -> tuple[bool, list[torch.fx.Node], set]:
    """Walk back from the owner's last addition to its input: (whether its output is its input plus branches, the
    branches in order, the stream's nodes)."""
    node, stream, branches = adds[-1], set(), []
    tail = _tail(node, owner)
    if all(_inside(user, owner) for user in tail.users) or _shape(tail) is None:
        return False, [], set()  # the addition is not what the owner returns
    while True:
        a, b = _unview(node.args[0], owner), _unview(node.args[1], owner)
        back = [x for x in (a, b) if (x in adds and x is not node) or not _inside(x, owner)]
        if len(back) != 1:
            return False, [], set()
        (previous,) = back
        branch = b if previous is a else a
        if not _inside(branch, owner) or branch in adds:
            return False, [], set()
        stream.add(node)
        branches.insert(0, branch)
        if previous in adds:
            node = previous
            continue
        activation = isinstance(previous, torch.fx.Node) and previous.op != "get_attr" and previous.name not in weights
        stream.add(previous)
        same = activation and _shape(previous) == _shape(tail)  # Identity in its place keeps the owner's output shape
        return same, branches, stream


def _owner_blocks(graph: torch.fx.Graph, weights: set[str]) -> dict[str, DiscoveredBlock]:
    """Every module with a residual addition, by path, in forward order: removable when its output is its input plus
    branches (see the module docstring)."""
    owners: dict[str, list[torch.fx.Node]] = {}
    for node in graph.nodes:
        if node.op == "call_function" and str(node.target) in ADDS:
            a, b = node.args[0], node.args[1]
            stack = _stack(node)
            if stack and stack[-1] and _shape(a) is not None and _shape(a) == _shape(b) == _shape(node):
                owners.setdefault(stack[-1], []).append(node)
    blocks = {}
    for owner, adds in owners.items():
        removable, branches, stream = _stream(adds, owner, weights)
        children = [_branch_children(branch, owner, stream) for branch in branches] if removable else []
        blocks[owner] = DiscoveredBlock(owner, removable, branches=children)
    return blocks


def _outermost(blocks: dict[str, DiscoveredBlock]) -> list[DiscoveredBlock]:
    """Blocks not nested in a removable block (an inner residual is left to its outer block)."""
    removable = [p for p, b in blocks.items() if b.removable]
    return [b for p, b in blocks.items() if not any(p.startswith(r + ".") for r in removable)]


def _number(blocks: list[DiscoveredBlock]) -> None:
    """Stages and indices: blocks under the same parent module are one stage, in forward order."""
    parents: list[str] = []
    counts: dict[str, int] = {}
    for block in blocks:
        parent = block.path.rsplit(".", 1)[0] if "." in block.path else ""
        if parent not in parents:
            parents.append(parent)
        block.stage, block.index = parents.index(parent), counts.get(parent, 0)
        counts[parent] = block.index + 1


def zero_branch(root: nn.Module, modules: Sequence[str]) -> None:
    """Remove a residual branch of `root`'s module tree: its first module becomes :class:`ZeroLike`, the rest
    :class:`~zoo.models.depth.PassThrough` (paths relative to `root`)."""
    for position, path in enumerate(modules):
        root.set_submodule(path, ZeroLike() if position == 0 else PassThrough())


@torch.no_grad()
def _sublayers_exact(model: nn.Module, block: DiscoveredBlock, example: torch.Tensor) -> bool:
    """Whether removing every branch of `block` by :func:`zero_branch` gives back the block's input exactly."""
    import copy

    if len(block.branches) < 2 or any(not b for b in block.branches):
        return False
    flat = [m for branch in block.branches for m in branch]
    if len(set(flat)) != len(flat):
        return False  # a module shared by two branches cannot be removed with one of them
    module = model.get_submodule(block.path)
    captured: dict[str, Any] = {}
    handle = module.register_forward_pre_hook(lambda m, args, kwargs: captured.setdefault("x", (args, kwargs)),
                                              with_kwargs=True)
    try:
        model(example)
    finally:
        handle.remove()
    if "x" not in captured:
        return False
    args, kwargs = captured["x"]
    emptied = copy.deepcopy(module)
    prefix = block.path + "."
    for branch in block.branches:
        zero_branch(emptied, [m[len(prefix):] for m in branch])
    try:
        out = emptied(*args, **kwargs)
    except Exception:  # noqa: BLE001 - a branch that cannot be zeroed this way: blocks only
        return False
    x = args[0] if args else None
    return torch.is_tensor(out) and torch.is_tensor(x) and out.shape == x.shape and torch.equal(out, x)


@torch.no_grad()
def _keep_shape(twin: nn.Module, blocks: dict[str, DiscoveredBlock], example: torch.Tensor) -> None:
    """Removable only where the block's output is a tensor of its first input's shape in every call: ``nn.Identity``
    in its place returns that input. (A DLA tree's block adds a shortcut its parent passes in, projected to the
    output's channels: the addition's operand comes from outside, yet it is not the block's input.) A shortcut passed
    in with the input's very shape is not told apart: removing that block hands on its input, not the shortcut."""
    seen: dict[str, list[bool]] = {}

    def hook(path: str) -> Callable[..., None]:
        def record(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            x = args[0] if args else next((v for v in kwargs.values() if torch.is_tensor(v)), None)
            same = torch.is_tensor(x) and torch.is_tensor(output) and output.shape == x.shape
            seen.setdefault(path, []).append(same)
        return record

    handles = [twin.get_submodule(path).register_forward_hook(hook(path), with_kwargs=True)
               for path, block in blocks.items() if block.removable]
    try:
        twin(example)
    except Exception as exc:  # noqa: BLE001 - traced by torch.export, yet not callable on meta: say so
        raise DiscoveryError(f"its blocks' shapes could not be checked on the meta device ({type(exc).__name__}: "
                             f"{str(exc)[:200]})") from exc
    finally:
        for handle in handles:
            handle.remove()
    for path, calls in seen.items():
        blocks[path].removable = all(calls)


def discover(build: Callable[[], nn.Module], model: nn.Module, input_size: Sequence[int]) -> list[DiscoveredBlock]:
    """The residual blocks of `model` (built again by `build` on the meta device to be traced), in forward order,
    with sub-layers where they are exact. Raises :class:`DiscoveryError` when the graph does not trace or no block
    can be removed."""
    with torch.device("meta"):
        twin = build()
    graph, weights = trace(twin, torch.empty(1, *input_size, device="meta"))
    found = _owner_blocks(graph, weights)
    _keep_shape(twin, found, torch.empty(1, *input_size, device="meta"))
    blocks = _outermost(found)
    if not any(b.removable for b in blocks):
        shortcuts = len(found)
        raise DiscoveryError(f"it has no residual block whose shortcut is its input ({shortcuts} module(s) with a "
                             f"residual addition, none of them removable), so there is nothing to remove by depth")
    _number(blocks)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    example = torch.randn(1, *input_size, device=device, generator=None)
    was_training = model.training
    model.eval()
    try:
        for block in blocks:
            block.sublayers = block.removable and _sublayers_exact(model, block, example)
            block.names = [max(branch, key=lambda p: (sum(x.numel() for x in model.get_submodule(p).parameters()),
                                                      -branch.index(p))) for branch in block.branches]
    finally:
        model.train(was_training)
    return blocks
