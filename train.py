"""Train any depthzoo model from Hydra configs: ``python train.py [group=option ...] [key=value ...]``.

Thin entry point: composes ``conf/train.yaml`` and hands it to :func:`zoo.training.runner.run`. Returns the
monitored metric (``val/acc1`` or ``val/loss``) so Hydra sweepers can optimise it. Composition errors (unknown
group option, misspelt key, wrong type) are Hydra's messages with exit status 1; other user errors (bad value,
missing data, num_classes mismatch, resume from another model, NaN loss) end with one clear message and exit
status 2; SIGINT/SIGTERM save ``last`` and exit with 128 + the signal number.
"""

from __future__ import annotations

import logging
from pathlib import Path

import hydra
from omegaconf import DictConfig

from zoo.errors import ZooError
from zoo.training.config import register_configs
from zoo.training.distributed import register_resolvers
from zoo.training.errors import TrainingInterrupted

CONFIG_DIR = Path(__file__).resolve().parent / "conf"
log = logging.getLogger("train")

register_configs(CONFIG_DIR)
register_resolvers()


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="train")
def main(cfg: DictConfig) -> float | None:
    from zoo.training.runner import run

    try:
        results = run(cfg)
    except ZooError as exc:
        log.error("%s: %s", type(exc).__name__, exc)
        raise SystemExit(2) from None
    except TrainingInterrupted as exc:
        log.warning("%s", exc)
        raise SystemExit(128 + exc.signum) from None
    return results["metrics"].get(results["monitor"])


if __name__ == "__main__":
    main()
