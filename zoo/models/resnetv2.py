"""BiT: ResNetV2 (pre-activation) with GroupNorm(32) and weight-standardised convs (Kolesnikov et al.),
state-dict compatible with timm's ``resnetv2_*_bit`` models.

Depth units: pre-activation bottleneck blocks with an identity shortcut (``block``). No activation is
a unit here: GroupNorm normalises each sample with statistics of that sample, so it cannot be folded
into the convolution before it, and convs on either side of it never merge into one.
"""

# No postponed annotations here: torch.fx copies forward's annotations into the code it generates, which
# TorchScript must resolve (as for timm's models); a string annotation there does not.
from collections import OrderedDict

import torch
from torch import nn

from ..lazy import timm_layers as tl
from .depth import BlockSpec, DepthMixin
from .features import FeatureMixin, checkpoint_blocks
from .registry import register_family, register_model


def _conv(*args, **kwargs) -> nn.Module:
    """A weight-standardised conv (timm's StdConv2d, eps 1e-8 as BiT)."""
    return tl.StdConv2d(*args, eps=1e-8, **kwargs)


def _norm(channels: int) -> nn.Module:
    """GroupNorm(32) + ReLU."""
    return tl.GroupNormAct(channels, num_groups=32)


class DownsampleConv(nn.Module):
    """Projection shortcut: a strided 1x1 weight-standardised conv on the pre-activated input."""

    def __init__(self, in_chs: int, out_chs: int, stride: int):
        super().__init__()
        self.conv = _conv(in_chs, out_chs, 1, stride=stride)
        self.norm = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv(x))


