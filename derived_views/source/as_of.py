"""The log as of a watermark: what one sync step reads, and the position every table moves to.

A step reads the log's latest commit watermark once (:func:`~derived_views.source.watermark.read_watermark`)
and brings every table to it: :class:`LogAsOf` is that pair of the log and its watermark, which every
table's step is given; :func:`pending_events` says from offsets alone how much a table has left to apply.
"""

from __future__ import annotations

from dataclasses import dataclass

from derived_views.engine.progress import Progress
from derived_views.source.log_location import LogLocation
from derived_views.source.watermark import LogWatermark


@dataclass(frozen=True)
class LogAsOf:
    """The log as of a watermark: what one sync step reads, and the position every table moves to."""

    log: LogLocation
    watermark: LogWatermark

    def progress(self, topics: list[str], previous: Progress | None = None, *, since: int | None = None) -> Progress:
        """The progress a table consuming ``topics`` has once this range is applied (computed with the
        same definition as ``previous``, whose position it records as its :attr:`~Progress.prior`).

        ``since``: the commit LSN of the newest event the table's data holds then, when the step knows
        it; ``None`` records none, so that the data counts as exact as of the watermark alone (never
        as of a position before an event it holds). A ``since`` past the watermark (a table read by a
        composite that another process moved further on) leaves the data exact as of no position."""
        offsets = {t: dict(parts) for t, parts in (previous.offsets if previous else {}).items()}
        for topic in topics:
            offsets[topic] = dict(self.watermark.offsets.get(topic, {}))
        return Progress(
            offsets,
            self.watermark.position,
            self.watermark.timestamp_ms,
            previous.definition if previous else "",
            since=f"{since:016X}" if since is not None else "",
            prior=previous.position if previous else "",
        )

    def unchanged(self, topics: list[str], previous: Progress) -> Progress:
        """The progress of a table with ``previous`` to which this range brings no event of ``topics``:
        its data is the same, so the newest event it holds (:attr:`~Progress.since`) is too."""
        return self.progress(topics, previous, since=previous.since_lsn)


def pending_events(watermark: LogWatermark, topics: list[str], progress: Progress | None) -> int:
    """Events of ``topics`` up to ``watermark`` after ``progress`` (all of them when ``None``), from offsets alone."""
    return sum(
        max(0, end - (progress.next_offset(topic, partition) if progress else 0))
        for topic in topics
        for partition, end in watermark.offsets.get(topic, {}).items()
    )
