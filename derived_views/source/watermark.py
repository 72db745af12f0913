"""The log's latest commit watermark as plain values, read without Spark.

:func:`read_watermark` is what the driver, ``cdc lag`` and its exporter use to learn how far the log is;
:mod:`derived_views.source.log_source` (the ``cdclog`` Spark source) re-exports both names. Nothing here
imports Spark, so a process that only measures the log never loads it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from derived_views.source.log_location import LogLocation

#: ``{"topic": {"partition": next_offset}}``.
Offsets = dict[str, dict[str, int]]


@dataclass(frozen=True)
class LogWatermark:
    """A commit watermark as plain values: its position, time and end offsets of the chosen topics."""

    position: str
    timestamp_ms: int
    offsets: Offsets

    @property
    def lsn(self) -> int:
        """The watermark position as an integer commit LSN (0 when it is not hex)."""
        try:
            return int(self.position, 16)
        except ValueError:
            return 0

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (a streaming offset)."""
        return {"position": self.position, "timestamp_ms": self.timestamp_ms, "offsets": self.offsets}


def read_watermark(location: LogLocation | str, topics: Sequence[str] | None = None) -> LogWatermark | None:
    """The log's latest commit watermark restricted to ``topics`` (all when ``None``); ``None`` before
    the first one. A topic the log does not hold (yet) reads as having no partitions.
    """
    with LogLocation.of(location).open() as log:
        watermark = log.latest_watermark()
        if watermark is None:
            return None
        offsets: Offsets = {topic: {} for topic in topics or ()}
        for tp, end in watermark.end_offsets.items():
            if topics is None or tp.topic in offsets:
                offsets.setdefault(tp.topic, {})
                offsets[tp.topic][str(tp.partition)] = int(end)
        return LogWatermark(str(watermark.position), int(watermark.timestamp_ms), offsets)
