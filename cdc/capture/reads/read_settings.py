"""What the reads are given and what they report: the settings they use, their timing knobs, their figures."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


class ReadSettings(Protocol):
    """The settings reads use (the application's settings class has them all)."""

    @property
    def database_url(self) -> str: ...

    @property
    def publication(self) -> str: ...

    @property
    def slot(self) -> str: ...

    @property
    def data_dir(self) -> Path: ...

    @property
    def snapshot_concurrency(self) -> int: ...

    @property
    def snapshot_sessions(self) -> int: ...

    @property
    def snapshot_rows_per_second(self) -> int: ...

    @property
    def request_key_bytes(self) -> bytes | None: ...


@dataclass(frozen=True)
class ReadTuning:
    """The reads' timing knobs, in seconds where they are times."""

    #: how often, at most, capture looks for sessions waiting for a lock a read holds (between chunks)
    lock_check_seconds: float = 0.05
    #: how long a read waits for its table's lock, at its start and in each chunk's query
    read_lock_timeout_ms: int = 200
    #: how long a read by key reads from one snapshot before it goes on from a new one (xmin held at most that)
    read_snapshot_seconds: float = 2.0


@dataclass
class ReadStats:
    """What the reads of one run did."""

    #: tables read that joined the capture (or were read again because they changed)
    tables_added: int = 0
    #: reads beside the stream begun again from a new snapshot (:mod:`cdc.capture.reads.online_read`)
    reads_abandoned: int = 0
    #: changes of tables being read that waited in a holding file for their read's last chunk
    held_changes: int = 0
    #: reads resumed past the last key an earlier run wrote
    reads_resumed: int = 0
    #: tables read again on request (``cdc snapshot``)
    reads_requested: int = 0
    #: times a read gave way to another session's lock (DDL) and went on later from a new snapshot
    reads_yielded: int = 0
    #: reads stopped on request (``cdc snapshot --cancel``)
    reads_cancelled: int = 0
    #: times a read by key went on from a new snapshot because its own had been held long enough
    snapshots_renewed: int = 0
    #: passes of the loop in which no chunk was read, to keep reads within ``CDC_SNAPSHOT_ROWS_PER_SECOND``
    reads_throttled: int = 0
