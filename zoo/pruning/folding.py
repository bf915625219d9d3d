"""Removed residual branches that leave nothing behind.

A sub-layer removal (:func:`zoo.models.depth.zero_branch`) makes the branch's first module compute zeros and the
rest pass them on, so the block's own code still runs: a zeros tensor, the reshapes, rolls, pads and scales that carry
it, and ``stream + 0``. :func:`fold_zeros` traces the block's own forward (``torch.fx``, its submodules as leaves),
marks every value that is zero by construction, replaces ``stream + 0`` (and ``stream - 0``) by ``stream``, and drops
what no longer has a use: the block computes only what it keeps. The folded block is **checked on the block's own
input**: its output must equal the unfolded block's exactly, in train and eval mode alike (its traced code may not
depend on the mode), or the block is kept as it was. A block whose forward does not trace (shape arithmetic on
proxies, data-dependent control flow) keeps its zeros: the latency table measures them as they are.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..models.depth import PassThrough, ZeroLike

ZERO_IN_ZERO_OUT_FUNCTIONS = {operator.getitem, torch.roll, torch.reshape, torch.flatten, torch.permute,
                              torch.transpose, torch.squeeze, torch.unsqueeze, torch.narrow, torch.neg, operator.neg,
                              torch.nn.functional.dropout}
ZERO_IN_ZERO_OUT_METHODS = {"view", "reshape", "permute", "transpose", "contiguous", "flatten", "unflatten", "roll",
                            "squeeze", "unsqueeze", "expand", "narrow", "neg", "to", "type_as", "float", "clone",
                            "__getitem__"}
PRODUCTS = {operator.mul, torch.mul, operator.imul}  # zero when any operand is
QUOTIENTS = {operator.truediv, torch.div, operator.itruediv}  # zero when the dividend is
ADDITIONS = {operator.add, torch.add, operator.iadd}
SUBTRACTIONS = {operator.sub, torch.sub, operator.isub}
ZERO_IN_ZERO_OUT_MODULES = ("Identity", "Dropout", "DropPath", "LayerScale", "LayerScale2d")  # by class name


class _Shallow(torch.fx.Tracer):
    """Traces one module's own forward: every submodule is a leaf (its code, and its train/eval behaviour, stay its
    own)."""

    def is_leaf_module(self, module: nn.Module, qualified_name: str) -> bool:
        return True


def _trace(block: nn.Module) -> torch.fx.GraphModule | None:
    try:
        return torch.fx.GraphModule(block, _Shallow().trace(block))
    except Exception:  # noqa: BLE001 - a forward fx cannot trace keeps its zeros
        return None


def _zero_module(module: nn.Module) -> bool | None:
    """True: it computes zeros whatever it gets; False: zeros in, zeros out; None: neither is known."""
    if isinstance(module, ZeroLike):
        return True
    if isinstance(module, PassThrough) or type(module).__name__ in ZERO_IN_ZERO_OUT_MODULES:
        return False
    return None


def _zero_nodes(traced: torch.fx.GraphModule) -> set[torch.fx.Node]:
    """The nodes whose value is zero by construction."""
    zero: set[torch.fx.Node] = set()
    for node in traced.graph.nodes:
        args = [a for a in node.args if isinstance(a, torch.fx.Node)]
        first = node.args[0] if node.args else None
        if node.op == "call_module":
            kind = _zero_module(traced.get_submodule(node.target))
            if kind is True or (kind is False and first in zero):
                zero.add(node)
        elif node.op == "call_function" and node.target in PRODUCTS:
            if any(a in zero for a in args):
                zero.add(node)
        elif node.op == "call_function" and (node.target in QUOTIENTS or node.target in ZERO_IN_ZERO_OUT_FUNCTIONS):
            if first in zero:
                zero.add(node)
        elif node.op == "call_function" and (node.target in ADDITIONS or node.target in SUBTRACTIONS):
            if args and all(a in zero for a in node.args[:2]):
                zero.add(node)
        elif node.op == "call_method" and node.target in ZERO_IN_ZERO_OUT_METHODS | {"mul", "mul_"}:
            if first in zero or (node.target in ("mul", "mul_") and any(a in zero for a in args)):
                zero.add(node)
        elif node.op == "call_function" and node.target is torch.nn.functional.pad:
            if first in zero and node.kwargs.get("value", node.args[3] if len(node.args) > 3 else 0) in (0, None):
                zero.add(node)
    return zero


def _drop_zeros(traced: torch.fx.GraphModule) -> int:
    """Replace ``a + 0``, ``0 + a`` and ``a - 0`` by ``a`` and a pass-through module by its input; drop the dead code.
    Returns how many nodes went."""
    graph = traced.graph
    before = len(graph.nodes)
    zero = _zero_nodes(traced)
    for node in list(graph.nodes):
        if node.op == "call_module" and isinstance(traced.get_submodule(node.target), PassThrough) and not isinstance(
                traced.get_submodule(node.target), ZeroLike) and node.args and node not in zero:
            node.replace_all_uses_with(node.args[0])
            continue
        if node.op not in ("call_function", "call_method") or len(node.args) < 2 or node in zero:
            continue
        adds = node.target in ADDITIONS or node.target in ("add", "add_", "__add__")
        subs = node.target in SUBTRACTIONS or node.target in ("sub", "sub_")
        a, b = node.args[0], node.args[1]
        if (adds or subs) and b in zero and isinstance(a, torch.fx.Node) and not node.kwargs:
            node.replace_all_uses_with(a)
        elif adds and a in zero and isinstance(b, torch.fx.Node) and not node.kwargs:
            node.replace_all_uses_with(b)
    graph.eliminate_dead_code()
    graph.lint()
    traced.delete_all_unused_submodules()
    traced.recompile()
    return before - len(graph.nodes)


def _outputs_equal(a: Any, b: Any) -> bool:
    if torch.is_tensor(a) or torch.is_tensor(b):
        return torch.is_tensor(a) and torch.is_tensor(b) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_outputs_equal(x, y) for x, y in zip(a, b))
    return a == b


def _copied(value: Any) -> Any:
    """`value` with every tensor in it cloned (a block may change its input in place)."""
    if torch.is_tensor(value):
        return value.clone()
    if isinstance(value, (tuple, list)):
        return type(value)(_copied(v) for v in value)
    if isinstance(value, dict):
        return {k: _copied(v) for k, v in value.items()}
    return value


def fold_zeros(block: nn.Module, args: Sequence[Any], kwargs: dict[str, Any] | None = None) -> nn.Module:
    """`block` with its removed branches' zeros dropped (see the module docstring), checked on its input `args`
    (`kwargs`); `block` itself where nothing can be dropped or the check fails."""
    kwargs = kwargs or {}
    if not any(isinstance(m, ZeroLike) for m in block.modules()):
        return block
    mode = block.training
    traced = {}
    for training in (False, True):
        block.train(training)
        traced[training] = _trace(block)
    block.train(mode)
    if traced[False] is None or traced[True] is None or traced[False].code != traced[True].code:
        return block
    folded = traced[mode]
    if not _drop_zeros(folded):
        return block
    folded.train(mode)
    try:
        with torch.no_grad():
            block.eval(), folded.eval()
            same = _outputs_equal(block(*_copied(args), **_copied(kwargs)), folded(*_copied(args), **_copied(kwargs)))
    except Exception:  # noqa: BLE001 - a fold that does not run is not used
        same = False
    finally:
        block.train(mode), folded.train(mode)
    return folded if same else block


def block_inputs(model: nn.Module, names: Sequence[str], example: Any) -> dict[str, tuple[tuple, dict]]:
    """Each named module's (args, kwargs) in one forward of `model` on `example` (a module called twice: its first)."""
    seen: dict[str, tuple[tuple, dict]] = {}

    def keep(name: str) -> Any:
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            seen.setdefault(name, (_copied(args), _copied(kwargs)))
        return hook

    handles = [model.get_submodule(n).register_forward_pre_hook(keep(n), with_kwargs=True) for n in names]
    mode = model.training
    try:
        with torch.no_grad():
            model.eval()
            model(example)
    finally:
        model.train(mode)
        for handle in handles:
            handle.remove()
    return seen
