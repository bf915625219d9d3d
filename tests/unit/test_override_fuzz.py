"""``prune.py`` and ``train.py`` overrides, fuzzed: hypothesis draws a few ``key=value`` overrides from the config
schemas' own keys and from values users get wrong (NaN, infinities, zero and negative numbers, empty strings, unknown
names, lists where numbers go, choices of another key), composes them with Hydra as the entry points do, and runs the
checks each job makes before any work (``zoo.jobs.prune_request.read_request``, ``zoo.jobs.train.check_request``). Every
case is accepted, and then every number in it is finite, or refused in one line (a ``ZooError``, or a composition
error the entry point explains in one line); nothing else may escape. The bench tier runs more examples
(``bench/test_command_line_fuzz.py``)."""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from zoo.errors import ZooError
from zoo.jobs.cli import config_keys, explain_composition_error, register_resolvers
from zoo.jobs.prune_config import FinetuneSettings, PruneConfig, PruneSettings
from zoo.jobs.train_config import TrainConfig
from zoo.training.settings import DataConfig, OptimConfig, TrainerConfig

ROOT = Path(__file__).resolve().parents[2]
SKIP = {"cache_dir", "plan", "table", "measure", "resume", "root", "files", "log_dir"}  # paths: their own tests


def keys(prefix: str, schema: type) -> list[str]:
    return [f"{prefix}.{f.name}" for f in dataclasses.fields(schema) if f.name not in SKIP]


TRAIN_KEYS = [*keys("data", DataConfig), *keys("optim", OptimConfig), *keys("trainer", TrainerConfig)]
PRUNE_KEYS = [*keys("prune", PruneSettings), *keys("finetune", FinetuneSettings)]
VALUES = ["nan", "inf", "-inf", "-1", "0", "1", "2", "3", "1.5", "0.5", "1e309", "abc", "''", "null", "true", "false",
          "[]", "[metric]", "[latency_ms,metric]", "[nope]", "cpu", "cuda", "cuda:7", "auto", "onnx", "torch_export",
          "int8", "int4", "dp", "greedy", "loss", "tempered", "decode", "forward", "float16", "bfloat16", "float64",
          "compile", "tensorrt", "onnxruntime", "adamw", "sgd", "cosine", "32", "100000"]
GROUPS = {"model": ["mobilenetv2_035", "retnet_tiny"], "data": ["digits", "bytes"]}
PAIRS = [["model=mobilenetv2_035", "data=digits"], ["model=retnet_tiny", "data=bytes"]]  # a model and its data


@pytest.fixture(scope="module")
def hydra_context(tmp_path_factory):
    """Hydra initialised on conf/ with the schemas and resolvers the entry points register; outputs under a
    temporary folder."""
    from zoo.jobs import prune_config, train_config

    base = tmp_path_factory.mktemp("fuzz")
    os.environ["DEPTHZOO_ROOT"] = str(base)
    train_config.register_configs(ROOT / "conf")
    prune_config.register_configs(ROOT / "conf")
    register_resolvers()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        yield base
    GlobalHydra.instance().clear()


def check(script: str, overrides: list[str], base: Path) -> None:
    """Compose `overrides` as `script` does and run its checks: accepted, or refused in one line."""
    from zoo.jobs import train as train_job
    from zoo.jobs.prune_request import read_request

    schema = PruneConfig if script == "prune" else TrainConfig
    fixed = ["logger=none", f"hydra.run.dir={base / 'run'}", f"paths.log_dir={base / 'outputs'}"]
    try:
        cfg = compose(config_name=script, overrides=[*fixed, *overrides], return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)  # (${hydra:...} resolves from here; the job's config has no hydra key)
        with open_dict(cfg):
            del cfg["hydra"]
        (read_request if script == "prune" else train_job.check_request)(cfg)
    except ZooError as refused:
        message = str(refused)
        assert message.strip() and "\n" not in message.strip(), (overrides, message)
    except (HydraException, OmegaConfBaseException) as refused:
        message = explain_composition_error(refused, config_keys(schema))
        assert message.strip() and "\n" not in message.strip(), (overrides, message)
    else:  # accepted: as the job sees it, and every number in it finite
        assert "hydra" not in cfg
        numbers = [v for v in leaves(OmegaConf.to_container(cfg, resolve=False)) if isinstance(v, float)]
        assert all(math.isfinite(v) for v in numbers), (overrides, numbers)


def leaves(node: object) -> list[object]:
    if isinstance(node, dict):
        return [leaf for value in node.values() for leaf in leaves(value)]
    if isinstance(node, list):
        return [leaf for value in node for leaf in leaves(value)]
    return [node]


def overrides_for(script: str) -> st.SearchStrategy[list[str]]:
    pool = TRAIN_KEYS + (PRUNE_KEYS if script == "prune" else [])
    pair = st.tuples(st.sampled_from(pool), st.sampled_from(VALUES)).map(lambda kv: f"{kv[0]}={kv[1]}")
    group = st.sampled_from([f"{g}={o}" for g, options in GROUPS.items() for o in options])
    keys = st.lists(st.one_of(pair, pair, pair, group), min_size=1, max_size=4)
    return st.tuples(st.sampled_from(PAIRS), keys).map(lambda drawn: [*drawn[0], *drawn[1]])


def fuzz_overrides(script: str, base: Path, examples: int) -> None:
    """`examples` drawn override lists through :func:`check` (the bench tier runs more)."""

    @settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                             HealthCheck.too_slow])
    @given(overrides=overrides_for(script))
    def fuzz(overrides):
        check(script, overrides, base)

    fuzz()


@pytest.mark.parametrize("script", ["prune", "train"])
def test_fuzzed_overrides_are_accepted_or_refused_in_one_line(script, hydra_context):
    fuzz_overrides(script, hydra_context, examples=15)
