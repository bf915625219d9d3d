"""Discovery is exact on models nobody listed: on random networks built from residual and non-residual blocks
(hypothesis), it offers every block that is a residual around its own input and nothing else, and each removal
equals the network with that block's branch zeroed; on a spread of timm families, the prunable model computes
timm's logits, every unit is proven again on a second draw, segments never overlap and ``zoo list --prunable``
counts the units ``create_model`` offers; a user's own ``nn.Module`` becomes prunable, picklable and scriptable."""

from __future__ import annotations

import copy
import dataclasses
import io
import pickle

import pytest
import timm
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import zoo
from zoo.errors import PlanError
from zoo.models.discovery import DiscoveryError, recheck
from zoo.pruning.surgery import segments, uncovered

CHANNELS = 6
SIDE = 8


class Branch(nn.Module):
    """A residual branch ending in a 1x1 conv (`g`): zeroing `g` zeroes the branch exactly."""

    def __init__(self) -> None:
        super().__init__()
        self.f = nn.Sequential(nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1), nn.GELU())
        self.g = nn.Conv2d(CHANNELS, CHANNELS, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.g(self.f(x))


class Residual(nn.Module):
    """``x + branch(x)``: removable (the truth)."""

    def __init__(self, inner: nn.Module | None = None) -> None:
        super().__init__()
        self.branch = inner if inner is not None else Branch()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.branch(x)


class SigmoidAfter(Residual):
    """``sigmoid(x + branch(x))``: the activation after the addition is not the identity on the stream."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(x + self.branch(x))


class LayoutFirst(Residual):
    """The shortcut is the input transposed (same size): removing the block would not transpose."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.transpose(2, 3)
        return x + self.branch(x)


class SecondArgument(nn.Module):
    """``b + branch(a)``: the block's shortcut is its second argument."""

    def __init__(self) -> None:
        super().__init__()
        self.branch = Branch()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return b + self.branch(a)


class CallsSecondArgument(nn.Module):
    """``inner(mix(x), x)``: the inner block is not removable (it would pass on ``mix(x)``); this outer one is, its
    shortcut being its own input."""

    def __init__(self) -> None:
        super().__init__()
        self.mix = nn.Conv2d(CHANNELS, CHANNELS, 1)
        self.inner = SecondArgument()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(self.mix(x), x)


LEAK = 1e-6


class Leaky(nn.Module):
    """``y = x + first(x); y + LEAK * (branch(y) - y)``: the block is removable, and so is `first`; `branch` is not
    (zeroing it leaves ``-LEAK * y``), a difference of about LEAK that float32 rounding hides and float64 shows."""

    def __init__(self) -> None:
        super().__init__()
        self.first = Branch()
        self.branch = Branch()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x + self.first(x)
        return y + LEAK * (self.branch(y) - y)


class Plain(nn.Module):
    """No residual: never a unit."""

    def __init__(self) -> None:
        super().__init__()
        self.branch = Branch()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.branch(x)


KINDS = {"residual": Residual, "nested": lambda: Residual(Residual()), "sigmoid": SigmoidAfter,
         "layout": LayoutFirst, "second": CallsSecondArgument, "plain": Plain, "leaky": Leaky}
REMOVABLE = {"residual", "nested", "second", "leaky"}


class Net(nn.Module):
    def __init__(self, kinds: list[str]) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, CHANNELS, 3, padding=1)
        self.blocks = nn.Sequential(*[KINDS[k]() for k in kinds])
        self.head = nn.Linear(CHANNELS * SIDE * SIDE, 4)  # not invariant to a layout change (a mean would be)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)).flatten(1))


class Zero(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x)


