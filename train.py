"""Train any depthzoo model from Hydra configs: ``python train.py [group=option ...] [key=value ...]``.

Thin entry point: composes ``conf/train.yaml`` and hands it to :func:`zoo.jobs.train.run` through
:func:`zoo.jobs.cli.run_job`. Returns the monitored metric (``val/acc1`` or ``val/loss``) so Hydra sweepers can
optimise it. Every user error (a misspelt key, an unknown option, a bad value, missing data, a run directory that holds
another run) ends with one clear message and exit status 2; SIGINT/SIGTERM save ``last`` and exit with 128 + the
signal number; a multirun exits with status 1 after its last job if any job failed (docs/failures.md).
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

from zoo.jobs.cli import guard, register_resolvers, run_job
from zoo.jobs.train_config import TrainConfig, register_configs

CONFIG_DIR = Path(__file__).resolve().parent / "conf"


def monitored_metric(results: dict) -> float | None:
    return results["metrics"].get(results["monitor"])


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="train")
def main(cfg: DictConfig) -> float | None:
    from zoo.jobs.train import run

    return run_job(cfg, run, monitored_metric)


def setup() -> None:
    """Register the config schemas and the model plugins (``$DEPTHZOO_MODULES``): inside the error boundary."""
    register_configs(CONFIG_DIR)
    register_resolvers()


if __name__ == "__main__":
    guard(main, TrainConfig, setup)
