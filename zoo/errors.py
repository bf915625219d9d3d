"""Errors users see: each says what was wrong and what is allowed."""


class ZooError(ValueError):
    """Base class of depthzoo's user-facing errors."""


class UnknownModelError(ZooError):
    """A model name that is not registered."""


class ModelOptionError(ZooError):
    """A builder option (``create_model(name, **options)``, ``model.overrides``) the model does not have or allow."""


class WeightsError(ZooError):
    """A weight file or hub id that cannot be loaded into the requested model."""


class PlanError(ZooError):
    """A pruning plan that does not fit the model."""


class CorruptFileError(ZooError):
    """A file the project wrote earlier (a cache, a run record) that is not intact: truncated, edited or foreign."""


class RunConflictError(ZooError):
    """A run directory that holds another run's results (or a run in progress) and was not released with force."""


class Interrupted(Exception):  # noqa: N818 - an interruption, not a failure of the code
    """SIGINT/SIGTERM stopped a run; `signum` is the signal received (the exit status is 128 + signum)."""

    def __init__(self, signum: int, message: str | None = None):
        self.signum = signum
        super().__init__(message or f"Stopped by signal {signum}; run the same command again to continue.")
