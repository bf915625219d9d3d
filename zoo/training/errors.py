"""Errors of the training library: each says what was wrong and what to do instead."""

from __future__ import annotations

from ..errors import Interrupted, ZooError


class ConfigError(ZooError):
    """A configuration value that is invalid or inconsistent with the model or the data."""


class DataError(ZooError):
    """A data set that cannot be found or read."""


class CheckpointError(ZooError):
    """A checkpoint that cannot be resumed from (missing, unreadable, or of another model)."""


class NonFiniteLossError(ZooError):
    """The loss became NaN or infinite; training stopped and kept the last good checkpoint."""


class TrainingInterrupted(Interrupted):
    """SIGINT/SIGTERM stopped training after `last` was saved; `signum` is the signal received."""

    def __init__(self, signum: int, checkpoint: str | None, hint: str = ""):
        self.checkpoint = checkpoint
        super().__init__(signum, f"Training interrupted by signal {signum}; saved {checkpoint or 'nothing'}.{hint}")
