"""The log as of a watermark: what one sync step reads, and the position every table moves to.

A step reads the log's latest commit watermark once (:func:`~derived_views.source.log_source.read_watermark`)
and brings every table to it: :class:`LogAsOf` is that pair of the log and its watermark, which every
table's step is given; :func:`pending_events` says from offsets alone how much a table has left to apply.
"""

from __future__ import annotations

from dataclasses import dataclass

from derived_views.engine.progress import Progress
from derived_views.source.log_location import LogLocation
from derived_views.source.log_source import LogWatermark


@dataclass(frozen=True)
class LogAsOf:
    """The log as of a watermark: what one sync step reads, and the position every table moves to."""

    log: LogLocation
    watermark: LogWatermark

    def progress(self, topics: list[str], previous: Progress | None = None) -> Progress:
        """The progress a table consuming ``topics`` has once this range is applied (computed with the
        same definition as ``previous``)."""
        offsets = {t: dict(parts) for t, parts in (previous.offsets if previous else {}).items()}
        for topic in topics:
            offsets[topic] = dict(self.watermark.offsets.get(topic, {}))
        return Progress(offsets, self.watermark.position, self.watermark.timestamp_ms, previous.definition if previous else "")


def pending_events(watermark: LogWatermark, topics: list[str], progress: Progress | None) -> int:
    """Events of ``topics`` up to ``watermark`` after ``progress`` (all of them when ``None``), from offsets alone."""
    return sum(
        max(0, end - (progress.next_offset(topic, partition) if progress else 0))
        for topic in topics
        for partition, end in watermark.offsets.get(topic, {}).items()
    )
