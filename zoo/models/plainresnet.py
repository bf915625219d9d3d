"""Plain ResNet: BasicBlocks of conv-BN-ReLU, conv-BN, shortcut, ReLU (He et al., 2016) with a 3x3 stem and no max
pool. The smallest complete family, and the one ``docs/architecture.md`` ("Adding a model family") walks through:
each block declares its depth structure (:meth:`BasicBlock.depth_spec`) and the model says where its blocks are
(:meth:`PlainResNet.depth_blocks`); units, tables, search, surgery and the command lines follow from those two.

``plainresnet8`` (two stages of two blocks, width 16) is a CIFAR-size network for tests and the digits task;
``plainresnet18`` (four stages of two blocks, width 64, stem stride 4) is its ImageNet-size reference. Neither is
timm's ``resnet18`` (which has a 7x7 stem and a max pool): these are depthzoo's own.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .depth import BlockSpec, Chain, ConvOp, DepthMixin
from .registry import register_family, register_model


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
    """Stages of BasicBlocks (the first block of each later stage halves the resolution and doubles the width)."""

    def __init__(self, depths: tuple[int, ...] = (2, 2), width: int = 16, num_classes: int = 10, in_chans: int = 3,
                 stem_stride: int = 1):
        super().__init__()
        self.num_classes = num_classes
        self.stem = nn.Sequential(nn.Conv2d(in_chans, width, 3, stem_stride, 1, bias=False), nn.BatchNorm2d(width),
                                  nn.ReLU())
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


def _cfg(**kwargs: Any) -> dict[str, Any]:
    return {"mean": (0.5,) * 3, "std": (0.5,) * 3, "interpolation": "bilinear", "crop_pct": 1.0,
            "first_conv": "stem.0", "classifier": "fc", **kwargs}


@register_model("plainresnet", **_cfg(input_size=(3, 32, 32), num_classes=10))
def plainresnet8(**kwargs: Any) -> PlainResNet:
    return PlainResNet(**{"depths": (2, 2), "width": 16, **kwargs})


@register_model("plainresnet", **_cfg(input_size=(3, 224, 224), num_classes=1000))
def plainresnet18(**kwargs: Any) -> PlainResNet:
    return PlainResNet(**{"depths": (2, 2, 2, 2), "width": 64, "num_classes": 1000, "stem_stride": 4, **kwargs})


register_family("plainresnet", reference="plainresnet18", small="plainresnet8", test_input_size=(3, 32, 32))
