"""Depth-prune any depthzoo model on the device you run on: ``python prune.py [group=option ...] [key=value ...]``.

Thin entry point: composes ``conf/prune.yaml`` and hands it to :func:`zoo.pruning.run`. Returns the pruned
model's validation metric so Hydra sweepers can optimise it. A user error ends a single run with one clear
message and exit status 2; inside a multirun the failing job records ``failed.json`` and the sweep goes on.
"""

from __future__ import annotations

import json
import logging
import traceback
from pathlib import Path

import hydra
from omegaconf import DictConfig

from zoo.errors import ZooError
from zoo.pruning import register_configs
from zoo.training.distributed import register_resolvers
from zoo.training.errors import TrainingInterrupted

CONFIG_DIR = Path(__file__).resolve().parent / "conf"
log = logging.getLogger("prune")

register_configs(CONFIG_DIR)
register_resolvers()


def _in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.get().mode == RunMode.MULTIRUN


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="prune")
def main(cfg: DictConfig) -> float | None:
    from zoo.pruning import run

    try:
        results = run(cfg)
    except Exception as exc:  # noqa: BLE001 - in a sweep, one failing job must not stop the others
        expected = isinstance(exc, (ZooError, TrainingInterrupted))
        if expected:
            log.error("%s: %s", type(exc).__name__, exc)
        if _in_multirun():
            if not expected:
                log.exception("job failed")
            failed = Path(cfg.paths.output_dir) / "failed.json"
            failed.parent.mkdir(parents=True, exist_ok=True)
            failed.write_text(json.dumps({"error": type(exc).__name__, "message": str(exc),
                                          "traceback": traceback.format_exc()}, indent=2))
            return None
        if not expected:
            raise
        code = 128 + exc.signum if isinstance(exc, TrainingInterrupted) else 2
        raise SystemExit(code) from None
    metrics = results["pruned"]["metrics"]
    return metrics.get("val/acc1", metrics.get("val/loss"))


if __name__ == "__main__":
    main()
