"""Every error (and warning) depthzoo raises on purpose, in one place: each says what was wrong and what is allowed.

User errors derive from :class:`ZooError` (a ``ValueError``): the entry points turn them into one line and exit
status 2. :class:`Interrupted` is SIGINT/SIGTERM (exit status 128 + the signal). :func:`run_command` is the one error
boundary of every command line.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any


class ZooError(ValueError):
    """Base class of depthzoo's user-facing errors."""


def first_line(exc: BaseException) -> str:
    """The first line of an error's message, or its type's name when it has none: how a caught error is quoted in
    one line."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip()  # (without a terminal's colour codes)
    return text.splitlines()[0] if text else type(exc).__name__


# -- models and weights


class UnknownModelError(ZooError):
    """A model name that is not registered."""


class ModelOptionError(ZooError):
    """A builder option (``create_model(name, **options)``, ``model.overrides``) the model does not have or allow."""


class UnknownOptionError(ModelOptionError, TypeError):
    """A builder option the model's constructor does not take: also a ``TypeError``, as timm raises for one."""


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


class InputSizeError(ZooError):
    """An input a model cannot take (a wrong channel count, rank or size), named with the size the model takes."""


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


# -- the boundary of every command line

BUG = ("error: the command stopped on an unexpected error, a bug in depthzoo (the traceback above); please report it "
       "with the command you ran")


def run_command(main: Callable[[], Any]) -> int:
    """One command line's error boundary, the same for every door (``python -m zoo``, ``python -m zoo.latency``,
    ``python -m benchmarks``, each suite and study): a user error (:class:`ZooError`) is one line, ``error: ...``, on
    stderr and exit status 2; Ctrl-C is exit status 130; anything else is a bug: its traceback, a line that says so,
    exit status 1. A ``SystemExit`` (argparse's usage errors: 2) passes through. Returns the exit status (what `main`
    returned when it is an int, else 0)."""
    import sys
    import traceback

    try:
        code = main()
    except ZooError as exc:
        print(f"error: {first_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception:  # noqa: BLE001 - the boundary: whatever is left is a bug, shown in full
        traceback.print_exc()
        print(BUG, file=sys.stderr)
        return 1
    return code if isinstance(code, int) else 0
