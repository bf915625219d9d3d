"""Depth units discovered from the graph of any timm model (zoo.models.discovery, zoo.models.timm_any): the same
removable blocks as the declared families on timm's own models, hand-checked unit lists on small models, sub-layers
of transformer blocks removed exactly, the pruned model saved and rebuilt, and the refusals (no removable unit, a
graph that does not trace at the run's input size, an unknown name) before any work."""

from __future__ import annotations

import pytest
import torch

import zoo


def removable_blocks(model: torch.nn.Module) -> list[str]:
    return [u.name for u in model.depth_unit_specs() if u.kind == "block" and u.removable]


@pytest.mark.parametrize("name", ["mobilenetv2_100"])  # (BiT's: tests/e2e/test_discovery_slow.py)
def test_discovery_finds_the_declared_families_removable_blocks(name):
    """timm's own model, traced, has exactly the removable blocks our declaration lists (same names, same order)."""
    declared = zoo.create_model(name)
    discovered = zoo.create_model(f"timm/{name}")
    assert removable_blocks(discovered) == removable_blocks(declared) and removable_blocks(declared)


def test_resnet18_blocks_by_hand():
    """ResNet-18: the second block of each stage and both of the first stage keep their input as shortcut (their ReLU
    after the addition follows a ReLU: the identity on its input); the first block of stages 2-4 downsamples (a
    computed shortcut): not a unit. No sub-layers: one branch each."""
    model = zoo.create_model("timm/resnet18", num_classes=10)
    units = model.depth_unit_specs()
    assert [(u.name, u.removable, u.stage) for u in units] == [
        ("layer1.0", True, 0), ("layer1.1", True, 0), ("layer2.1", True, 1), ("layer3.1", True, 2),
        ("layer4.1", True, 3)]
    assert all(u.kind == "block" for u in units)
    assert "activations are not merged" in model.zoo_depth_note


def test_a_shortcut_passed_in_from_outside_is_not_the_blocks_input():
    """DLA-34: a tree's first block adds a shortcut its parent computes (a projection of the tree's input to the
    block's output channels), so removing the block would hand on its input with the wrong channels: such blocks are
    not units; every block offered prunes to a model that runs."""
    model = zoo.create_model("timm/dla34", num_classes=10).eval()
    units = {u.name: u.removable for u in model.depth_unit_specs()}
    assert "level2.tree1" not in units and "level5.tree1" not in units and units["level2.tree2"] is True
    removable = [name for name, ok in units.items() if ok]
    with torch.no_grad():
        out = zoo.apply_plan(model, {"remove": removable}, inplace=False).eval()(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 10)


def test_vit_blocks_and_their_attention_and_mlp_sublayers_by_hand():
    """DeiT-tiny: 12 blocks, each with its attention and MLP sub-layers (named by their largest module); removing a
    sub-layer leaves the block computing the other branch alone, exactly, with no op of the removed one left: no
    zeros, no addition of them."""
    model = zoo.create_model("timm/deit_tiny_patch16_224", num_classes=10, img_size=32).eval()
    units = model.depth_unit_specs()
    assert len(units) == 36 and [(u.name, u.kind) for u in units[:3]] == [
        ("blocks.0.attn", "sublayer"), ("blocks.0.mlp", "sublayer"), ("blocks.0", "block")]
    assert units[0].merge == ("blocks.0.norm1", "blocks.0.attn")
    assert units[1].merge == ("blocks.0.norm2", "blocks.0.mlp")
    x = torch.randn(2, 5, 192)  # a block's input: 4 patch tokens and the class token
    block = model.blocks[3]
    with torch.no_grad():
        without_attention = x + block.drop_path2(block.ls2(block.mlp(block.norm2(x))))
        pruned = zoo.apply_plan(model, {"remove": ["blocks.3.attn"]}, inplace=False).eval()
        assert not hasattr(pruned.blocks[3], "norm1") and not hasattr(pruned.blocks[3], "attn")
        torch.testing.assert_close(pruned.blocks[3](x), without_attention, rtol=0, atol=0)
    graph = torch.export.export(pruned.blocks[3], (x,), strict=False).graph
    ops = [str(n.target) for n in graph.nodes if n.op == "call_function"]
    assert not any("zeros" in op for op in ops) and sum("add" in op for op in ops) == 1, ops  # the MLP's residual
    assert "blocks.3.attn" not in [u.name for u in pruned.depth_unit_specs()]


def test_a_pruned_discovered_model_is_saved_rebuilt_and_exported(tmp_path):
    """A plan over blocks and sub-layers of a timm model: the checkpoint records it, zoo.load rebuilds the same
    network from the timm name, and its ONNX export matches it."""
    model = zoo.create_model("timm/deit_tiny_patch16_224", num_classes=10, img_size=32).eval()
    pruned = zoo.apply_plan(model, {"remove": ["blocks.0.attn", "blocks.5.mlp", "blocks.7"]}, inplace=False).eval()
    again = zoo.load(zoo.save_checkpoint(pruned, tmp_path / "pruned.safetensors")).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(again(x), pruned(x))
    assert again.zoo_name == "timm/deit_tiny_patch16_224"
    report = zoo.export(pruned, tmp_path / "pruned.pt2", format="torch_export")
    assert report.passed


def test_zoo_list_prunable_says_which_timm_models_prune_and_why_not(capsys):
    from zoo.__main__ import main

    assert main(["list", "--prunable", "timm/mobilenetv1_10[0]"]) == 0
    out = capsys.readouterr().out
    assert "timm/mobilenetv1_100" in out and "no residual addition" in out
    assert main(["list", "--prunable", "timm/resnet1[08]"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("timm/")]
    assert ["timm/resnet18", "yes", "5", "0"] in rows
