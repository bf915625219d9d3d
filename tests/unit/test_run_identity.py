"""Run identity guards the class, not the case: for every key of a resolved train or prune config outside the declared
non-determining list, changing its value changes the run's fingerprint (else a sweep over that key would silently
reuse one job's results for all of them), and the keys that decide a prune job's baseline change the baseline's
cache folder. The non-determining list itself is the reviewed one: a key added there must be added here too."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from zoo.jobs import runs
from zoo.jobs.baseline import baseline_config

CONF = Path(__file__).resolve().parents[2] / "conf"

# Reviewed: where a run writes, how it logs, how it may reuse a directory, and settings that cannot change a result.
# Adding a key to runs.NON_DETERMINING means a sweep over it shares one result: say why here when you do.
REVIEWED_NON_DETERMINING = {
    "paths", "logger", "hydra", "task_name", "tags", "trainer.resume", "trainer.force", "prune.force",
    "prune.cache_dir",  # outputs, logging, reuse switches and where caches live (caches are keyed by content)
    "trainer.progress", "trainer.log_every", "trainer.save_checkpoints",  # what is printed and kept, not computed
    "data.num_workers",  # loader processes: the batches are the same (seeded per sample)
    "data.download",  # whether a missing data set may be fetched: the data, once there, is the same
    "prune.objectives",  # what the job returns to a sweeper, read from the same results
}

# One composition per option of each config group, so that the keys every option brings are enumerated.
GROUP_VARIANTS = [
    [], ["data=bytes", "model=retnet_tiny"], ["data=text", "model=retnet_tiny", "data.files=[a.txt]"],
    ["data=synthetic"], ["data=cifar10"], ["data=imagefolder", "data.root=/data"], ["optim=sgd"], ["optim=lamb"],
    ["trainer=ddp"], ["trainer=gpu"], ["trainer=debug"], ["model=tresnet_m"], ["model=resnetv2_50x1_bit"],
]


def compose(config_name: str, overrides: list[str]) -> dict[str, Any]:
    """The resolved config of ``conf/<config_name>.yaml`` as a plain dict, composed by Hydra with the real schemas."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    from zoo.jobs.cli import register_resolvers
    from zoo.jobs.prune_config import register_configs

    register_configs(CONF)
    register_resolvers()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = hydra_compose(config_name=config_name, overrides=[*overrides, "paths.output_dir=/tmp/out"])
    return OmegaConf.to_container(cfg, resolve=True)


def changed(value: Any) -> Any:
    """Another value of the same kind."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 1.5 + 0.25
    if isinstance(value, str):
        return value + "_other"
    if isinstance(value, list):
        return [*value, "other"]
    return "other"  # None


def with_value(config: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(config)
    node = out
    *parents, leaf = dotted.split(".")
    for key in parents:
        node = node[key]
    node[leaf] = value
    return out


def declared_non_determining(key: str) -> bool:
    return any(key == k or key.startswith(k + ".") for k in runs.NON_DETERMINING)


def test_the_non_determining_list_is_the_reviewed_one():
    assert set(runs.NON_DETERMINING) == REVIEWED_NON_DETERMINING, (
        "runs.NON_DETERMINING changed: a key in it is left out of every run's fingerprint, so a sweep over it "
        "reuses one job's results for all; review the key and add it to REVIEWED_NON_DETERMINING with the reason")


@pytest.mark.parametrize("config_name", ["prune", "train"])
@pytest.mark.parametrize("overrides", GROUP_VARIANTS, ids=lambda o: "-".join(o) or "defaults")
def test_every_determining_key_changes_the_fingerprint(config_name, overrides):
    config = compose(config_name, overrides)
    keys = [k for k in runs.flatten(config) if not declared_non_determining(k)]
    assert len(keys) > 40  # the whole resolved config, not a part of it
    ours = runs.fingerprint(config)
    same = [k for k in keys if runs.fingerprint(with_value(config, k, changed(runs.flatten(config)[k]))) == ours]
    assert not same, f"changing these keys leaves the {config_name} run's fingerprint as it was: {same}"
    for key in runs.flatten(config):  # and the declared ones leave it
        if declared_non_determining(key) and not key.startswith("hydra"):
            assert runs.fingerprint(with_value(config, key, changed(runs.flatten(config)[key]))) == ours, key


@pytest.mark.parametrize("overrides", GROUP_VARIANTS, ids=lambda o: "-".join(o) or "defaults")
def test_every_key_of_the_baseline_changes_its_cache_folder_and_only_those(overrides):
    """A prune job's baseline is trained once per (model, data, optim, trainer): each determining key there gives
    another baseline; the prune.* and finetune.* keys share it (that is what a prune sweep reuses)."""
    config = compose("prune", overrides)
    ours = runs.fingerprint(baseline_config(config))
    flat = runs.flatten(config)
    for key in flat:
        if declared_non_determining(key):
            continue
        other = runs.fingerprint(baseline_config(with_value(config, key, changed(flat[key]))))
        decides_the_baseline = key.split(".")[0] in ("model", "data", "optim", "trainer")
        assert (other != ours) == decides_the_baseline, key
