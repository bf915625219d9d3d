"""Metric loggers: W&B (offline by default, no account needed) and a no-op logger.

:func:`create_logger` builds one from the ``logger`` config group. W&B is imported only when a W&B logger
is created. An online run that cannot start (no API key, no network) falls back to offline with a
warning after at most ``init_timeout`` seconds; it never hangs or stops training.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

from .settings import LoggerConfig

_log = logging.getLogger(__name__)


class NullLogger:
    """Logs nothing; the interface every logger implements."""

    run_dir: Path | None = None

    def log(self, metrics: dict[str, float], step: int) -> None:
        pass

    def summary(self, metrics: dict[str, Any]) -> None:
        pass

    def log_checkpoint(self, path: str | Path, aliases: list[str]) -> None:
        pass

    def finish(self, exit_code: int = 0) -> None:
        pass


class WandbLogger(NullLogger):
    """One W&B run: resolved config, per-step/per-epoch metrics, final summary, optional checkpoint artifact."""

    def __init__(self, *, mode: str = "offline", project: str = "depthzoo", entity: str | None = None,
                 group: str | None = None, name: str | None = None, tags: list[str] | None = None,
                 save_dir: str | Path | None = None, config: dict | None = None, init_timeout: float = 30.0,
                 log_checkpoints: bool = False):
        import wandb

        self._wandb = wandb
        self.log_checkpoints = log_checkpoints
        if save_dir is not None:
            Path(save_dir).mkdir(parents=True, exist_ok=True)
        kwargs = {"project": project, "entity": entity, "group": group, "name": name, "tags": list(tags or []),
                  "dir": str(save_dir) if save_dir else None, "config": config, "reinit": "finish_previous"}
        settings = {"init_timeout": init_timeout, "login_timeout": init_timeout, "silent": True}
        try:
            self.run = wandb.init(mode=mode, settings=wandb.Settings(**settings), **kwargs)
        except Exception as exc:  # noqa: BLE001 - any failure to go online means: log offline
            if mode != "online":
                raise
            message = (f"W&B online run could not start ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
                       f"logging offline instead. Sync later with `wandb sync`.")
            warnings.warn(message, RuntimeWarning, stacklevel=2)
            _log.warning(message)
            self.run = wandb.init(mode="offline", settings=wandb.Settings(**settings), **kwargs)
        self.run_dir = Path(self.run.dir).parent if self.run is not None else None
        for prefix in ("train", "val", "val_ema"):
            self.run.define_metric(f"{prefix}/*", step_metric="trainer/step")
        self.run.define_metric("trainer/step", hidden=True)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log({**metrics, "trainer/step": step})

    def summary(self, metrics: dict[str, Any]) -> None:
        for key, value in metrics.items():
            self.run.summary[key] = value

    def log_checkpoint(self, path: str | Path, aliases: list[str]) -> None:
        if not self.log_checkpoints:
            return
        artifact = self._wandb.Artifact(f"model-{self.run.id}", type="model")
        artifact.add_file(str(path))
        self.run.log_artifact(artifact, aliases=aliases)

    def finish(self, exit_code: int = 0) -> None:
        finish_run(self.run, exit_code)


class PrefixedLogger(NullLogger):
    """A second training phase logged into the same run under its own names (``<prefix>/train/loss_step``, its
    summary, ``<prefix>-best`` checkpoints); finishing is left to the run's owner."""

    def __init__(self, inner: NullLogger, prefix: str):
        self.inner, self.prefix, self.run_dir = inner, prefix, inner.run_dir

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.inner.log({f"{self.prefix}/{k}": v for k, v in metrics.items()}, step)

    def summary(self, metrics: dict[str, Any]) -> None:
        self.inner.summary({f"{self.prefix}/{k}": v for k, v in metrics.items()})

    def log_checkpoint(self, path: str | Path, aliases: list[str]) -> None:
        self.inner.log_checkpoint(path, [f"{self.prefix}-{a}" for a in aliases])


def finish_run(run: Any, exit_code: int = 0) -> None:
    """End a W&B run and wait until its data is on disk.

    ``run.finish`` can return before W&B's service has written the run file (offline runs were seen empty or
    without history right after it), so the service is shut down too when no other run is active: whatever is
    written after this call (results.json) comes after the run's data.
    """
    import wandb

    run.finish(exit_code=exit_code)
    if wandb.run is None:
        wandb.teardown()


def create_logger(cfg: LoggerConfig, config: dict | None = None, is_main: bool = True, group: str | None = None
                  ) -> NullLogger:
    """A logger for the ``logger`` config group; non-main ranks and ``logger=none`` get a NullLogger.

    `group` (e.g. the Hydra sweep directory) is used when ``cfg.group`` is not set.
    """
    if not is_main or cfg.name == "none" or cfg.mode == "disabled":
        return NullLogger()
    return WandbLogger(mode=cfg.mode, project=cfg.project, entity=cfg.entity, group=cfg.group or group,
                       name=cfg.run_name, tags=list(cfg.tags), save_dir=cfg.save_dir, config=config,
                       init_timeout=cfg.init_timeout, log_checkpoints=cfg.log_checkpoints)
