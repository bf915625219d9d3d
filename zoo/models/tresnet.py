"""TResNet (Ridnik et al., 2020), state-dict compatible with timm's ``tresnet_m/l/xl``.

SpaceToDepth stem, anti-aliased (blur-pool) downsampling, BasicBlocks in stages 1-2 and Bottlenecks in
3-4, SE in stages 1-3, BatchNorm + leaky ReLU, zero-initialised last BN of each block.

Depth units: blocks with an identity shortcut (``block``), and the activations between two convs
that fold their BatchNorm with nothing non-linear in between (``act``): conv1's in every block, and
conv2's in stage-4 bottlenecks (no SE there) when it does not downsample.
"""

# No postponed annotations here: torch.fx copies forward's annotations into the code it generates, which
# TorchScript must resolve (as for timm's models); a string annotation there does not.
from collections import OrderedDict
from functools import partial

import torch
from torch import nn

from ..lazy import timm_layers as tl
from .depth import BlockSpec, Chain, ConvOp, DepthMixin
from .features import FeatureMixin, checkpoint_blocks
from .registry import register_family, register_model

_leaky = partial(nn.LeakyReLU, negative_slope=1e-3)


def _op(layer: nn.Module, *after: nn.Module | None) -> ConvOp:
    """A timm ConvNormAct as a chain op: conv, BatchNorm, its act (if any), then blur-pool/SE, which stop a merge."""
    act = layer.bn.act if not isinstance(layer.bn.act, nn.Identity) else None
    extra = [m for m in (layer.aa, *after) if m is not None and not isinstance(m, nn.Identity)]
    return ConvOp(layer.conv, layer.bn, act, extra)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None,
                 use_se: bool = True):
        super().__init__()
        self.downsample = downsample
        self.conv1 = tl.ConvNormAct(inplanes, planes, 3, stride=stride, act_layer=_leaky, aa_layer=tl.BlurPool2d)
        self.conv2 = tl.ConvNormAct(planes, planes, 3, stride=1, apply_act=False)
        self.se = tl.SEModule(planes, rd_channels=max(planes // 4, 64)) if use_se else None
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.conv2(self.conv1(x))
        if self.se is not None:
            out = self.se(out)
        return self.act(out + shortcut)

    def depth_spec(self) -> BlockSpec:
        ops = [_op(self.conv1), _op(self.conv2, self.se)]
        shortcut = self.downsample if self.downsample is not None else nn.Identity()
        return BlockSpec("block", self.downsample is None, Chain(ops, shortcut, self.act))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None,
                 use_se: bool = True):
        super().__init__()
        self.downsample = downsample
        self.conv1 = tl.ConvNormAct(inplanes, planes, 1, act_layer=_leaky)
        self.conv2 = tl.ConvNormAct(planes, planes, 3, stride=stride, act_layer=_leaky, aa_layer=tl.BlurPool2d)
        self.se = tl.SEModule(planes, rd_channels=max(planes * self.expansion // 8, 64)) if use_se else None
        self.conv3 = tl.ConvNormAct(planes, planes * self.expansion, 1, apply_act=False)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.conv2(self.conv1(x))
        if self.se is not None:
            out = self.se(out)
        out = self.conv3(out)
        return self.act(out + shortcut)

    def depth_spec(self) -> BlockSpec:
        ops = [_op(self.conv1), _op(self.conv2, self.se), _op(self.conv3)]
        shortcut = self.downsample if self.downsample is not None else nn.Identity()
        return BlockSpec("block", self.downsample is None, Chain(ops, shortcut, self.act))


class TResNet(FeatureMixin, DepthMixin, nn.Module):
    feature_out_indices = (1, 2, 3, 4)  # as timm's features_only
    feature_trunk = ("body",)
    def __init__(self, layers: tuple[int, ...], width_factor: float = 1.0, num_classes: int = 1000,
                 in_chans: int = 3, drop_rate: float = 0.0, global_pool: str = "fast"):
        super().__init__()
        self.num_classes = num_classes
        self.in_chans = in_chans
        self.drop_rate = drop_rate
        self.grad_checkpointing = False  # an instance attribute, as TorchScript needs
        self.inplanes = planes = int(64 * width_factor)
        stem = tl.ConvNormAct(in_chans * 16, planes, 3, act_layer=nn.LeakyReLU)
        stage_defs = ((BasicBlock, planes, 1, True), (BasicBlock, planes * 2, 2, True),
                      (Bottleneck, planes * 4, 2, True), (Bottleneck, planes * 8, 2, False))
        stages = [self._make_stage(block, p, n, stride, se) for (block, p, stride, se), n in zip(stage_defs, layers)]
        self.body = nn.Sequential(OrderedDict([
            ("s2d", tl.SpaceToDepth()), ("conv1", stem),
            ("layer1", stages[0]), ("layer2", stages[1]), ("layer3", stages[2]), ("layer4", stages[3]),
        ]))
        self.num_features = self.head_hidden_size = planes * 8 * Bottleneck.expansion
        self.feature_info = [dict(module="body.conv1", num_chs=planes, reduction=4),  # after SpaceToDepth(4)
                             dict(module="body.layer1", num_chs=planes, reduction=4),
                             dict(module="body.layer2", num_chs=planes * 2, reduction=8),
                             dict(module="body.layer3", num_chs=planes * 4 * Bottleneck.expansion, reduction=16),
                             dict(module="body.layer4", num_chs=self.num_features, reduction=32)]
        self.head = tl.ClassifierHead(self.num_features, num_classes, pool_type=global_pool, drop_rate=drop_rate)
        self._init_weights()

    def _make_stage(self, block: type, planes: int, depth: int, stride: int, use_se: bool) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            pool = [nn.AvgPool2d(2, 2, ceil_mode=True, count_include_pad=False)] if stride == 2 else []
            project = tl.ConvNormAct(self.inplanes, planes * block.expansion, 1, apply_act=False)
            downsample = nn.Sequential(*pool, project)
        blocks = []
        for i in range(depth):
            blocks.append(block(self.inplanes, planes, stride if i == 0 else 1, downsample if i == 0 else None, use_se))
            self.inplanes = planes * block.expansion
        return nn.Sequential(*blocks)

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="leaky_relu")
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
        for m in self.modules():
            if isinstance(m, BasicBlock):
                nn.init.zeros_(m.conv2.bn.weight)
            elif isinstance(m, Bottleneck):
                nn.init.zeros_(m.conv3.bn.weight)

    def get_classifier(self) -> nn.Module:
        return self.head.fc

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        self.num_classes = num_classes
        self.head.reset(num_classes, pool_type=global_pool)
        self.like_the_model(self.head)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        if self.grad_checkpointing and not torch.jit.is_scripting():
            return checkpoint_blocks(self.body, x, self.grad_checkpointing)
        return self.body(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        return self.head(x, pre_logits=pre_logits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def depth_blocks(self) -> list[tuple[str, int, int]]:
        return [(f"body.layer{s + 1}.{i}", s, i) for s in range(4)
                for i in range(len(self.body.get_submodule(f"layer{s + 1}")))]


def _cfg(**kwargs) -> dict:
    return {
        "num_classes": 1000, "input_size": (3, 224, 224), "pool_size": (7, 7), "crop_pct": 0.875,
        "interpolation": "bilinear", "mean": (0.0, 0.0, 0.0), "std": (1.0, 1.0, 1.0),
        "first_conv": "body.conv1.conv", "classifier": "head.fc", **kwargs,
    }


@register_model("tresnet", **_cfg())
def tresnet_m(**kwargs) -> TResNet:
    return TResNet(layers=(3, 4, 11, 3), **kwargs)


@register_model("tresnet", **_cfg())
def tresnet_l(**kwargs) -> TResNet:
    return TResNet(layers=(4, 5, 18, 3), width_factor=1.2, **kwargs)


@register_model("tresnet", **_cfg())
def tresnet_xl(**kwargs) -> TResNet:
    return TResNet(layers=(4, 5, 24, 3), width_factor=1.3, **kwargs)


register_family("tresnet", reference="tresnet_m", small="tresnet_m", small_options={"width_factor": 0.125},
                test_input_size=(3, 32, 32),
                capabilities=("timm", "features", "grad_checkpointing", "published_weights"))
