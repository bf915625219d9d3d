"""A pytest plugin for timm's own test suite, run from timm's source distribution (``-p depthzoo_timm_route``,
this folder on PYTHONPATH).

``DEPTHZOO_TIMM_ARCHS=a,b``: only the tests of those architectures are collected (every parametrized
``model_name`` that is one of them, tagged or not). ``DEPTHZOO_ROUTE=1``: the test modules' ``create_model``
(timm's, imported by name) builds through the zoo, with no fallback to timm (the zoo itself still calls timm's):
``zoo.create_model(name)`` for the zoo's declared families (``mobilenetv2_100``, ...), ``zoo.create_model("timm/"
+ name)`` for the rest. Without it the same tests run on timm's own models: the control.
``DEPTHZOO_ROUTE_LOG=<file>``: one JSON line per test with the number of models the zoo built for it (a routed test
that built none did not test the zoo).
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
import timm

ROUTE = os.environ.get("DEPTHZOO_ROUTE") == "1"
ARCHS = {a for a in os.environ.get("DEPTHZOO_TIMM_ARCHS", "").split(",") if a}


BUILT = [0]  # models the zoo built in the running test


def routed(model_name: str, pretrained: bool = False, **kwargs: Any) -> Any:
    """timm.create_model's call, built by the zoo."""
    import zoo

    BUILT[0] += 1
    from zoo.models.registry import list_models

    arch = model_name.partition(".")[0]
    options = {k: v for k, v in kwargs.items() if v is not None}
    name = model_name if arch in list_models() else f"timm/{model_name}"
    return zoo.create_model(name, pretrained=pretrained, **options)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if ROUTE:
        for module in {item.module for item in items if getattr(item, "module", None) is not None}:
            for name, value in list(vars(module).items()):
                if value is timm.create_model:
                    setattr(module, name, routed)
    if not ARCHS:
        return
    kept, dropped = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        (kept if str(params.get("model_name", "")).partition(".")[0] in ARCHS else dropped).append(item)
    items[:] = kept
    config.hook.pytest_deselected(items=dropped)


def pytest_runtest_setup(item: pytest.Item) -> None:
    BUILT[0] = 0


def pytest_runtest_teardown(item: pytest.Item) -> None:
    log = os.environ.get("DEPTHZOO_ROUTE_LOG")
    if log:
        with open(log, "a") as handle:
            handle.write(json.dumps({"test": item.nodeid, "zoo_builds": BUILT[0]}) + "\n")
