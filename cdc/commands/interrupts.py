"""Commands that run until stopped (``cdc log tail --follow``, ``cdc lag --watch``) end on SIGINT and SIGTERM.

Python turns SIGINT into :class:`KeyboardInterrupt` only when SIGINT is not ignored at start-up; a process
started with it ignored (``cmd &`` in a non-interactive shell, some supervisors) inherits that across
exec and would otherwise never stop on SIGINT. :func:`interrupt_on` installs that handler itself.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def interrupt_on(*signals: signal.Signals) -> Iterator[None]:
    """Make each of ``signals`` raise KeyboardInterrupt in the main thread while the block runs; the
    handlers before it are put back after it."""
    previous: dict[signal.Signals, Any] = {}
    for sig in signals:
        handler = signal.signal(sig, signal.default_int_handler)
        if handler is not None:  # None: a handler installed from C, which cannot be put back
            previous[sig] = handler
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