class PreActBottleneck(nn.Module):
    """GN+ReLU -> 1x1 -> GN+ReLU -> 3x3 (stride) -> GN+ReLU -> 1x1, plus the shortcut."""

    def __init__(self, in_chs: int, out_chs: int, stride: int = 1, project: bool = False):
        super().__init__()
        mid_chs = tl.make_divisible(out_chs * 0.25)
        self.downsample = DownsampleConv(in_chs, out_chs, stride) if project else None
        self.norm1 = _norm(in_chs)
        self.conv1 = _conv(in_chs, mid_chs, 1)
        self.norm2 = _norm(mid_chs)
        self.conv2 = _conv(mid_chs, mid_chs, 3, stride=stride)
        self.norm3 = _norm(mid_chs)
        self.conv3 = _conv(mid_chs, out_chs, 1)

    def depth_spec(self) -> BlockSpec:
        """A residual block with no mergeable activation: GroupNorm normalises by each sample's statistics."""
        return BlockSpec("block", self.downsample is None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_preact = self.norm1(x)
        shortcut = x if self.downsample is None else self.downsample(x_preact)
        out = self.conv1(x_preact)
        out = self.conv2(self.norm2(out))
        out = self.conv3(self.norm3(out))
        return out + shortcut


class ResNetStage(nn.Module):
    def __init__(self, in_chs: int, out_chs: int, stride: int, depth: int):
        super().__init__()
        self.blocks = nn.Sequential(*[
            PreActBottleneck(in_chs if i == 0 else out_chs, out_chs, stride if i == 0 else 1, project=i == 0)
            for i in range(depth)
        ])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


class ResNetV2(FeatureMixin, DepthMixin, nn.Module):
    feature_trunk = ("stem", "stages")
    feature_norms = ("norm",)

    def __init__(self, layers: tuple[int, ...], width_factor: int = 1, num_classes: int = 1000,
                 in_chans: int = 3, drop_rate: float = 0.0, global_pool: str = "avg"):
        super().__init__()
        self.num_classes = num_classes
        self.in_chans = in_chans
        self.drop_rate = drop_rate
        self.grad_checkpointing = False  # an instance attribute, as TorchScript needs
        stem_chs = tl.make_divisible(64 * width_factor)
        self.stem = nn.Sequential(OrderedDict([
            ("conv", _conv(in_chans, stem_chs, 7, stride=2)),
            ("pad", nn.ConstantPad2d(1, 0.0)),  # BiT's fixed SAME padding approximation
            ("pool", nn.MaxPool2d(3, stride=2, padding=0)),
        ]))
        prev_chs = stem_chs
        self.feature_info = [dict(module="stem.conv", num_chs=stem_chs, reduction=2)]
        self.stages = nn.Sequential()
        for idx, (depth, chs) in enumerate(zip(layers, (256, 512, 1024, 2048))):
            out_chs = tl.make_divisible(chs * width_factor)
            self.stages.add_module(str(idx), ResNetStage(prev_chs, out_chs, 1 if idx == 0 else 2, depth))
            self.feature_info.append(dict(module=f"stages.{idx}", num_chs=out_chs, reduction=4 * 2**idx))
            prev_chs = out_chs
        self.num_features = self.head_hidden_size = prev_chs
        self.norm = _norm(prev_chs)
        self.head = tl.ClassifierHead(prev_chs, num_classes, pool_type=global_pool, drop_rate=drop_rate, use_conv=True)
        self._init_weights()

    def _init_weights(self) -> None:
        for name, m in self.named_modules():
            if isinstance(m, nn.Linear) or (name == "head.fc" and isinstance(m, nn.Conv2d)):
                nn.init.normal_(m.weight, 0.0, 0.01)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def get_classifier(self) -> nn.Module:
        return self.head.fc

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        self.num_classes = num_classes
        self.head.reset(num_classes, pool_type=global_pool)
        self.like_the_model(self.head)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        if self.grad_checkpointing and not torch.jit.is_scripting():
            x = checkpoint_blocks(self.stages, x, self.grad_checkpointing)  # per stage, as timm
        else:
            x = self.stages(x)
        return self.norm(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        return self.head(x, pre_logits=pre_logits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def depth_blocks(self) -> list[tuple[str, int, int]]:
        return [(f"stages.{s}.blocks.{i}", s, i) for s, stage in enumerate(self.stages)
                for i in range(len(stage.blocks))]


def _cfg(**kwargs) -> dict:
    return {
        "num_classes": 1000, "input_size": (3, 224, 224), "pool_size": (7, 7), "crop_pct": 0.875,
        "interpolation": "bilinear", "mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5),
        "first_conv": "stem.conv", "classifier": "head.fc", **kwargs,
    }


def _bit_m() -> dict:
    """BiT-M's architecture defaults (its published weights are fine-tuned at 448 px)."""
    return _cfg(input_size=(3, 448, 448), pool_size=(14, 14), crop_pct=1.0, interpolation="bilinear")


@register_model("bit", **_cfg(interpolation="bicubic"))
def resnetv2_50x1_bit(**kwargs) -> ResNetV2:
    return ResNetV2(**{"layers": (3, 4, 6, 3), "width_factor": 1, **kwargs})


@register_model("bit", **_bit_m())
def resnetv2_50x3_bit(**kwargs) -> ResNetV2:
    return ResNetV2(**{"layers": (3, 4, 6, 3), "width_factor": 3, **kwargs})


@register_model("bit", **_bit_m())
def resnetv2_101x1_bit(**kwargs) -> ResNetV2:
    return ResNetV2(**{"layers": (3, 4, 23, 3), "width_factor": 1, **kwargs})


@register_model("bit", **_bit_m())
def resnetv2_101x3_bit(**kwargs) -> ResNetV2:
    return ResNetV2(**{"layers": (3, 4, 23, 3), "width_factor": 3, **kwargs})


@register_model("bit", **_bit_m())
def resnetv2_152x2_bit(**kwargs) -> ResNetV2:
    return ResNetV2(**{"layers": (3, 8, 36, 3), "width_factor": 2, **kwargs})


@register_model("bit", **_bit_m())
def resnetv2_152x4_bit(**kwargs) -> ResNetV2:
    return ResNetV2(**{"layers": (3, 8, 36, 3), "width_factor": 4, **kwargs})


register_family("bit", reference="resnetv2_50x1_bit", small="resnetv2_50x1_bit", small_options={"width_factor": 0.5},
                test_input_size=(3, 32, 32),
                capabilities=("timm", "features", "grad_checkpointing", "published_weights"))
