"""One table's step in a sync, as one value: what it reads, as of which watermark, how the events are
typed, where and how they are written.

A sync step reads the log as of one watermark (:class:`~derived_views.source.as_of.LogAsOf`) and brings
each table to it. :class:`TableStep` is that for one table: made by the view that keeps the table
(:func:`derived_views.views.warehouse.sync`, :mod:`derived_views.views.composite_sync`), completed as the
step learns more (where the table stands, in :func:`derived_views.write.steps.apply_table`; the column
types chosen; then the batch's facts), and handed down whole: to the read of its pending events
(:func:`derived_views.source.pending.typed_batch`) and to the MERGE that writes them
(:func:`derived_views.write.scd1.merge_current`, :func:`derived_views.write.scd2.merge_history`).

It lives in the reading layer, the lowest that both the read and the writes can import; with it the
value of an added column that older rows hold (:class:`Fill`, computed by
:mod:`derived_views.write.stored_defaults`), which a step's writes carry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from derived_views.engine.progress import Progress
from derived_views.errors import ViewError
from derived_views.events.metadata_columns import LSN, SEQ
from derived_views.events.spark_typing import Plan
from derived_views.source.as_of import LogAsOf, pending_events


@dataclass(frozen=True)
class Fill:
    """One fact: the table column ``column`` (stored name) holds the value of the Spark SQL expression
    ``value`` in every row whose last event is before ``(lsn, sequence)``."""

    column: str
    value: str
    lsn: int
    sequence: int

    def before(self, lsn: str = LSN, seq: str = SEQ) -> str:
        """SQL: the position ``(lsn, seq)`` (column expressions) is before the fact's."""
        return f"({lsn} < {self.lsn} OR ({lsn} = {self.lsn} AND {seq} < {self.sequence}))"

    def at_or_after(self, lsn: str, seq: str) -> str:
        """SQL: the position ``(lsn, seq)`` is at or after the fact's."""
        return f"NOT {self.before(lsn, seq)}"


@dataclass(frozen=True)
class TableStep:
    """One table's step in a sync: the events of ``topics`` in the log as of ``as_of`` that the table at
    ``path`` has not applied, reduced by ``mode``, typed, and written to it in one commit."""

    as_of: LogAsOf
    """The log as of the sync's watermark: what the step reads, and the position the table moves to."""
    topics: list[str]
    path: str
    """The Delta table the step writes."""
    mode: str = "latest"
    """How the events are reduced per key: ``latest`` (one row per key) or ``all`` (every version)."""
    replace: bool = False
    """The table is written anew from every event of the log (a rebuild, or a table without progress)."""
    applied: Progress | None = None
    """The progress the table has: the step reads the events after it (``None``: every event)."""

    # how the events are typed (:func:`derived_views.source.pending.typed_batch`)
    table: str = ""
    """The source table's qualified name, for messages."""
    columns: list[tuple[str, str]] = field(default_factory=list)
    """``(source name, Spark type)`` of the data columns the events are typed as."""
    plan: Plan | None = None
    """How events of each schema version are parsed (:func:`~derived_views.events.spark_typing.typed`)."""
    stored_as: Mapping[str, str] | None = None
    """The stored name of each column (:mod:`derived_views.events.column_names`); ``None``: its source name."""

    # what the batch read brings to the write (:class:`~derived_views.write.steps.Pending`)
    progress: Progress | None = None
    """The progress the step's commit records (known once its batch is read)."""
    truncates: tuple[int, ...] = ()
    """The commit LSNs of the truncates in the batch."""
    inserts_only: bool = False
    """Every event of the batch is an insert: appended when no key meets the table (rule 7)."""
    keys: Sequence[str] | None = None
    """The batch's keys when the driver holds them (for :attr:`inserts_only`)."""
    keyless: bool = False
    """No event of the batch carries a key: its rows are appended when it holds no truncate and no fill (rule 9)."""
    whole_rows: bool = False
    """No row of the batch lacks a column (``unchanged`` is empty everywhere)."""
    fills: tuple[Fill, ...] = ()
    """The values of added columns that older rows hold, whose position is in the batch's range."""

    def pending(self) -> int:
        """Events of the step's topics up to the watermark that the table has not applied (from offsets alone)."""
        return pending_events(self.as_of.watermark, self.topics, self.applied)

    def progress_after(self, since: int | None = None) -> Progress:
        """The progress the table has once the step applied its events (:meth:`LogAsOf.progress`;
        ``since``: the commit LSN of the newest event its data then holds)."""
        return self.as_of.progress(self.topics, self.applied, since=since)

    @property
    def stored_columns(self) -> list[tuple[str, str]]:
        """``(stored name, Spark type)`` of the data columns, as the table stores them."""
        if self.stored_as is None:
            return list(self.columns)
        return [(self.stored_as[name], spark_type) for name, spark_type in self.columns]

    @property
    def recorded(self) -> Progress:
        """The progress the step's commit records (:attr:`progress`), which a write needs."""
        if self.progress is None:
            raise ViewError(f"{self.path}: the step writes before its batch was read")
        return self.progress
