"""The one place that installs handlers for the stop signals (SIGINT, SIGTERM); a SLURM job that has asked to be
requeued ignores SIGTERM from then on (:func:`ignore_stop_for_requeue`)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_requeue = {"requested": False}


@contextmanager
def on_stop_signals(handle: Callable[[int, Any], None]) -> Iterator[None]:
    """While inside, SIGINT and SIGTERM call ``handle(signum, frame)``; the previous handlers come back on exit.
    Outside the main thread (where Python cannot install handlers) nothing is installed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, handle) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_IGN if s == signal.SIGTERM and requeue_requested() else handler)


def ignore_stop_for_requeue() -> None:
    """A SLURM job asking to be requeued (submitit's checkpoint hook, just before ``scontrol requeue``): the SIGTERM
    with which SLURM then stops its step is ignored from now on; the requeued job resumes from its run directory."""
    _requeue["requested"] = True
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def requeue_requested() -> bool:
    """Whether this job has asked SLURM to requeue it (:func:`ignore_stop_for_requeue`)."""
    return _requeue["requested"]
