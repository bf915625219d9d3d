"""Depth units discovered from the graph of any timm model (zoo.models.discovery, zoo.models.timm_any): the same
removable blocks as the declared families on timm's own models, hand-checked unit lists on small models, sub-layers
of transformer blocks removed exactly, the pruned model saved and rebuilt, and the refusals (no removable unit, a
graph that does not trace at the run's input size, an unknown name) before any work."""

from __future__ import annotations

import pytest
import torch

import zoo
from zoo.errors import ZooError
from zoo.models.depth import ZeroLike
from zoo.models.discovery import DiscoveryError

from ..helpers import TINY_PRUNE, prune_in_process


def removable_blocks(model: torch.nn.Module) -> list[str]:
    return [u.name for u in model.depth_unit_specs() if u.kind == "block" and u.removable]


@pytest.mark.parametrize("name", ["mobilenetv2_100", "resnetv2_50x1_bit"])
def test_discovery_finds_the_declared_families_removable_blocks(name):
    """timm's own model, traced, has exactly the removable blocks our declaration lists (same names, same order)."""
    declared = zoo.create_model(name)
    discovered = zoo.create_model(f"timm/{name}")
    assert removable_blocks(discovered) == removable_blocks(declared) and removable_blocks(declared)


def test_a_block_whose_activation_after_the_addition_changes_its_input_is_not_removable():
    """TResNet-M: the declared family removes body.layer1.0 with its ReLU (a different network, healed by
    fine-tuning); discovery only offers exact removals, and that block's ReLU after the addition is not the identity
    on its input (the stem ends in a leaky ReLU, so the stream holds negatives). Every other removable block is the
    declaration's."""
    declared = removable_blocks(zoo.create_model("tresnet_m"))
    model = zoo.create_model("timm/tresnet_m")
    assert removable_blocks(model) == [n for n in declared if n != "body.layer1.0"]
    with torch.no_grad():
        stream = model.body[:2](torch.randn(1, 3, 64, 64))  # space-to-depth and the stem: layer1.0's input
    assert float(stream.min()) < 0


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
    sub-layer leaves the block computing the other branch alone, exactly."""
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
        assert isinstance(pruned.blocks[3].norm1, ZeroLike)
        torch.testing.assert_close(pruned.blocks[3](x), without_attention, rtol=0, atol=0)
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


def test_a_model_without_a_removable_unit_or_a_trace_is_refused_with_the_reason(tmp_path):
    """prune.py refuses at validation, before any work: a model with no removable residual unit; a model built for
    another input size than the data's (with the option that fixes it); an unknown tag (with timm's); an option
    value that builds a model that does not run (a wrong option, not a tracing failure); a backbone form; an
    unknown timm name (with the closest)."""
    tiny = [o for o in TINY_PRUNE if not o.startswith("model=")]
    cases = [
        (["model.name=mobilenetv1_100"], "has no removable residual unit"),
        (["model.name=deit_tiny_patch16_224"], "+model.overrides.img_size=16"),
        (["model.name=resnet18.no_such_tag"], "Unknown tag 'no_such_tag' for timm's resnet18; timm lists: a1_in1k"),
        (["model.name=resnet18", "+model.overrides.drop_rate=fast"], "an option's value has the wrong type"),
        (["model.name=resnet18", "+model.overrides.features_only=true"], "model.overrides.features_only makes a "
                                                                          "backbone"),
    ]
    for extra, message in cases:
        out = prune_in_process(*tiny, "logger=none", "model=timm", *extra, base=tmp_path)
        assert out.returncode == 2 and message in out.stdout, out.stdout[-1500:]
        assert "Traceback" not in out.stdout and not (tmp_path / "outputs").exists()
    with pytest.raises(ZooError, match="Closest timm names: timm/convnext_atto"):
        zoo.create_model("timm/convnextt_atto")
    with pytest.raises(DiscoveryError, match="no removable residual unit"):
        zoo.create_model("timm/mobilenetv1_100")


def test_prune_py_prunes_a_timm_model_by_its_name(tmp_path):
    """``prune.py model=timm model.name=resnet18``: the baseline trained, its discovered blocks timed and searched, the
    plan applied and fine-tuned, results that say where the units came from, the checkpoint rebuilt by zoo.load."""
    import json

    tiny = [o for o in TINY_PRUNE if not o.startswith("model=")]
    out = prune_in_process(*tiny, "logger=none", "model=timm", "model.name=resnet18", "prune.target_speedup=1.3",
                           "prune.target_corrections=0", "prune.search=dp", base=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["model"] == "timm/resnet18" and results["plan"]["remove"]
    assert set(results["plan"]["remove"]) <= {"layer1.0", "layer1.1", "layer2.1", "layer3.1", "layer4.1"}
    assert "discovered from the graph" in results["depth_units"]
    assert zoo.load(results["checkpoint"]).zoo_plan["remove"] == results["plan"]["remove"]


def test_zoo_list_prunable_says_which_timm_models_prune_and_why_not(capsys):
    from zoo.__main__ import main

    assert main(["list", "--prunable", "timm/mobilenetv1_10[0]"]) == 0
    out = capsys.readouterr().out
    assert "timm/mobilenetv1_100" in out and "no residual addition" in out
    assert main(["list", "--prunable", "timm/resnet1[08]"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("timm/")]
    assert ["timm/resnet18", "yes", "5", "0"] in rows
