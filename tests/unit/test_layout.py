"""The package layout: no import cycles (function-level imports included), every module in a folder that names its
layer, and the layers in one order: a package never imports one above it."""

from __future__ import annotations

import ast
from pathlib import Path

import zoo

PACKAGE = Path(zoo.__file__).parent
ROOT = PACKAGE.parent

# The layers, bottom up: each is a package of zoo (or, at the bottom, the small shared files at its top). A module may
# import from its own package and from the packages below it, never from one above.
PACKAGES = ["shared", "models", "deploy", "pruning", "weights", "latency", "training", "jobs", "cli"]
SHARED = {"errors", "files", "lazy", "signals"}  # small files at the top of zoo/ that every layer may use
CLI = {"__main__"}  # python -m zoo: the top


def package_of(module: str) -> str:
    """The layer a module of zoo belongs to: its package, or ``shared``/``cli`` for the files at the top."""
    head = module.split(".")[0]
    if head in SHARED:
        return "shared"
    if head in CLI:
        return "cli"
    return head


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


def test_every_module_is_in_a_layer_folder():
    """Every module of zoo/ lives in a package that names its layer, except the small shared files and the CLI."""
    unplaced = sorted(m for m in graph() if m and package_of(m) not in PACKAGES)
    assert not unplaced, f"modules outside the layer packages {PACKAGES}: {unplaced}"


def test_lower_layers_never_import_higher_ones():
    rank = {name: i for i, name in enumerate(PACKAGES)}
    upward = [f"{m} ({package_of(m)}) imports {t} ({package_of(t)})" for m, targets in graph().items() if m
              for t in targets if t and package_of(t) in rank and rank[package_of(t)] > rank[package_of(m)]]
    assert not upward, upward


def test_every_result_file_is_cited_or_in_the_manifest():
    """Evidence has one home: every file in results/ is named by a page (README, docs/, results/README.md), by its
    name or by one of the manifest's name patterns (``<model>``, ``[_<date>]`` and ``*`` stand for any text)."""
    import re

    results = ROOT / "results"
    pages = "\n".join(p.read_text() for p in [ROOT / "README.md", results / "README.md", *ROOT.glob("docs/*.md")])
    patterns = []
    rows = [line.split("|")[1] for line in (results / "README.md").read_text().splitlines() if line.startswith("| ")]
    for name in (name for row in rows for name in re.findall(r"`([^`]+)`", row)):  # the manifest's file column
        if re.search(r"[<*\[]", name):
            regex = re.escape(name).replace(r"\*", ".*")
            regex = re.sub(r"\\\[.*?\\\]", ".*", regex)
            patterns.append(re.compile(re.sub(r"<[^>]*>", ".*", regex) + "$"))
    uncited = [f.name for f in results.iterdir() if f.name != "README.md"
               and f.name not in pages and not any(p.match(f.name) for p in patterns)]
    assert not uncited, f"results/ files no page cites: {uncited}"


def test_only_the_jobs_and_entry_points_read_a_hydra_config():
    """Hydra and OmegaConf are imported only in ``zoo/jobs/`` and the ``__main__`` entry points: the layers below take
    typed values (``zoo.training.settings``), so a config is read once, at the jobs' boundary."""
    readers = []
    for path in PACKAGE.rglob("*.py"):
        name = module_name(path)
        if package_of(name) in ("jobs", "cli") or path.name == "__main__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            modules = ([node.module or ""] if isinstance(node, ast.ImportFrom) else
                       [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            readers += [f"{name} imports {m}" for m in modules if m.split(".")[0] in ("hydra", "omegaconf")]
    assert not readers, readers


def test_a_config_group_becomes_its_typed_value_once():
    """``typed`` turns a composed group into the training library's dataclass (every field carried), and passes a
    typed value through unchanged."""
    from dataclasses import asdict

    from omegaconf import OmegaConf

    from zoo.jobs.train_config import TrainConfig, typed
    from zoo.training.settings import DataConfig, TrainerConfig

    cfg = OmegaConf.merge(OmegaConf.structured(TrainConfig), {"data": {"image_size": 24, "files": ["a.txt"]},
                                                               "trainer": {"max_epochs": 3}})
    data = typed(cfg.data, DataConfig)
    assert isinstance(data, DataConfig) and asdict(data) == OmegaConf.to_container(cfg.data)
    assert data.image_size == 24 and data.files == ["a.txt"] and typed(data, DataConfig) is data
    trainer = typed(OmegaConf.create(OmegaConf.to_container(cfg.trainer)), TrainerConfig)  # an untyped node too
    assert isinstance(trainer, TrainerConfig) and trainer.max_epochs == 3


def test_a_study_loads_no_benchmark_suite():
    """The lab apart from the product: a study (``studies/``) may use the suites' shared pieces
    (``benchmarks.common``), never a suite itself, so each study imports without loading any suite."""
    shared = {"benchmarks", "benchmarks.common"}
    loads = []
    for path in sorted((ROOT / "studies").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "benchmarks":  # from benchmarks import x
                modules = [f"benchmarks.{a.name}" for a in node.names]
            else:
                modules = ([node.module or ""] if isinstance(node, ast.ImportFrom) else
                           [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            loads += [f"studies/{path.name} imports {m}" for m in modules
                      if m.split(".")[0] == "benchmarks" and m not in shared]
    assert not loads, loads
