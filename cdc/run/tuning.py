"""The knobs and the counts of a capture run (:class:`~cdc.run.coordinator.Capture`)."""

from __future__ import annotations

from dataclasses import dataclass

from cdc.capture.reads.read_settings import ReadStats, ReadTuning
from cdc.capture.stream_core import StreamTuning


@dataclass(frozen=True)
class Tuning(StreamTuning, ReadTuning):
    """Batching and timing knobs of capture: the streaming loop's (:class:`StreamTuning`), the reads'
    (:class:`ReadTuning`) and the snapshot's, reconnection's and memory's (defaults suit the benchmarks and
    the tests)."""

    #: rows per chunk of every read (``None``: ``CDC_SNAPSHOT_CHUNK_ROWS``; see :data:`cdc.capture.snapshot.AHEAD`
    #: for the measured trade-off)
    snapshot_chunk_rows: int | None = None
    reconnect_seconds: float = 120.0
    memory_limit: int = 8 << 20


@dataclass
class CaptureStats(ReadStats):
    """What one run did (the reads' figures are :class:`ReadStats`')."""

    snapshot_rows: int = 0
    transactions: int = 0
    skipped: int = 0
    events: int = 0
    groups: int = 0
    reconnects: int = 0
    #: times every table was read again because the slot did not continue the log (:mod:`cdc.capture.slot_continuity`)
    resnapshots: int = 0
