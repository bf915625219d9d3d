"""Depth units discovered from a model's graph, for models that declare none (any timm model, any ``nn.Module``).

The unit is a **residual edge**: an addition ``stream + branch`` in the traced graph (``torch.export``) whose operands
have one shape, where the branch is computed from the stream and joins it only at this addition (every node the
branch needs dies when the addition passes its stream on), found in the graph, not by which module owns the add. The
stream may pass through child modules, residual ones included.

Edges are grouped by the module whose forward does the addition (its *owner*). The outermost owners are the
**blocks** (segments of the latency table; they never overlap by construction): a block is removable as a whole when
its output, walked back along the stream, is its input plus branches (elementwise activations and reshapes allowed
between). Every edge inside a block, nested owners' edges included, is a **sub-layer** when the block has more than
one, or when the block itself is not removable: removing it replaces the first module of its branch by
:class:`ZeroLike` and the branch's other modules by :class:`~zoo.models.depth.PassThrough`.

Every unit is **proven before it is offered**: on a copy of the model whose degenerate parameters (zero or tiny:
zero-initialised norms, layer scales of 1e-6) are drawn afresh, so that every branch matters, the network with the
unit removed by that surgery must equal the traced network with the unit's additions passing their stream on (the
branch contributing nothing), on a random input at the build's input size (discovery's own generator), within float
tolerance. A unit that fails is not offered, and its reason is kept; a block that fails gives way to the module
enclosing it when that module holds no other addition and its output is its input plus the same branches (a block
that receives its shortcut as a second argument is removable as the caller that passes it its stream).
"""

from __future__ import annotations

import copy
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from ..errors import ZooError
from .depth import PassThrough, zero_branch

ADDS = ("aten.add.Tensor", "aten.add_.Tensor")
VIEWS = ("view", "reshape", "_unsafe_view", "permute", "contiguous", "clone", "alias", "flatten", "unflatten",
         "transpose", "expand", "squeeze", "unsqueeze", "to", "_to_copy", "detach")
ELEMENTWISE = ("relu", "relu_", "gelu", "gelu_", "silu", "silu_", "hardswish", "hardswish_", "relu6", "hardtanh",
               "hardtanh_", "leaky_relu", "leaky_relu_", "sigmoid", "sigmoid_", "mish", "elu", "elu_", "selu", "tanh",
               "dropout", "identity")
TOLERANCE = 1e-4  # a proof's largest difference, relative to the network output's largest magnitude, in float32
TOLERANCE_FLOAT64 = 1e-9  # the same in float64, where the model's code runs so (it tells a branch of 1e-5 apart)
BATCHES = (11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47)  # units proven per forward: the first size no tensor has
MAX_UNITS_PER_BLOCK = 5  # sub-layers of one block: its segment is timed in every combination (2**n + 1 variants)
SEED = 0


class DiscoveryError(ZooError):
    """A model whose depth units cannot be discovered: its graph does not trace, or it has no removable unit."""


@dataclass
class FoundUnit:
    """A unit discovery found. `name`: a block's module path, or a sub-layer's largest branch module. `root`: the block
    whose segment holds it. `branch`: a sub-layer's modules, in call order (the first is zeroed, the rest pass
    through). `removable`: proven (see the module docstring); `reason` says why not. `error`: the proof's largest
    difference, relative to the output's scale."""

    name: str
    kind: str
    root: str
    stage: int = 0
    index: int = 0
    removable: bool = False
    branch: tuple[str, ...] = ()
    reason: str = ""
    error: float | None = None
    dtype: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "branch": list(self.branch)}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> FoundUnit:
        return cls(**{**values, "branch": tuple(values.get("branch", ()))})


