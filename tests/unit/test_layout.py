"""The package layout: no import cycles (function-level imports included), lower layers never import higher ones,
and ``import zoo`` stays light."""

from __future__ import annotations

import ast
from pathlib import Path

import zoo

PACKAGE = Path(zoo.__file__).parent

# Each module's layer: a module may import its own layer and the ones below, never a higher one.
LAYERS = [
    {"errors", "lazy", "files", "signals"},
    {"registry", "tags", "depth", "features", "fuse", "checkpoint", "quantization", "latency.device",
     "latency.correction"},
    {"surgery", "pretrained", "models.retention", "models.mobilenetv2", "models.tresnet", "models.resnetv2",
     "models.retnet", "models.plainresnet", "models", "search", "latency.cache"},
    {"capture"},
    {"factory", "exporting", "latency.measure", "latency.context", "latency.runtime", "latency.settings",
     "latency.drift", "latency.keys", "latency.rounds", "latency.protocol", "latency.table", "importance"},
    {"latency.networks", "latency.accuracy", "latency.build", "latency", "training.distributed", "training.state",
     "training.logger", "training.config", "training.data"},
    {"training.engine", "training"},
    {"jobs.runs", "jobs.cli", "jobs.models", "jobs.train", "jobs.prune_results", "jobs.card", "jobs.prune_config",
     "jobs.baseline", "jobs.plan", "jobs.quantized", "jobs.finetune", "jobs.measure", "jobs.prune", "jobs", "report",
     "__main__", "latency.__main__"},
]


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """The zoo modules `path` imports, at module level or inside functions (relative or absolute)."""
    name = module_name(path)
    package = name.split(".")[:-1] if path.name != "__init__.py" else name.split(".") if name else []
    found = set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):  # every import counts, those for type checkers only too
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1] if node.level > 1 else package
                target = ".".join([*base, *(node.module.split(".") if node.module else [])])
            elif node.module and node.module.split(".")[0] == "zoo":
                target = node.module.removeprefix("zoo").lstrip(".")
            else:
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}" if target else alias.name
                found.add(sub if (PACKAGE / sub.replace(".", "/")).with_suffix(".py").exists() or
                          (PACKAGE / sub.replace(".", "/")).is_dir() else target)
        elif isinstance(node, ast.Import):
            found |= {a.name.removeprefix("zoo").lstrip(".") for a in node.names if a.name.split(".")[0] == "zoo"}
    return {m for m in found if m != name}


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports_of(p) for p in PACKAGE.rglob("*.py")}


def test_there_is_no_import_cycle():
    edges = graph()
    edges[""] = edges.get("", set())  # the package itself
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if nxt not in edges or nxt == "":  # the package __init__ re-exports; it is not a layer
                continue
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(edges):
        if node and node not in state:
            visit(node, [node])
    assert not cycles, cycles


def test_lower_layers_never_import_higher_ones():
    layer_of = {m: i for i, layer in enumerate(LAYERS) for m in layer}
    edges = graph()
    unplaced = sorted(m for m in edges if m and m not in layer_of)
    assert not unplaced, f"modules without a layer: {unplaced}"
    upward = [f"{m} (layer {layer_of[m]}) imports {t} (layer {layer_of[t]})" for m, targets in edges.items() if m
              for t in targets if t in layer_of and layer_of[t] > layer_of[m]]
    assert not upward, upward
