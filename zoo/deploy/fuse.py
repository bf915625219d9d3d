"""Deploy form: fold BatchNorm into the convolution before it, and pre-standardise weight-standardised convs.

The rule is structural and the same for every family: inside any module, a BatchNorm child registered
directly after a Conv2d child is applied to that conv's output (the zoo's families are written that
way; the tests check the fused outputs against the originals). A ``BatchNormAct2d`` keeps its activation.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from ..lazy import timm_layers as tl


@torch.no_grad()
def fold_bn_into_conv(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> None:
    """Rescale `conv` in place so that ``conv'(x) == bn(conv(x))`` in eval mode."""
    scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    bias = conv.bias if conv.bias is not None else torch.zeros_like(bn.running_mean)
    conv.weight.mul_(scale.reshape(-1, 1, 1, 1))
    conv.bias = nn.Parameter(bn.bias + (bias - bn.running_mean) * scale)


def _post_bn(bn: nn.Module) -> nn.Module:
    """What remains of a (BatchNorm + act) module once the normalisation is folded away."""
    act = getattr(bn, "act", None)
    return act if isinstance(act, nn.Module) else nn.Identity()


@torch.no_grad()
def standardised_conv(conv: nn.Conv2d) -> nn.Conv2d:
    """A plain Conv2d holding the standardised weight a timm StdConv2d would compute on every call."""
    weight = F.batch_norm(
        conv.weight.reshape(1, conv.out_channels, -1), None, None, training=True, momentum=0.0, eps=conv.eps
    ).reshape_as(conv.weight)
    plain = nn.Conv2d(
        conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding, conv.dilation,
        conv.groups, bias=conv.bias is not None, device=weight.device, dtype=weight.dtype,
    )
    plain.weight.copy_(weight)
    if conv.bias is not None:
        plain.bias.copy_(conv.bias)
    return plain


def fuse(model: nn.Module, inplace: bool = False) -> nn.Module:
    """Return the eval-mode deploy form of `model`: same outputs (within float error), fewer modules."""
    if not inplace:
        model = copy.deepcopy(model)
    model.eval()
    for parent in list(model.modules()):
        children = list(parent.named_children())
        for (conv_name, conv), (bn_name, bn) in zip(children, children[1:]):
            if isinstance(conv, nn.Conv2d) and isinstance(bn, nn.BatchNorm2d) and bn.track_running_stats:
                if isinstance(conv, tl.StdConv2d):
                    conv = standardised_conv(conv)
                    setattr(parent, conv_name, conv)
                fold_bn_into_conv(conv, bn)
                setattr(parent, bn_name, _post_bn(bn))
    for name, module in list(model.named_modules()):
        if isinstance(module, tl.StdConv2d):
            model.set_submodule(name, standardised_conv(module))
    model.zoo_fused = True
    return model
