"""Reading a table beside the stream: the rows of one exported snapshot in chunks, its own changes held.

A table that joins the capture mid-stream, or must be read again (:mod:`cdc.capture.table_snapshots`
says when), is read at the consistent point B of a temporary slot, as before; what changed is that
the stream never waits for the read:

1. When the stream reaches B (every transaction committing before B is in the log), the first part
   goes into the log as a group at position B - 1: truncate markers when the topic already holds
   records, the schema record, the first chunk of rows (``op=r``, ``source.lsn`` B - 1).
2. Then the stream goes on. Every other table's changes reach the log as they come. The table's own
   changes committing at or after B are encoded as for the log but go to a holding file
   (:class:`~cdc.capture.held_changes.HeldChanges`, fsynced before the slot is confirmed past them);
   those committing before B are dropped (the snapshot holds their effect). Between two passes of the
   streaming loop with no transaction waiting for a group, capture appends the next chunk of rows as
   its own group at the stream's current position (the position does not move: a chunk is not a
   transaction of the source).
3. The last chunk's group ends with the held records, in commit order, and then the table's ledger
   record: from then on the table's changes go straight to the log.

Per-key order (promise 3): every row of the table in the log is as of B - 1 and precedes every held
change (all at or after B), which precede every later change; changes before B are never written.
No partial row before a full one (promise 4): a partial update of a key at or after B finds, before it
in the log, that key's row as of B - 1 (it existed then) or the insert at or after B that created it
(held in order). An update that changes a key and leaves TOAST values unchanged takes them from the old
key's row in the log, which a read under way may not hold yet (its chunk comes later, or a held change
is newer): such an update abandons the read, and so does a change of the table's columns (a new
schema in the stream), so a row is never mixed from two shapes. An abandoned read's held records are
deleted, its table is read again from a new snapshot at a later point B2 (its truncate markers
supersede the chunks already written; B2 is past every held change, so the new snapshot holds them).

What a read holds on PostgreSQL: the REPEATABLE READ transaction that imported the snapshot stays open
(with its xmin, which keeps VACUUM from removing rows deleted since B) until the last chunk is read;
the temporary slot only for the moment of its creation. Views that sync during the read see the
table's rows arrive chunk by chunk; the table is exact again, as of the watermark, once the ledger
record is in the log. A read that a stop or a crash interrupts starts again from a new snapshot.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from cdc.capture.held_changes import HeldChanges
from cdc.capture.snapshot_writer import OnlineParts, SnapshotWriter
from cdc.capture.table_snapshots import PendingSnapshot


@dataclass
class OnlineRead:
    """One snapshot (one or more tables) read beside the stream; its tables' held changes."""

    pending: PendingSnapshot
    held: HeldChanges
    parts: OnlineParts | None = None
    topics: frozenset[str] = frozenset()
    relids: frozenset[int] = frozenset()
    estimate: int = 0
    started: float = field(default_factory=time.monotonic)
    chunks: int = 0
    abandoned: bool = False

    @classmethod
    def start(cls, pending: PendingSnapshot, writer: SnapshotWriter, held_dir: Path, name: str) -> OnlineRead:
        """Write the first part of ``pending``'s snapshot at its boundary minus one; the rest follows
        with :meth:`next_chunk`."""
        read = cls(pending, HeldChanges(held_dir / f"{name}.held"))
        try:
            read.parts = writer.start_online(pending.tables, pending.reader, pending.as_of, read.held.records)
        except BaseException:
            read.close()
            raise
        read.chunks = 1
        read.topics = frozenset(head.shape.topic for head in read.parts.heads)
        read.relids = frozenset(head.shape.relid for head in read.parts.heads)
        return read

    @property
    def done(self) -> bool:
        return self.parts is not None and self.parts.done

    @property
    def rows(self) -> int:
        return self.parts.rows if self.parts is not None else 0

    def next_chunk(self, writer: SnapshotWriter, position: str) -> bool:
        """Append the next chunk as a group at ``position``; whether the read is complete (the last chunk,
        the held records and the ledger record are then in the log)."""
        assert self.parts is not None
        self.chunks += 1
        return writer.write_next(self.parts, position)

    def close(self) -> None:
        """Stop reading, end the snapshot's transaction and delete the held records."""
        if self.parts is not None:
            self.parts.close()
        self.pending.close()
        self.held.discard()