@dataclass
class Discovery:
    """What discovery found in one model at one input size: its units (blocks and sub-layers, in forward order, each
    sub-layer before its block; segments never overlap), the owners of additions left out with why (a block holding
    too many), the same-shape additions seen, and the seconds it took."""

    input_size: tuple[int, ...]
    units: list[FoundUnit] = field(default_factory=list)
    left_out: list[FoundUnit] = field(default_factory=list)
    additions: int = 0
    seconds: float = 0.0

    def offered(self) -> list[FoundUnit]:
        """The units the model lists: every block (removable or not: a segment), and the proven sub-layers."""
        return [u for u in self.units if u.kind == "block" or u.removable]

    def removable(self) -> list[FoundUnit]:
        return [u for u in self.units if u.removable]

    def to_dict(self) -> dict[str, Any]:
        return {"input_size": list(self.input_size), "units": [u.to_dict() for u in self.units],
                "left_out": [u.to_dict() for u in self.left_out], "additions": self.additions,
                "seconds": round(self.seconds, 3)}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Discovery:
        return cls(tuple(values["input_size"]), [FoundUnit.from_dict(u) for u in values["units"]],
                   [FoundUnit.from_dict(u) for u in values["left_out"]], values["additions"], values["seconds"])


@dataclass
class Edge:
    """A residual addition in the graph: ``add = stream + branch``; `dead`: the nodes only the branch needs."""

    add: torch.fx.Node
    stream: torch.fx.Node
    dead: set[torch.fx.Node]
    owner: str


# --- the graph ---------------------------------------------------------------------------------------------------

def _path(text: str) -> str:
    """A module path of ``nn_module_stack`` in ``named_modules`` form (``L['self'].stages[0]`` -> ``stages.0``)."""
    text = re.sub(r"^L\['self'\]\.?", "", text)
    text = re.sub(r"\[(\d+)\]", r".\1", text)
    text = re.sub(r"\._modules\['([^']+)'\]", r".\1", text)
    return text.strip(".")


def _stack(node: torch.fx.Node) -> list[str]:
    return [_path(path) for path, _ in (node.meta.get("nn_module_stack") or {}).values()]


def _shape(node: Any) -> tuple[int, ...] | None:
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return tuple(value.shape) if torch.is_tensor(value) else None


def _op(node: Any) -> str:
    """``relu`` for ``aten.relu.default``; "" for anything but an ATen call."""
    target = str(node.target) if isinstance(node, torch.fx.Node) and node.op == "call_function" else ""
    return target.split(".")[1] if target.startswith("aten.") else ""


def _inside(path: str, owner: str) -> bool:
    return owner == "" or path == owner or path.startswith(owner + ".")


def trace(model: nn.Module, example: torch.Tensor) -> torch.fx.GraphModule:
    """The model's ATen graph from ``torch.export`` (non-strict), as a module that runs with the model's parameters; a
    model that does not trace raises :class:`DiscoveryError` with the reason."""
    try:
        program = torch.export.export(model.eval(), (example,), strict=False)
    except Exception as exc:  # noqa: BLE001 - any failure to trace means the same to the user
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DiscoveryError(f"torch.export cannot trace it ({type(exc).__name__}: {first[:300]}), so its residual "
                             f"units cannot be found") from None
    return program.module()