def zeroed(net: Net, index: int) -> Net:
    """`net` with block `index`'s outermost residual branch computing zeros."""
    twin = copy.deepcopy(net)
    block = twin.blocks[index]
    if isinstance(block, Leaky):
        block.first, block.branch, block.forward = Zero(), Zero(), lambda x: x  # both of its branches
    else:
        (block.inner if isinstance(block, CallsSecondArgument) else block).branch = Zero()
    return twin


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kinds=st.lists(st.sampled_from(sorted(KINDS)), min_size=1, max_size=5), seed=st.integers(0, 2**16))
def test_discovery_offers_exactly_the_residuals_around_their_input(kinds, seed):
    """On any stack of such blocks: the removable blocks are exactly the residuals around their own input (a
    shortcut given as a second argument, a layout change before the addition, an activation after it, no residual:
    never), each nested residual is a sub-layer of its block, and removing a block computes what the network with
    that block's branch zeroed computes, on a fresh input."""
    torch.manual_seed(seed)
    net = Net(kinds).eval()
    if not REMOVABLE & set(kinds):
        with pytest.raises(DiscoveryError, match="no removable residual unit"):
            zoo.depth_units(net, input_size=(3, SIDE, SIDE))
        return
    units = zoo.depth_units(net, input_size=(3, SIDE, SIDE))
    blocks = sorted(u.name for u in units if u.kind == "block" and u.removable)
    assert blocks == sorted(f"blocks.{i}" for i, k in enumerate(kinds) if k in REMOVABLE)
    subs = {u.name for u in units if u.kind == "sublayer" and u.removable}
    for i, kind in enumerate(kinds):
        if kind == "nested":
            assert f"blocks.{i}.branch.branch" in subs  # the inner residual's branch
        if kind == "leaky":
            assert f"blocks.{i}.first" in subs and f"blocks.{i}.branch" not in subs
    x = torch.randn(2, 3, SIDE, SIDE)
    for i, kind in enumerate(kinds):
        if kind not in REMOVABLE:
            continue
        pruned = zoo.apply_plan(net, {"remove": [f"blocks.{i}"]}, inplace=False).eval()
        with torch.no_grad():
            torch.testing.assert_close(pruned(x), zeroed(net, i).eval()(x), rtol=1e-5, atol=1e-5)


# A spread of timm families at small inputs: CNNs with activations after the addition, a ViT, class attention,
# a hybrid, a metaformer; (arch, options, per-sample input size). The slower half (5-7 s each on 2 cores) runs in
# tests/e2e/test_discovery_slow.py.
TIMM_SPREAD = [
    ("resnet18", {}, (3, 32, 32)),
    ("deit_tiny_patch16_224", {"img_size": 32}, (3, 32, 32)),
    ("cait_xxs24_224", {"img_size": 32, "depth": 4}, (3, 32, 32)),  # class attention: its shortcut is an argument
]
TIMM_SPREAD_SLOW = [
    ("convnext_atto", {}, (3, 32, 32)),
    ("efficientvit_b0", {}, (3, 64, 64)),
    ("poolformerv2_s12", {}, (3, 32, 32)),
]


@pytest.mark.parametrize(("arch", "options", "size"), TIMM_SPREAD, ids=[a for a, _, _ in TIMM_SPREAD])
def test_a_prunable_timm_model_is_timms_and_every_unit_it_offers_is_proven(arch, options, size):
    """The prunable model computes timm's logits exactly (same seed, same weights); every removable unit, proven at
    build, is proven again on another draw of weights and input; segments never overlap (segments() asserts it) and
    each offers its variants; ``zoo list --prunable`` counts exactly the removable units the model offers."""
    from zoo.models.timm_any import prunable

    torch.manual_seed(0)
    ours = zoo.create_model(f"timm/{arch}", num_classes=10, **options).eval()
    torch.manual_seed(0)
    theirs = timm.create_model(arch, num_classes=10, **options).eval()
    x = torch.randn(2, *size)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=0)
    found = ours.zoo_discovery
    assert found.removable()
    again = recheck(ours, found, seed=1)
    assert all(u is not None and u.removable for u in again.values()), again
    assert all(seg.variants() for seg in segments(ours))
    if not options:
        row = prunable(f"timm/{arch}")[0]
        offered = ours.depth_unit_specs()
        assert (row["blocks"], row["sublayers"]) == (
            sum(u.removable and u.kind == "block" for u in offered),
            sum(u.removable and u.kind == "sublayer" for u in offered))


def nested_net() -> Net:
    torch.manual_seed(0)
    return Net(["residual", "nested", "residual"]).eval()


