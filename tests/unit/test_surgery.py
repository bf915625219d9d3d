"""Plans and surgery: exact conv merging, plan application for every family, segments."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import zoo
from zoo.pruning import surgery
from zoo.pruning.surgery import compose_convs

from ..helpers import max_rel_diff, randomise_norm_stats, small_model


def _conv(cin: int, cout: int, k: int, stride: int, depthwise: bool) -> nn.Conv2d:
    conv = nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, groups=cin if depthwise else 1, bias=True)
    nn.init.normal_(conv.weight, std=0.3)
    nn.init.normal_(conv.bias, std=0.3)
    return conv


MERGE_CASES = [  # (k_a, s_a, dw_a, k_b, s_b, dw_b): every merge type MobileNetV2/TResNet produce, and more
    (1, 1, False, 3, 1, True),   # pw -> dw (MBV2 act1)
    (1, 1, False, 3, 2, True),   # pw -> strided dw
    (3, 1, True, 1, 1, False),   # dw -> pw (MBV2 act2)
    (3, 2, True, 1, 1, False),   # strided dw -> pw
    (3, 1, False, 3, 1, False),  # dense 3x3 -> 3x3 (TResNet basic)
    (1, 1, False, 3, 1, False),  # 1x1 -> 3x3 (TResNet bottleneck)
    (3, 1, True, 3, 1, True),    # dw -> dw stays depthwise
    (3, 2, False, 3, 1, False),  # strided first conv: kernel 3 + 2*2 = 7
]


@pytest.mark.parametrize("ka,sa,dwa,kb,sb,dwb", MERGE_CASES)
def test_merged_conv_equals_linearised_pair(ka, sa, dwa, kb, sb, dwb):
    torch.manual_seed(0)
    chans = 6
    a, b = _conv(chans, chans, ka, sa, dwa), _conv(chans, chans, kb, sb, dwb)
    merged = compose_convs(a, b)
    assert merged.kernel_size[0] == ka + (kb - 1) * sa and merged.stride[0] == sa * sb
    assert (merged.groups == chans) == (dwa and dwb)
    x = torch.randn(2, chans, 17, 17)
    pad = merged.padding[0]
    # The linearised pair with all padding moved to the first conv: pad once, then valid convs.
    z = F.pad(x, (pad,) * 4)
    reference = F.conv2d(F.conv2d(z, a.weight, a.bias, sa, 0, 1, a.groups), b.weight, b.bias, sb, 0, 1, b.groups)
    with torch.no_grad():
        assert max_rel_diff(reference, merged(x)) <= 1e-5
        original = b(a(x))  # the original zero-padded pair: it differs only where b's window reaches a's border
        assert original.shape == reference.shape
        height_a = a(x).shape[-1]
        pb = b.padding[0]
        first, last = -(-pb // sb), (height_a - kb + pb) // sb  # b's outputs whose window lies inside a's output
        assert last >= first
        inside = (..., slice(first, last + 1), slice(first, last + 1))
        assert max_rel_diff(reference[inside], original[inside]) <= 1e-5


@pytest.mark.parametrize("family", zoo.list_families(task="classification"), ids=lambda f: f.name)
def test_merged_plan_equals_linearised_plan(family):
    torch.manual_seed(0)
    model = randomise_norm_stats(small_model(family, num_classes=10)).eval()
    units = zoo.depth_units(model, (3, 64, 64))
    acts = [u.name for u in units if u.kind == "act"]
    if not acts:
        pytest.skip(f"{family.name} has no removable activations to merge around")
    blocks = [u.name for u in units if u.kind == "block" and u.removable]
    plan = {"remove": acts + blocks[:2]}
    linear = zoo.apply_plan(model, {**plan, "merge": False}, inplace=False).eval()
    merged = zoo.apply_plan(model, plan, inplace=False).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert max_rel_diff(linear(x), merged(x)) <= 1e-4
    convs = lambda m: sum(isinstance(c, nn.Conv2d) for c in m.modules())  # noqa: E731
    assert convs(merged) < convs(linear) < convs(model) + len(acts)


def test_whole_block_collapses_to_one_conv_with_folded_shortcut():
    model = randomise_norm_stats(zoo.create_model("mobilenetv2_050", num_classes=4)).eval()
    block_name = "blocks.2.1"  # a stride-1 inverted residual with an identity shortcut
    block = model.get_submodule(block_name)
    assert block.has_skip
    pruned = zoo.apply_plan(model, {"remove": [f"{block_name}.bn1.act", f"{block_name}.bn2.act"]}, inplace=False)
    rebuilt = pruned.get_submodule(block_name)
    assert isinstance(rebuilt, surgery.ChainBlock) and rebuilt.shortcut is None
    (conv,) = [m for m in rebuilt.modules() if isinstance(m, nn.Conv2d)]
    assert conv.kernel_size == (3, 3) and conv.groups == 1
    x = torch.randn(1, block.conv_pw.in_channels, 16, 16)
    linear = surgery.rebuild_block(block, {"bn1.act", "bn2.act"}, merge=False).eval()
    with torch.no_grad():
        assert max_rel_diff(linear(x), rebuilt(x)) <= 1e-5


def test_plan_module_counts_for_every_family():
    x = torch.randn(1, 3, 64, 64)
    for family in zoo.list_families(task="classification"):
        model = small_model(family, num_classes=3).eval()
        units = zoo.depth_units(model, (3, 64, 64))
        removable = [u.name for u in units if u.kind == "block" and u.removable]
        pruned = zoo.apply_plan(model, {"remove": removable[:3]}, inplace=False)
        identities = sum(isinstance(pruned.get_submodule(n), nn.Identity) for n in removable[:3])
        assert identities == 3
        with torch.no_grad():
            assert pruned(x).shape == (1, 3)
        assert len(zoo.depth_units(pruned, (3, 64, 64))) < len(units)


def test_segments_and_variants():
    model = zoo.create_model("mobilenetv2_050")
    segs = surgery.segments(model)
    assert len(segs) == 17  # one per block
    ir = next(s for s in segs if s.removable and len(s.acts) == 2)
    variants = ir.variants()
    assert len(variants) == 5 and frozenset({ir.name}) in variants and frozenset() in variants
    for removed in variants:
        module = surgery.build_segment(model, ir, removed)
        assert isinstance(module, nn.Identity) == (ir.name in removed)
    bit = surgery.segments(zoo.create_model("resnetv2_50x1_bit"))
    assert all(not s.acts for s in bit) and sum(s.removable for s in bit) == 12


@pytest.mark.parametrize("plan,match", [
    ({"remove": ["blocks.9.9"]}, "not depth units"),
    ({"remove": ["blocks.1.0"]}, "cannot be removed"),
    ({"remove": "blocks.1.1"}, "A plan is a mapping"),
    ({"remove": [], "prune": True}, "Unknown plan keys"),
    ({"model": "tresnet_m", "remove": []}, "made for 'tresnet_m'"),
])
def test_bad_plans_are_refused(plan, match):
    model = zoo.create_model("mobilenetv2_035")
    with pytest.raises(zoo.PlanError, match=match):
        zoo.apply_plan(model, plan, inplace=False)


def test_all_variant_combinations_of_one_block_are_exact():
    model = randomise_norm_stats(zoo.create_model("tresnet_m", num_classes=2)).eval()
    name = "body.layer4.1"
    acts = ["conv1.bn.act", "conv2.bn.act"]
    block = model.get_submodule(name)
    x = torch.randn(1, block.conv1.conv.in_channels, 4, 4)
    for r in range(1, 3):
        for removed in itertools.combinations(acts, r):
            merged = surgery.rebuild_block(block, set(removed), merge=True).eval()
            linear = surgery.rebuild_block(block, set(removed), merge=False).eval()
            with torch.no_grad():
                assert max_rel_diff(linear(x), merged(x)) <= 1e-4


def test_progressive_linearisation_then_finalize_equals_merged_plan():
    torch.manual_seed(0)
    model = randomise_norm_stats(zoo.create_model("mobilenetv2_050", num_classes=4)).eval()
    acts = [u.name for u in zoo.depth_units(model, (3, 32, 32)) if u.kind == "act"][2:8]
    fading = zoo.apply_plan(model, {"remove": acts, "merge": False}, inplace=False, blend=True).eval()
    blends = [m for m in fading.modules() if isinstance(m, surgery.LinearisingAct)]
    assert len(blends) == len(acts)
    block_name = "blocks.2.0"  # one of the rebuilt blocks: its output shows the blend directly
    assert any(a.startswith(block_name + ".") for a in acts)
    block = fading.get_submodule(block_name)
    x = torch.randn(2, block.layers[0].convs[0].in_channels, 8, 8)
    with torch.no_grad():
        at_zero = block(x)
        surgery.set_linearisation(fading, 1.0)
        at_one = block(x)
    assert max_rel_diff(at_one, at_zero) > 1e-3
    surgery.set_linearisation(fading, 0.5)
    run = next(m for m in fading.modules() if isinstance(m, surgery.LinearRun))
    with pytest.raises(zoo.PlanError, match="not yet fully linear"):
        run.merged()
    final = surgery.finalize_merges(fading).eval()
    merged = zoo.apply_plan(model, {"remove": acts}, inplace=False).eval()
    assert final.zoo_plan["merge"] is True
    assert list(final.state_dict()) == list(merged.state_dict())
    with torch.no_grad():
        assert max_rel_diff(at_one, final.get_submodule(block_name)(x)) <= 1e-5
        assert max_rel_diff(merged.get_submodule(block_name)(x), final.get_submodule(block_name)(x)) <= 1e-5
