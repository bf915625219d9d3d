"""Adding a model family is one file: this one. It defines a plain BN-ReLU ResNet, registers it, and takes it through
create_model, depth units, the latency table, the DP search, merging surgery, save/load, train.py and prune.py
(docs/architecture.md, "Adding a model family", walks through the same steps).

The command lines see the family through ``DEPTHZOO_MODULES=tests.test_new_family``: no YAML, no other file.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import zoo
from zoo.depth import BlockSpec, Chain, ConvOp, DepthMixin
from zoo.registry import register_model

# ------------------------------------------------------------------------------------------------ the family


class BasicBlock(nn.Module):
    """conv-BN-ReLU, conv-BN, plus the shortcut, then ReLU. Modules are registered in call order (conv before its
    BatchNorm), which is what zoo.fuse relies on to fold them."""

    def __init__(self, in_chs: int, out_chs: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_chs, out_chs, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_chs)
        self.act1 = nn.ReLU()
        self.conv2 = nn.Conv2d(out_chs, out_chs, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_chs)
        project = stride != 1 or in_chs != out_chs
        self.shortcut = nn.Sequential(nn.Conv2d(in_chs, out_chs, 1, stride, bias=False), nn.BatchNorm2d(out_chs)) \
            if project else nn.Identity()
        self.act2 = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn2(self.conv2(self.act1(self.bn1(self.conv1(x)))))
        return self.act2(out + self.shortcut(x))

    def depth_spec(self) -> BlockSpec:
        """The one declaration: removable with an identity shortcut; act1 sits between two BN-folded convs."""
        ops = [ConvOp(self.conv1, self.bn1, self.act1), ConvOp(self.conv2, self.bn2)]
        return BlockSpec("block", isinstance(self.shortcut, nn.Identity), Chain(ops, self.shortcut, self.act2))


class PlainResNet(DepthMixin, nn.Module):
    def __init__(self, depths: tuple[int, ...] = (2, 2), width: int = 16, num_classes: int = 10, in_chans: int = 3):
        super().__init__()
        self.num_classes = num_classes
        self.stem = nn.Sequential(nn.Conv2d(in_chans, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        stages, chs = [], width
        for s, depth in enumerate(depths):
            out = width * 2**s
            stages.append(nn.Sequential(*[BasicBlock(chs if i == 0 else out, out, 2 if s and i == 0 else 1)
                                          for i in range(depth)]))
            chs = out
        self.stages = nn.Sequential(*stages)
        self.num_features = chs
        self.fc = nn.Linear(chs, num_classes)

    def depth_blocks(self) -> list[tuple[str, int, int]]:
        """Where the blocks are: the other half of the declaration."""
        return [(f"stages.{s}.{i}", s, i) for s, stage in enumerate(self.stages) for i in range(len(stage))]

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.stages(self.stem(x))

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = x.mean((2, 3))
        return x if pre_logits else self.fc(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


@register_model("plainresnet", input_size=(3, 32, 32), num_classes=10, mean=(0.5,) * 3, std=(0.5,) * 3,
                interpolation="bilinear", crop_pct=1.0, first_conv="stem.0", classifier="fc")
def plainresnet8(**kwargs) -> PlainResNet:
    return PlainResNet((2, 2), **kwargs)


# ----------------------------------------------------------------------------------------- the same way as ours
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
    from zoo.search import Choice, dp_search

    from .helpers import randomise_norm_stats

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
COMMON = ["model=plainresnet8", "data.image_size=16", "data.batch_size=32", "trainer.max_epochs=1",
          "trainer.limit_train_batches=4", "trainer.progress=false", "optim.warmup_epochs=0", "logger=none"]


@pytest.mark.slow
def test_train_py_and_prune_py_take_the_new_family(tmp_path, monkeypatch):
    from .helpers import FAST_LUT, run_entry

    monkeypatch.setenv("DEPTHZOO_MODULES", "tests.test_new_family")
    train = run_entry("train", *COMMON, base=tmp_path, run_dir=tmp_path / "train")
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
    assert json.loads((tmp_path / "train" / "results.json").read_text())["model"] == "plainresnet8"
    prune = run_entry("prune", *COMMON, "prune.batch_size=2", "prune.calib_batches=1", "finetune.epochs=1",
                      "prune.target_speedup=1.25", *FAST_LUT, base=tmp_path, run_dir=tmp_path / "prune")
    assert prune.returncode == 0, prune.stdout[-3000:] + prune.stderr[-3000:]
    results = json.loads((tmp_path / "prune" / "results.json").read_text())
    assert results["model"] == "plainresnet8" and results["plan"]["remove"]
    pruned = zoo.load(tmp_path / "prune" / "pruned.safetensors")
    assert pruned.zoo_plan["remove"] == results["plan"]["remove"]
