"""A model family from outside the tree, in one file: the command lines see it through
``DEPTHZOO_MODULES=tests.plugin_family`` (or a ``depthzoo.models`` entry point of an installed package), with no YAML
and no other file. It reuses the plain ResNet's blocks; a real plugin would declare its own the same way."""

from __future__ import annotations

from typing import Any

from zoo.models.plainresnet import PlainResNet
from zoo.models.registry import register_family, register_model


@register_model("plugin_resnet", input_size=(3, 32, 32), num_classes=10, mean=(0.5,) * 3, std=(0.5,) * 3,
                interpolation="bilinear", crop_pct=1.0, first_conv="stem.0", classifier="fc")
def plugin_resnet6(**kwargs: Any) -> PlainResNet:
    return PlainResNet(**{"depths": (1, 2), "width": 8, **kwargs})


register_family("plugin_resnet", reference="plugin_resnet6", small="plugin_resnet6", test_input_size=(3, 32, 32))
