"""MobileNetV2 (Sandler et al., 2018), state-dict compatible with timm's ``mobilenetv2_*`` models.

Depth units: every inverted-residual block with an identity shortcut (``block``), and the two
activations inside each block, which sit between BatchNorm-folded convolutions (``act``): removing both
collapses the block into one dense conv, as in DepthShrinker and Kim et al.
"""

# No postponed annotations here: torch.fx copies forward's annotations into the code it generates, which
# TorchScript must resolve (as for timm's models); a string annotation there does not.
from functools import partial

import torch
from torch import nn

from ..lazy import timm_layers as tl
from .depth import BlockSpec, Chain, ConvOp, DepthMixin
from .features import FeatureMixin, checkpoint_blocks
from .registry import register_family, register_model

# (expansion, out_channels, repeats, stride) per stage after the depthwise-separable first block.
MBV2_STAGES = ((6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))


def _norm_act(channels: int, apply_act: bool = True) -> "tl.BatchNormAct2d":  # (quoted: `import zoo` stays light)
    return tl.BatchNormAct2d(channels, act_layer=nn.ReLU6, apply_act=apply_act)


class DepthwiseSeparable(nn.Module):
    """First block: 3x3 depthwise conv, BN+ReLU6, 1x1 linear projection, BN."""

    def __init__(self, in_chs: int, out_chs: int, stride: int = 1):
        super().__init__()
        self.has_skip = stride == 1 and in_chs == out_chs
        self.conv_dw = tl.create_conv2d(in_chs, in_chs, 3, stride=stride, depthwise=True)
        self.bn1 = _norm_act(in_chs)
        self.conv_pw = tl.create_conv2d(in_chs, out_chs, 1)
        self.bn2 = _norm_act(out_chs, apply_act=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn2(self.conv_pw(self.bn1(self.conv_dw(x))))
        return out + x if self.has_skip else out

    def depth_spec(self) -> BlockSpec:
        ops = [ConvOp(self.conv_dw, self.bn1, self.bn1.act), ConvOp(self.conv_pw, self.bn2)]
        return BlockSpec("block", self.has_skip, Chain(ops, nn.Identity() if self.has_skip else None))


class InvertedResidual(nn.Module):
    """1x1 expansion, 3x3 depthwise, 1x1 linear projection; identity shortcut when shapes allow."""

    def __init__(self, in_chs: int, out_chs: int, stride: int, exp_ratio: float):
        super().__init__()
        mid_chs = tl.make_divisible(in_chs * exp_ratio)
        self.has_skip = stride == 1 and in_chs == out_chs
        self.conv_pw = tl.create_conv2d(in_chs, mid_chs, 1)
        self.bn1 = _norm_act(mid_chs)
        self.conv_dw = tl.create_conv2d(mid_chs, mid_chs, 3, stride=stride, depthwise=True)
        self.bn2 = _norm_act(mid_chs)
        self.conv_pwl = tl.create_conv2d(mid_chs, out_chs, 1)
        self.bn3 = _norm_act(out_chs, apply_act=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn1(self.conv_pw(x))
        out = self.bn2(self.conv_dw(out))
        out = self.bn3(self.conv_pwl(out))
        return out + x if self.has_skip else out

    def depth_spec(self) -> BlockSpec:
        ops = [ConvOp(self.conv_pw, self.bn1, self.bn1.act), ConvOp(self.conv_dw, self.bn2, self.bn2.act),
               ConvOp(self.conv_pwl, self.bn3)]
        return BlockSpec("block", self.has_skip, Chain(ops, nn.Identity() if self.has_skip else None))


class MobileNetV2(FeatureMixin, DepthMixin, nn.Module):
    """MobileNetV2 with a width multiplier; module names follow timm's EfficientNet builder."""

    feature_trunk = ("conv_stem", "bn1", "blocks")
    feature_norms = ("conv_head", "bn2")

    def __init__(self, width_mult: float = 1.0, num_classes: int = 1000, in_chans: int = 3,
                 drop_rate: float = 0.0, global_pool: str = "avg"):
        super().__init__()
        round_chs = partial(tl.make_divisible, divisor=8, round_limit=0.9)
        self.num_classes = num_classes
        self.in_chans = in_chans
        self.drop_rate = drop_rate
        self.grad_checkpointing = False  # an instance attribute, as TorchScript needs
        stem_chs = round_chs(32 * width_mult)
        self.conv_stem = tl.create_conv2d(in_chans, stem_chs, 3, stride=2)
        self.bn1 = _norm_act(stem_chs)
        chs = round_chs(16 * width_mult)
        stages: list[nn.Sequential] = [nn.Sequential(DepthwiseSeparable(stem_chs, chs))]
        ends = [(chs, 2)]  # each stage's output channels and reduction
        for exp, out, repeats, stride in MBV2_STAGES:
            out_chs = round_chs(out * width_mult)
            blocks = []
            for i in range(repeats):
                blocks.append(InvertedResidual(chs, out_chs, stride if i == 0 else 1, exp))
                chs = out_chs
            stages.append(nn.Sequential(*blocks))
            ends.append((out_chs, ends[-1][1] * stride))
        self.blocks = nn.Sequential(*stages)
        # timm's feature stages: the last stage at each reduction
        self.feature_info = [dict(module=f"blocks.{i}", num_chs=c, reduction=r) for i, (c, r) in enumerate(ends)
                             if i == len(ends) - 1 or ends[i + 1][1] != r]
        self.num_features = self.head_hidden_size = max(1280, round_chs(1280 * width_mult))
        self.conv_head = tl.create_conv2d(chs, self.num_features, 1)
        self.bn2 = _norm_act(self.num_features)
        self.global_pool = tl.SelectAdaptivePool2d(pool_type=global_pool, flatten=bool(global_pool))
        self.classifier = nn.Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()
        self._init_weights()

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.Linear):
                nn.init.uniform_(m.weight, -1.0 / m.in_features**0.5, 1.0 / m.in_features**0.5)
                nn.init.zeros_(m.bias)

    def get_classifier(self) -> nn.Module:
        return self.classifier

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        self.num_classes = num_classes
        if global_pool is not None:  # '' keeps the feature map (timm's: no pooling, no flattening)
            self.global_pool = tl.SelectAdaptivePool2d(pool_type=global_pool, flatten=bool(global_pool))
        classifier = nn.Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()
        self.classifier = self.like_the_model(classifier)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.bn1(self.conv_stem(x))
        if self.grad_checkpointing and not torch.jit.is_scripting():
            x = checkpoint_blocks(self.blocks, x, self.grad_checkpointing)
        else:
            x = self.blocks(x)
        return self.bn2(self.conv_head(x))

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.global_pool(x)
        if self.drop_rate > 0.0:
            x = nn.functional.dropout(x, p=self.drop_rate, training=self.training)
        return x if pre_logits else self.classifier(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def depth_blocks(self) -> list[tuple[str, int, int]]:
        return [(f"blocks.{s}.{i}", s, i) for s, stage in enumerate(self.blocks) for i in range(len(stage))]


def _cfg(**kwargs) -> dict:
    return {
        "num_classes": 1000, "input_size": (3, 224, 224), "pool_size": (7, 7), "crop_pct": 0.875,
        "interpolation": "bicubic", "mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225),
        "first_conv": "conv_stem", "classifier": "classifier", **kwargs,
    }


def _create(width_mult: float, **kwargs) -> MobileNetV2:
    return MobileNetV2(width_mult=width_mult, **kwargs)


@register_model("mobilenetv2", **_cfg())
def mobilenetv2_035(**kwargs) -> MobileNetV2:
    return _create(0.35, **kwargs)


@register_model("mobilenetv2", **_cfg())
def mobilenetv2_050(**kwargs) -> MobileNetV2:
    return _create(0.5, **kwargs)


@register_model("mobilenetv2", **_cfg())
def mobilenetv2_075(**kwargs) -> MobileNetV2:
    return _create(0.75, **kwargs)


@register_model("mobilenetv2", **_cfg())
def mobilenetv2_100(**kwargs) -> MobileNetV2:
    return _create(1.0, **kwargs)


@register_model("mobilenetv2", **_cfg())
def mobilenetv2_140(**kwargs) -> MobileNetV2:
    return _create(1.4, **kwargs)


register_family("mobilenetv2", reference="mobilenetv2_100", small="mobilenetv2_035", test_input_size=(3, 32, 32),
                capabilities=("timm", "features", "published_weights"))
