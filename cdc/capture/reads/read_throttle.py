"""A ceiling on the rows per second that reads beside the stream take from the source (``CDC_SNAPSHOT_ROWS_PER_SECOND``).

A busy primary can be spared a read's full speed: chunks are appended only while the rows read since the
throttle began stay within the rate (a chunk may overshoot by its own size, never twice in a row; no more
than one second's rows are saved up while no read runs). The
stream is never held back by it: while a read waits, the loop waits for frames as when idle.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ReadThrottle:
    """Rows per second allowed (``0``: no ceiling), counted from the first chunk."""

    rows_per_second: int
    started: float | None = None
    rows: int = 0

    def allows(self, now: float) -> bool:
        """Whether a chunk may be read at ``now``."""
        if self.rows_per_second <= 0 or self.started is None:
            return True
        allowed = self.rows_per_second * (now - self.started)
        if allowed - self.rows > self.rows_per_second:  # no more than a second's rows saved up (after a pause)
            self.started = now - (self.rows + self.rows_per_second) / self.rows_per_second
        return self.rows <= allowed

    def took(self, rows: int, now: float) -> None:
        """A chunk of ``rows`` rows was read at ``now``."""
        if self.started is None:
            self.started = now
        self.rows += rows
