"""Every error (and warning) depthzoo raises on purpose, in one place: each says what was wrong and what is allowed.

User errors derive from :class:`ZooError` (a ``ValueError``): the entry points turn them into one line and exit
status 2. :class:`Interrupted` is SIGINT/SIGTERM (exit status 128 + the signal). The modules that raise an error
re-export it, so ``from zoo.search import BudgetError`` keeps working.
"""


class ZooError(ValueError):
    """Base class of depthzoo's user-facing errors."""


# -- models and weights


class UnknownModelError(ZooError):
    """A model name that is not registered."""


class ModelOptionError(ZooError):
    """A builder option (``create_model(name, **options)``, ``model.overrides``) the model does not have or allow."""


class WeightsError(ZooError):
    """A weight file or hub id that cannot be loaded into the requested model."""


class UnknownTagError(UnknownModelError, WeightsError):
    """A pretrained tag that is not known for the architecture, or weights asked of a model without any tag."""


class PlanError(ZooError):
    """A pruning plan that does not fit the model."""


# -- files and runs


class CorruptFileError(ZooError):
    """A file the project wrote earlier (a cache, a run record) that is not intact: truncated, edited or foreign."""


class RunConflictError(ZooError):
    """A run directory that holds another run's results (or a run in progress) and was not released with force."""


class ReportError(ZooError):
    """A sweep directory that cannot be reported."""


# -- training


class ConfigError(ZooError):
    """A configuration value that is invalid or inconsistent with the model or the data."""


class DataError(ZooError):
    """A data set that cannot be found or read."""


class CheckpointError(ZooError):
    """A checkpoint that cannot be resumed from (missing, unreadable, or of another model)."""


class NonFiniteLossError(ZooError):
    """The loss became NaN or infinite; training stopped and kept the last good checkpoint."""


# -- latency and search


class LatencyDeviceError(ZooError):
    """A device that is not available here, or a dtype the device cannot measure."""


class LatencyCacheWarning(UserWarning):
    """A cache file could not be used (corrupt, stale or unreadable); its entries are measured again."""


class BudgetError(ZooError):
    """The latency (or memory) budget cannot be met even by removing everything removable."""


# -- interruptions


class Interrupted(Exception):  # noqa: N818 - an interruption, not a failure of the code
    """SIGINT/SIGTERM stopped a run; `signum` is the signal received (the exit status is 128 + signum)."""

    def __init__(self, signum: int, message: str | None = None):
        self.signum = signum
        super().__init__(message or f"Stopped by signal {signum}; run the same command again to continue.")


class TrainingInterrupted(Interrupted):
    """SIGINT/SIGTERM stopped training after `last` was saved; `signum` is the signal received."""

    def __init__(self, signum: int, checkpoint: str | None, hint: str = ""):
        self.checkpoint = checkpoint
        super().__init__(signum, f"Training interrupted by signal {signum}; saved {checkpoint or 'nothing'}.{hint}")


class ExportError(ZooError):
    """An export that cannot be made or does not reproduce the model (zoo.export)."""
