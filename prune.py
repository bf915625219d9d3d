"""Depth-prune any depthzoo model on the device you run on: ``python prune.py [group=option ...] [key=value ...]``.

Thin entry point: composes ``conf/prune.yaml`` and hands it to :func:`zoo.jobs.prune.run` through
:func:`zoo.jobs.cli.run_job`. Returns ``prune.objectives`` (default: the pruned model's validation metric; several
for a multi-objective sweeper such as Optuna's) so Hydra sweepers can optimise them. A user
error ends a single run with one clear message and exit status 2; a multirun runs every job, records each failure
(``failed.json``) and exits with status 1 after the last job if any failed (docs/failures.md).
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

from zoo.jobs.cli import guard, register_resolvers, run_job
from zoo.jobs.prune_config import PruneConfig, objective_values, register_configs

CONFIG_DIR = Path(__file__).resolve().parent / "conf"


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="prune")
def main(cfg: DictConfig) -> float | tuple[float, ...] | None:
    from zoo.jobs.prune import run

    return run_job(cfg, run, lambda results: objective_values(results, list(cfg.prune.objectives)))


def setup() -> None:
    """Register the config schemas and the model plugins (``$DEPTHZOO_MODULES``): inside the error boundary."""
    register_configs(CONFIG_DIR)
    register_resolvers()


if __name__ == "__main__":
    guard(main, PruneConfig, setup)
