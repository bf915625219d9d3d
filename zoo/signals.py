"""The one place that installs handlers for the stop signals (SIGINT, SIGTERM)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


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
            signal.signal(s, handler)
