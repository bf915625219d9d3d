"""Modules imported on first use: ``import zoo`` does not pay for timm (several seconds: timm imports all of its
models, torchvision and W&B when installed) until a model is built."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class LazyModule:
    """Stands for a module and imports it when an attribute is first read: ``layers.BatchNormAct2d``."""

    def __init__(self, name: str):
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attr: str) -> Any:
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attr)


timm_layers = LazyModule("timm.layers")