def _activations(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """Nodes whose value depends on the input (not parameters or constants alone)."""
    live: set[torch.fx.Node] = set()
    for node in graph.nodes:
        if node.op == "placeholder" or any(a in live for a in node.all_input_nodes):
            live.add(node)
    return live


def _dangling(node: torch.fx.Node) -> bool:
    """A value nothing uses (the unused half of an op's tuple, such as ``max_pool``'s indices)."""
    return node.op != "output" and not node.users


def _dead_without(add: torch.fx.Node, operand: torch.fx.Node, order: dict[torch.fx.Node, int]) -> set[torch.fx.Node]:
    """The nodes that die when `add` no longer uses `operand`: `operand` and everything only it needs."""
    if set(operand.users) != {add}:
        return set()
    dead, todo = {operand}, sorted(operand.all_input_nodes, key=order.__getitem__, reverse=True)
    while todo:
        node = todo.pop(0)
        if node in dead or node.op == "placeholder" or not node.users:
            continue
        if all(user in dead or _dangling(user) for user in node.users):
            dead.add(node)
            todo = sorted({*todo, *node.all_input_nodes}, key=order.__getitem__, reverse=True)
    return dead


def _stream_reach(node: torch.fx.Node) -> set[torch.fx.Node]:
    """`node` and what it is on the stream with: back through additions (either operand) and reshapes."""
    seen, todo = set(), [node]
    while todo:
        current = todo.pop()
        if not isinstance(current, torch.fx.Node) or current in seen:
            continue
        seen.add(current)
        if str(current.target) in ADDS:
            todo.extend(a for a in current.args[:2] if isinstance(a, torch.fx.Node))
        elif _op(current) in VIEWS and current.args and isinstance(current.args[0], torch.fx.Node):
            todo.append(current.args[0])
    return seen


def find_edges(graph: torch.fx.Graph) -> tuple[list[Edge], int]:
    """Every residual edge of the graph, in graph order, and the number of same-shape additions seen."""
    order = {node: i for i, node in enumerate(graph.nodes)}
    live = _activations(graph)
    edges, additions = [], 0
    for node in graph.nodes:
        if node.op != "call_function" or str(node.target) not in ADDS or node.kwargs.get("alpha", 1) != 1:
            continue
        a, b = node.args[0], node.args[1]
        if not (isinstance(a, torch.fx.Node) and isinstance(b, torch.fx.Node) and a in live and b in live):
            continue
        if _shape(a) is None or not _shape(a) == _shape(b) == _shape(node):
            continue
        additions += 1
        found = []
        for stream, branch in ((a, b), (b, a)):
            dead = _dead_without(node, branch, order)
            reach = _stream_reach(stream)
            reads = {i for d in dead for i in d.all_input_nodes if i not in dead}
            if dead & live and reads & reach & live:
                found.append(Edge(node, stream, dead, (_stack(node) or [""])[-1]))
        if len(found) == 1:
            edges.append(found[0])
    return edges, additions


# --- units from edges --------------------------------------------------------------------------------------------

def _module_nodes(graph: torch.fx.Graph) -> dict[str, list[torch.fx.Node]]:
    """Each module path's nodes (its calls', nested modules' included), in graph order."""
    nodes: dict[str, list[torch.fx.Node]] = {}
    for node in graph.nodes:
        for path in dict.fromkeys(_stack(node)):
            nodes.setdefault(path, []).append(node)
    return nodes


def _branch_modules(edge: Edge, modules: dict[str, list[torch.fx.Node]]) -> list[str]:
    """The outermost modules inside the edge's owner whose every node the branch alone needs, in call order."""
    inside = [p for p, nodes in modules.items() if p and p != edge.owner and _inside(p, edge.owner)
              and all(n in edge.dead for n in nodes)]
    outer = [p for p in inside if not any(p.startswith(q + ".") for q in inside)]
    return sorted(outer, key=lambda p: next(i for i, n in enumerate(edge.add.graph.nodes) if n is modules[p][0]))


def _block_edges(owner: str, edges: list[Edge], modules: dict[str, list[torch.fx.Node]]) -> tuple[list[Edge], str]:
    """The additions on the stream from `owner`'s output back to its input, if its output is its input plus branches
    (elementwise activations and reshapes between); else ([], why not)."""
    own = set(modules.get(owner, []))
    outputs = [n for n in own if any(u not in own for u in n.users)]
    if len(outputs) != 1:
        return [], f"its forward returns {len(outputs)} values"
    by_add = {e.add: e for e in edges}
    node, walked = outputs[0], []
    while node in own:
        if node in by_add:
            walked.append(by_add[node])
            node = by_add[node].stream
        elif _op(node) in (*VIEWS, *ELEMENTWISE) and node.args and isinstance(node.args[0], torch.fx.Node):
            node = node.args[0]
        else:
            return [], f"its stream passes through {_op(node) or node.op} ({node.name}), not only additions"
    if not walked:
        return [], "its output is not its input plus branches"
    return walked, ""


def _roots(owners: list[str], count: dict[str, int]) -> tuple[list[str], dict[str, str]]:
    """The outermost owners whose segment holds at most MAX_UNITS_PER_BLOCK additions (an owner over that, with owners
    inside it, gives way to them), and the owners left out with why. `owners`: outer before inner."""
    roots: list[str] = []
    dropped: dict[str, str] = {}
    for owner in owners:
        if any(_inside(owner, r) for r in roots):
            continue
        if count[owner] > MAX_UNITS_PER_BLOCK and any(o != owner and _inside(o, owner) for o in owners):
            dropped[owner] = (f"it holds {count[owner]} residual additions, more than the {MAX_UNITS_PER_BLOCK} a "
                              f"segment is timed with in every combination: the blocks inside it are units instead")
            continue
        roots.append(owner)
    return roots, dropped


# --- the proof ---------------------------------------------------------------------------------------------------

def _leaves(value: Any) -> Iterator[torch.Tensor]:
    if torch.is_tensor(value):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _leaves(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item)


def _flat(value: Any) -> torch.Tensor:
    return torch.cat([t.detach().double().reshape(-1) for t in _leaves(value)])


def _sample(value: Any, i: int, batch: int) -> torch.Tensor:
    """Sample `i` of a batched output, flat (every output leaf has the batch first); a leaf that has not raises."""
    if batch == 1:
        return _flat(value)
    leaves = list(_leaves(value))
    if any(t.dim() == 0 or t.shape[0] != batch for t in leaves):
        raise _Unbatchable("an output without the batch first")
    return torch.cat([t[i].detach().double().reshape(-1) for t in leaves])


class _Unbatchable(Exception):
    """A removal that cannot be replayed per sample in a batch (proven alone instead)."""


def _with_switches(traced: torch.fx.GraphModule, edges: list[Edge], batch: int) -> dict[torch.fx.Node, int]:
    """Rewrite `traced` in place so that each edge's branch is multiplied by its switch, ``traced.zoo_switches[s, i]``
    for sample `s` (1: the network as traced, exactly; 0: the branch contributes nothing), and return each addition's
    switch. A branch whose first dimension is not the batch reads sample 0's switch for every sample."""
    graph = traced.graph
    traced.register_buffer("zoo_switches", torch.ones(batch, max(len(edges), 1)))
    index = {}
    for i, edge in enumerate(edges):
        branch = next(a for a in edge.add.args[:2] if a is not edge.stream)
        shape = _shape(branch) or ()
        with graph.inserting_before(edge.add):
            switches = graph.get_attr("zoo_switches")
            column = graph.call_function(torch.ops.aten.select.int, (switches, 1, i))
            if shape and shape[0] == batch:
                switch = graph.call_function(torch.ops.aten.view.default, (column, [batch, *[1] * (len(shape) - 1)]))
            else:
                switch = graph.call_function(torch.ops.aten.select.int, (column, 0, 0))
            scaled = graph.call_function(torch.ops.aten.mul.Tensor, (branch, switch))
        edge.add.args = tuple(scaled if a is branch else a for a in edge.add.args)
        index[edge.add] = i
    traced.recompile()
    return index


def _genericise(model: nn.Module, generator: torch.Generator) -> None:
    """Draw afresh every floating parameter that is zero or tiny (zero-initialised norms, layer scales), so that no
    branch vanishes by its initialisation and a proof tells surgeries apart."""
    with torch.no_grad():
        for param in model.parameters():
            if param.is_floating_point() and param.numel() and float(param.abs().max()) < 1e-3:
                param.copy_(torch.rand(param.shape, generator=generator, dtype=param.dtype) * 0.5 + 0.5)


def _surgery(twin: nn.Module, unit: FoundUnit) -> list[tuple[str, nn.Module]]:
    """Apply `unit`'s removal to `twin` in place; returns what to put back."""
    if unit.kind == "block":
        saved = [(unit.name, twin.get_submodule(unit.name))]
        twin.set_submodule(unit.name, PassThrough(saved[0][1]))
        return saved
    saved = [(p, twin.get_submodule(p)) for p in unit.branch]
    zero_branch(twin, unit.branch)
    return saved


def _removals(unit: FoundUnit) -> list[tuple[str, bool]]:
    """The modules `unit`'s surgery replaces, each with whether it becomes zeros (else it passes its input on)."""
    if unit.kind == "block":
        return [(unit.name, False)]
    return [(path, position == 0) for position, path in enumerate(unit.branch)]


def _per_sample(twin: nn.Module, units: list[FoundUnit], batch: int) -> list[Any]:
    """Forward hooks that replay each unit's surgery on its own sample (unit j on sample j) of a batch: the module's
    output becomes its first input (or zeros like it) for that sample, exactly what the surgery's modules return."""
    actions: dict[str, list[tuple[int, bool]]] = {}
    for j, unit in enumerate(units):
        for path, zeros in _removals(unit):
            actions.setdefault(path, []).append((j, zeros))

    def replay(todo: list[tuple[int, bool]]) -> Any:
        def hook(module: nn.Module, args: tuple, output: Any) -> torch.Tensor:
            x = args[0] if args else None
            if not (torch.is_tensor(x) and torch.is_tensor(output) and output.shape == x.shape and x.dim()
                    and x.shape[0] == batch):
                raise _Unbatchable("a removed module whose output is not shaped like its input, batch first")
            output = output.clone()  # written per sample in place: the output's memory layout is kept, so that
            for j, zero in todo:     # the samples nothing removes go through the same kernels as without hooks
                output[j] = 0 if zero else x[j]
            return output
        return hook

    return [twin.get_submodule(path).register_forward_hook(replay(todo)) for path, todo in actions.items()]


def _judge(unit: FoundUnit, removed: torch.Tensor, reference: torch.Tensor, scale: float, found: _Analysis) -> None:
    """`unit` is proven when the two networks differ by at most `tolerance` of the output's scale. Within float32's
    rounding (`tolerance` 0, a difference up to TOLERANCE) it is left undecided, with no reason, for float64."""
    if removed.shape != reference.shape:
        unit.reason = "its removal changes the network's output shape"
        return
    unit.error = float((removed - reference).abs().max()) / scale
    unit.dtype, tolerance = str(found.sample.dtype).removeprefix("torch."), found.tolerance
    unit.removable = bool(torch.isfinite(removed).all()) and unit.error <= tolerance
    if not unit.removable and not (tolerance == 0.0 and unit.error <= TOLERANCE):
        unit.reason = (f"its removal is not its branch contributing nothing (they differ by {unit.error:.2g} of the "
                       f"output's scale in {unit.dtype})")


def _prove_batch(found: _Analysis, units: list[FoundUnit], scale: float, plain: torch.Tensor) -> None:
    """Prove up to ``found.batch - 1`` units in one forward of the traced graph and one of the model (unit j on
    sample j). The last sample removes nothing: it must come out as `plain` (the model's output on it with no
    removal anywhere), or the model mixes samples and the batch proves nothing."""
    traced, batch = found.traced, found.batch
    traced.zoo_switches.fill_(1.0)
    for j, unit in enumerate(units):
        for edge in found.edges_of[unit.name]:
            traced.zoo_switches[j, found.switch[edge.add]] = 0.0
    reference = traced(found.example)
    handles = _per_sample(found.twin, units, batch)
    try:
        removed = found.twin(found.example)
    finally:
        for handle in handles:
            handle.remove()
    if not torch.equal(_sample(removed, batch - 1, batch), plain):
        raise _Unbatchable("a removal on one sample changed another")
    pairs = [(_sample(removed, j, batch), _sample(reference, j, batch)) for j in range(len(units))]
    for unit, (mine, theirs) in zip(units, pairs):
        _judge(unit, mine, theirs, scale, found)


def _prove_alone(found: _Analysis, unit: FoundUnit, scale: float) -> None:
    """Prove one unit by its surgery on the model, at batch 1, against sample 0 of the traced graph."""
    found.traced.zoo_switches.fill_(1.0)
    for edge in found.edges_of[unit.name]:
        found.traced.zoo_switches[:, found.switch[edge.add]] = 0.0
    reference = _sample(found.traced(found.example), 0, found.batch)
    saved = _surgery(found.twin, unit)
    try:
        removed = _flat(found.twin(found.sample))
    except Exception as exc:  # noqa: BLE001 - a surgery the model's code does not take
        unit.reason = f"the network with it removed does not run ({type(exc).__name__}: {str(exc)[:120]})"
        return
    finally:
        for path, module in saved:
            found.twin.set_submodule(path, module)
    _judge(unit, removed, reference, scale, found)


def _prove(found: _Analysis, units: list[FoundUnit]) -> None:
    """Set each unit's `removable`, `error` and `reason` by its proof (see the module docstring): units whose
    additions carry the batch first are proven ``found.batch - 1`` at a time, the others (and a batch that does not
    replay) one by one."""
    todo = [u for u in units if not u.reason]
    batched = [u for u in todo if found.batch > 1 and all(e.add in found.per_sample for e in found.edges_of[u.name])]
    alone = [u for u in todo if all(u is not b for b in batched)]
    with torch.no_grad():
        scale = float(_flat(found.twin(found.sample)).abs().max()) or 1.0
        try:
            plain = _sample(found.twin(found.example), found.batch - 1, found.batch) if batched else None
        except _Unbatchable:
            batched, alone = [], todo
        for start in range(0, len(batched), max(found.batch - 1, 1)):
            chunk = batched[start:start + found.batch - 1]
            try:
                _prove_batch(found, chunk, scale, plain)
            except Exception:  # noqa: BLE001 - a batch that does not replay: its units one by one
                for unit in chunk:
                    unit.removable, unit.error, unit.reason = False, None, ""
                alone += chunk
        for unit in alone:
            _prove_alone(found, unit, scale)
        found.traced.zoo_switches.fill_(1.0)


def _count_calls(model: nn.Module, paths: Sequence[str], example: torch.Tensor) -> dict[str, int]:
    """How often each module path is called in one forward (a module shared by several paths counts every call)."""
    found = {}
    for path in paths:
        try:
            found[path] = model.get_submodule(path)
        except AttributeError:
            continue
    calls: dict[int, int] = dict.fromkeys(map(id, found.values()), 0)

    def count(module: nn.Module, *_: Any) -> None:
        calls[id(module)] += 1

    handles = [m.register_forward_pre_hook(count) for m in {id(m): m for m in found.values()}.values()]
    try:
        with torch.no_grad():
            model(example)
    finally:
        for handle in handles:
            handle.remove()
    return {path: calls[id(module)] for path, module in found.items()}


# --- discovery ---------------------------------------------------------------------------------------------------

def _units(edges: list[Edge], modules: dict[str, list[torch.fx.Node]], params: dict[str, int]
           ) -> tuple[list[FoundUnit], list[FoundUnit], dict[str, list[Edge]]]:
    """Blocks and sub-layers from the edges, in forward order, the owners left out, and the additions each unit's
    removal takes away."""
    owners = list(dict.fromkeys(e.owner for e in edges if e.owner))
    count = {o: sum(_inside(e.owner, o) for e in edges) for o in owners}
    owners.sort(key=lambda o: (next(i for i, e in enumerate(edges) if _inside(e.owner, o)), o.count(".")))
    roots, dropped = _roots(owners, count)
    units, edges_of = [], {}
    for root in roots:
        inner = [e for e in edges if _inside(e.owner, root)]
        walked, why = _block_edges(root, inner, modules)
        block = FoundUnit(root, "block", root, reason=why)
        edges_of[root] = walked
        if len(inner) > 1 or why:
            names: set[str] = set()
            for edge in inner:
                branch = _branch_modules(edge, modules)
                name = max(branch, key=lambda p: (params.get(p, 0), -branch.index(p))) if branch else ""
                sub = FoundUnit(name or f"{edge.owner}:{edge.add.name}", "sublayer", root, branch=tuple(branch))
                if len(inner) > MAX_UNITS_PER_BLOCK:
                    sub.reason = (f"its block has {len(inner)} residual additions; at most {MAX_UNITS_PER_BLOCK} are "
                                  f"timed as sub-layers")
                elif not branch:
                    sub.reason = "its branch is computed in its block's own forward, in no module that can be zeroed"
                elif name in names or name == root:
                    sub.reason = f"its largest module {name} names another unit"
                names.add(name)
                edges_of[sub.name] = [edge]
                units.append(sub)
        units.append(block)
    left_out = [FoundUnit(owner, "block", owner, reason=why) for owner, why in dropped.items()]
    left_out += [FoundUnit(f":{e.add.name}", "block", "", reason="its addition is in the model's own forward, in no "
                           "block module whose removal could take it away") for e in edges if not e.owner]
    return units, left_out, edges_of


def _number(units: list[FoundUnit]) -> None:
    """Stages and indices: blocks under the same parent module are one stage, in forward order; a sub-layer takes
    its block's."""
    parents: list[str] = []
    counts: dict[str, int] = {}
    place: dict[str, tuple[int, int]] = {}
    for unit in units:
        if unit.kind == "block":
            parent = unit.name.rsplit(".", 1)[0] if "." in unit.name else ""
            if parent not in parents:
                parents.append(parent)
            place[unit.name] = (parents.index(parent), counts.get(parent, 0))
            counts[parent] = place[unit.name][1] + 1
    for unit in units:
        unit.stage, unit.index = place.get(unit.root, (0, 0))


@dataclass
class _Analysis:
    """One model's graph at one draw: the genericised twin (float64 where it runs so), the input (`sample`, and
    `example`: it repeated `batch` times, what the graph was traced with), the graph with switches, the units, the
    additions each unit's removal takes away, and which of them carry the batch first (`per_sample`)."""

    twin: nn.Module
    traced: torch.fx.GraphModule
    sample: torch.Tensor
    example: torch.Tensor
    batch: int
    tolerance: float
    units: list[FoundUnit]
    left_out: list[FoundUnit]
    edges_of: dict[str, list[Edge]]
    switch: dict[torch.fx.Node, int]
    per_sample: set[torch.fx.Node]
    additions: int
    parents: dict[str, str]


def _sizes(model: nn.Module, sample: torch.Tensor) -> set[int]:
    """Every dimension size of every tensor a module takes or returns in one forward of `sample` (runs it)."""
    sizes: set[int] = set()

    def note(module: nn.Module, args: tuple, output: Any) -> None:
        for tensor in (*_leaves(args), *_leaves(output)):
            sizes.update(tensor.shape)

    handles = [m.register_forward_hook(note) for m in model.modules()]
    try:
        with torch.no_grad():
            model(sample)
    finally:
        for handle in handles:
            handle.remove()
    return sizes


def _analyse(model: nn.Module, input_size: Sequence[int], seed: int, dtype: torch.dtype = torch.float32,
             batch: int | None = None) -> _Analysis:
    """Trace a genericised copy of `model` (drawn from a generator seeded `seed`, then cast to `dtype`) at `batch`
    (default: the first of BATCHES no tensor's size is; 1 where the output does not carry the batch first) and find
    its units, unproven. In float32 a proof passes on exact equality (see :func:`_judge`)."""
    generator = torch.Generator().manual_seed(seed)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    twin = copy.deepcopy(model).eval()
    _genericise(twin, generator)
    twin.to(dtype)
    sample = torch.randn(1, *input_size, generator=generator).to(device, dtype)
    sizes, tolerance = _sizes(twin, sample), (TOLERANCE_FLOAT64 if dtype == torch.float64 else 0.0)
    batch = batch or next((b for b in BATCHES if b not in sizes), 1)
    example = sample.expand(batch, *sample.shape[1:]).clone()
    traced = trace(twin, example)
    edges, additions = find_edges(traced.graph)
    modules = _module_nodes(traced.graph)
    params = {name: sum(p.numel() for p in module.parameters()) for name, module in twin.named_modules()}
    units, left_out, edges_of = _units(edges, modules, params)
    parents = _parents(units, edges, edges_of, modules)
    try:
        with torch.no_grad():  # at the traced batch: kernels chosen for another batch round otherwise
            base = _sample(twin(example), 0, batch)
            graph_out = _sample(traced(example), 0, batch)
    except _Unbatchable:
        return _analyse(model, input_size, seed, dtype, batch=1)
    if base.shape != graph_out.shape or float((base - graph_out).abs().max()) > max(tolerance, TOLERANCE) * (
            float(base.abs().max()) or 1.0):
        for unit in units:
            unit.reason = unit.reason or "its traced graph does not compute what the model computes"
    calls = _count_calls(twin, list(dict.fromkeys(p for u in units for p in (u.name, *u.branch))), sample)
    for unit in units:
        many = [p for p in (unit.name, *unit.branch) if calls.get(p, 1) != 1]
        if many and not unit.reason:
            unit.reason = f"{many[0]} is called {calls[many[0]]} times in one forward"
    _number(units)
    per_sample = {e.add for e in edges if (_shape(e.add) or (0,))[0] == batch}
    return _Analysis(twin, traced, sample, example, batch, tolerance, units, left_out, edges_of,
                     _with_switches(traced, edges, batch), per_sample, additions, parents)


def _parents(units: list[FoundUnit], edges: list[Edge], edges_of: dict[str, list[Edge]],
             modules: dict[str, list[torch.fx.Node]]) -> dict[str, str]:
    """For each block, the module enclosing it that may stand for it should it fail its proof (a block whose shortcut
    arrives as another argument than its first is removable only as the caller that passes it its stream): the
    parent holds no other addition and its output is its input plus the same branches. Fills `edges_of` for them."""
    parents = {}
    for unit in units:
        name = unit.name
        while unit.kind == "block" and "." in name:
            parent = name.rsplit(".", 1)[0]
            inner = [e for e in edges if _inside(e.owner, parent)]
            walked, why = _block_edges(parent, inner, modules)
            if why or {e.add for e in inner} != {e.add for e in edges_of[name]}:
                break
            parents[name], edges_of[parent], name = parent, walked, parent
    return parents


def _settle(found: _Analysis) -> None:
    """Prove every unit; a block that fails gives way to the enclosing module that passes it its stream, proven in
    turn, while there is one."""
    _prove(found, found.units)
    for i, unit in enumerate(found.units):
        while not unit.removable and (parent := found.parents.get(unit.name)) is not None:
            candidate = FoundUnit(parent, "block", parent)
            if _count_calls(found.twin, [parent], found.sample).get(parent) != 1:
                break
            _prove(found, [candidate])
            if not candidate.removable:
                break
            for sub in found.units:
                if sub.root == unit.name:
                    sub.root = parent
            found.units[i] = unit = candidate
    _number(found.units)


def _undecided(units: list[FoundUnit]) -> list[FoundUnit]:
    return [u for u in units if not u.removable and not u.reason and u.error is not None]


def _decide(model: nn.Module, found: _Analysis, input_size: Sequence[int], seed: int) -> None:
    """Prove again in float64, on the same draw, the units whose float32 proof was within rounding; where the model's
    code does not run in float64, they pass within float32's TOLERANCE."""
    undecided = _undecided(found.units)
    if not undecided:
        return
    try:
        precise = _analyse(model, input_size, seed, torch.float64)
    except Exception:  # noqa: BLE001 - code that fixes its own dtype: float32's tolerance decides
        precise = None
    twins = {u.name: u for u in precise.units} if precise is not None else {}
    again = [twins[u.name] for u in undecided if u.name in twins]
    if precise is not None:
        _prove(precise, again)
    for unit in undecided:
        twin = twins.get(unit.name)
        if twin is not None and (twin.error is not None or twin.reason):
            unit.removable, unit.error, unit.reason, unit.dtype = twin.removable, twin.error, twin.reason, twin.dtype
        else:
            unit.removable = unit.error <= TOLERANCE
            unit.reason = "" if unit.removable else "its removal is not its branch contributing nothing"


def discover(model: nn.Module, input_size: Sequence[int]) -> Discovery:
    """The depth units of `model` at per-sample `input_size`, each proven (see the module docstring). The model is
    left as it was (the proofs run on a copy); discovery draws from its own generator. Raises
    :class:`DiscoveryError` when the graph does not trace."""
    started = time.perf_counter()
    found = _analyse(model, input_size, SEED)
    _settle(found)
    _decide(model, found, input_size, SEED)
    return Discovery(tuple(input_size), found.units, found.left_out, found.additions, time.perf_counter() - started)


def recheck(model: nn.Module, discovery: Discovery, seed: int = 1) -> dict[str, FoundUnit | None]:
    """Each removable unit of `discovery` proven again on another draw (parameters and input from `seed`), as it came
    out (its `removable`, `error` and `reason`); None where the unit is not found again."""
    again = _analyse(model, discovery.input_size, seed)
    _settle(again)
    _decide(model, again, discovery.input_size, seed)
    found = {u.name: u for u in again.units}
    return {u.name: found.get(u.name) for u in discovery.removable()}
