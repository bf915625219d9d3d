"""A model family is one file. The in-tree plain ResNet (zoo/models/plainresnet.py) is checked here the way
docs/architecture.md ("Adding a model family") walks through it, and every registry-driven test and benchmark picks
it up with no list edited; a family from outside the tree (tests/plugin_family.py) reaches train.py and prune.py
through ``DEPTHZOO_MODULES``."""

from __future__ import annotations

import pytest
import torch

import zoo
from zoo.models.registry import CAPABILITIES, TASKS, register_family


def test_every_registered_model_belongs_to_a_declared_family():
    for name in zoo.list_models():
        entry = zoo.get_entry(name)
        family = zoo.get_family(entry.family)
        assert entry.task == family.task, name
        assert family.capabilities <= set(CAPABILITIES) and family.task in TASKS
    assert "plainresnet" in [f.name for f in zoo.list_families()]
    assert [f.name for f in zoo.list_families(task="language_model")] == ["retnet"]


def test_a_family_declaration_is_checked():
    with pytest.raises(ValueError, match="declared already"):
        register_family("plainresnet", reference="plainresnet18", small="plainresnet8", test_input_size=(3, 8, 8))
    with pytest.raises(ValueError, match="not one of its registered classification models"):
        register_family("elsewhere", reference="plainresnet18", small="plainresnet8", test_input_size=(3, 8, 8))
    with pytest.raises(ValueError, match="Unknown capabilities"):
        register_family("x", reference="a", small="a", test_input_size=(1,), capabilities=("flying",))
    with pytest.raises(zoo.UnknownModelError, match="Unknown family"):
        zoo.get_family("no_such_family")


def test_depth_units_follow_from_the_declaration():
    model = zoo.create_model("plainresnet8")
    units = zoo.depth_units(model, (3, 16, 16))
    assert [(u.name, u.kind, u.removable) for u in units] == [
        ("stages.0.0.act1", "act", True), ("stages.0.0", "block", True),
        ("stages.0.1.act1", "act", True), ("stages.0.1", "block", True),
        ("stages.1.0.act1", "act", True), ("stages.1.0", "block", False),
        ("stages.1.1.act1", "act", True), ("stages.1.1", "block", True)]
    act = units[0]
    assert act.mergeable and act.merge == ("stages.0.0.conv1", "stages.0.0.bn1", "stages.0.0.conv2", "stages.0.0.bn2")


def test_table_search_surgery_and_checkpoint(tmp_path):
    from zoo.latency import TableSettings, build_table
    from zoo.pruning.search import Choice, dp_search

    from ..helpers import randomise_norm_stats

    torch.manual_seed(0)
    model = randomise_norm_stats(zoo.create_model("plainresnet8", num_classes=4)).eval()
    settings = TableSettings(warmup_s=0.05, entry_warmup_s=0.0, min_rounds=2, max_rounds=3)
    table = build_table(model, input_size=16, device="cpu", cache_dir=str(tmp_path), settings=settings)
    assert [s.name for s in table.segments] == [f"stages.{s}.{i}" for s in range(2) for i in range(2)]
    options = [[Choice(v, cost, float(len(v))) for v, cost in costs] for costs in table.segment_costs()]
    fastest = table.fixed_cost() + sum(min(c.latency for c in seg) for seg in options)
    result = dp_search(options, (table.predict() + fastest) / 2 - table.fixed_cost())
    plan = {"remove": result.removed(options), "merge": True}
    assert plan["remove"]
    merged = zoo.apply_plan(model, plan, inplace=False).eval()
    linear = zoo.apply_plan(model, {**plan, "merge": False}, inplace=False).eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert torch.allclose(merged(x), linear(x), rtol=1e-4, atol=1e-5)
        loaded = zoo.load(zoo.save_checkpoint(merged, tmp_path / "pruned.safetensors")).eval()
        assert torch.equal(merged(x), loaded(x))
        assert torch.allclose(zoo.fuse(model)(x), model(x), rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------------ the command lines