def test_a_unit_nested_in_another_is_one_variant_of_its_segment_and_removed_with_it():
    """A residual inside another's branch: its segment times it alone, the outer alone, the block, never the outer
    with the inner (the same network as the outer alone); a plan naming both removes the outer; units that overlap
    without nesting are refused."""
    net = nested_net()
    units = {u.name: u for u in zoo.depth_units(net, input_size=(3, SIDE, SIDE))}
    segment = next(s for s in segments(net) if s.name == "blocks.1")
    assert ("blocks.1.branch", "blocks.1.branch.branch") in segment.nested
    assert frozenset({"blocks.1.branch", "blocks.1.branch.branch"}) not in segment.variants()
    assert segment.variant_of({"blocks.1.branch", "blocks.1.branch.branch"}) == frozenset({"blocks.1.branch"})
    assert uncovered(units, ["blocks.1.branch.branch", "blocks.1"]) == ["blocks.1"]
    x = torch.randn(2, 3, SIDE, SIDE)
    both = zoo.apply_plan(net, {"remove": ["blocks.1.branch", "blocks.1.branch.branch"]}, inplace=False).eval()
    outer = zoo.apply_plan(net, {"remove": ["blocks.1.branch"]}, inplace=False).eval()
    with torch.no_grad():
        torch.testing.assert_close(both(x), outer(x), rtol=0, atol=0)
    straddling = ("blocks.1.branch.branch.f", "blocks.0.branch")  # inside the inner unit, and outside the block
    fake = dataclasses.replace(units["blocks.1.branch"], name="fake", merge=straddling)
    overlapping = {**units, "fake": fake}
    with pytest.raises(PlanError, match="overlap without one containing the other"):
        uncovered(overlapping, ["fake", "blocks.1.branch.branch"])


def test_a_users_own_module_is_found_then_pruned_pickled_and_scripted(tmp_path):
    """Before discovery, apply_plan refuses a module that declares no units and says how to find them; after
    ``zoo.depth_units(net, input_size=...)`` the pruned network pickles (torch.save, loaded back equal) and scripts
    with TorchScript (equal outputs), as the network it was made from did."""
    net = nested_net()
    with pytest.raises(PlanError, match=r"zoo.depth_units\(model, input_size="):
        zoo.apply_plan(net, {"remove": ["blocks.0"]})
    zoo.depth_units(net, input_size=(3, SIDE, SIDE))
    pruned = zoo.apply_plan(net, {"remove": ["blocks.0", "blocks.1.branch.branch"]}, inplace=False).eval()
    x = torch.randn(2, 3, SIDE, SIDE)
    buffer = io.BytesIO()
    torch.save(pruned, buffer)
    buffer.seek(0)
    again = torch.load(buffer, weights_only=False).eval()
    scripted = torch.jit.script(pruned)
    with torch.no_grad():
        expected = pruned(x)
        torch.testing.assert_close(again(x), expected, rtol=0, atol=0)
        torch.testing.assert_close(scripted(x), expected, rtol=0, atol=0)
    assert pickle.loads(pickle.dumps(net.zoo_discovery)).removable() == net.zoo_discovery.removable()


def test_building_a_timm_model_draws_from_the_global_generator_as_timm_does():
    """Discovery draws from its own generator: after zoo.create_model the global RNG is where timm leaves it."""
    torch.manual_seed(3)
    zoo.create_model("timm/resnet18", num_classes=10)
    ours = torch.rand(4)
    torch.manual_seed(3)
    timm.create_model("resnet18", num_classes=10)
    torch.testing.assert_close(ours, torch.rand(4), rtol=0, atol=0)


class CountedNet(Net):
    """A Net that counts its forwards (the count is the class's: discovery's copies count too)."""

    calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        type(self).calls += 1
        return super().forward(x)


def test_units_are_proven_many_per_forward_and_as_one_by_one(monkeypatch):
    """Twenty-five blocks and their sub-layers are proven in a few batched forwards (not one or two per unit), and
    the batch decides what proving each unit alone decides."""
    from zoo.models import discovery

    torch.manual_seed(0)
    net = CountedNet(["residual", "leaky"] * 12 + ["sigmoid"]).eval()
    CountedNet.calls = 0
    batched = discovery.discover(net, (3, SIDE, SIDE))
    assert 20 <= len([u for u in batched.units if u.error is not None]) and CountedNet.calls < 20, CountedNet.calls
    monkeypatch.setattr(discovery, "BATCHES", ())  # a batch of one: every unit alone
    alone = discovery.discover(net, (3, SIDE, SIDE))
    assert [(u.name, u.removable) for u in alone.units] == [(u.name, u.removable) for u in batched.units]
    assert {u.name for u in alone.units if not u.removable} == {f"blocks.{i}.branch" for i in range(1, 24, 2)} | {
        "blocks.24"}


class ClassesFirst(Net):
    """Logits returned classes first (not batch first): the batch cannot be split, so units are proven one by one."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x).T


def test_a_model_whose_output_is_not_batch_first_is_proven_one_by_one():
    torch.manual_seed(0)
    net = ClassesFirst(["residual", "sigmoid", "residual"]).eval()
    found = zoo.depth_units(net, input_size=(3, SIDE, SIDE))
    assert sorted(u.name for u in found if u.removable) == ["blocks.0", "blocks.2"]
