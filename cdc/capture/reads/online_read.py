"""Reading a table beside the stream: its rows in chunks from snapshots renewed every few seconds, its own changes held.

A table that joins the capture mid-stream, or must be read again (:mod:`cdc.capture.table_snapshots`
says when), is read from a plain snapshot taken at the stream's reach B (no replication slot: nothing
waits for other transactions), and the stream never waits for the read:

1. When the stream reaches B (every transaction committing before B is in the log), the table's read
   begins. Each pass of the streaming loop appends one chunk of one read (up to
   ``CDC_SNAPSHOT_CONCURRENCY`` reads take turns; the others wait, holding their changes) as its own
   group at the stream's current position (a chunk is not a source transaction: the position does not
   move). The first chunk follows the truncate markers and the schema record; each chunk's rows are
   ``op=r`` as of B - 1. A table with a primary key of integer or uuid columns is read by key
   (:func:`~cdc.capture.snapshot_chunks.keyset_query`; chunks fetched ahead on the snapshot's sessions,
   :meth:`~cdc.capture.snapshot.SnapshotReader.keyset_chunks`) and each chunk's group carries the read's progress
   record (:class:`~cdc.capture.table_snapshots.ReadProgress`: the last key written); other tables are
   read by block ranges.
2. Every other table's changes reach the log as they come. The table's own changes committing at or
   after B are encoded as for the log but go to a holding file
   (:class:`~cdc.capture.reads.held_changes.HeldChanges`, fsynced before the log commits their group), each
   marked with the first of the read's snapshots that sees its transaction (by transaction ID); those
   committing before B are dropped (the snapshot holds their effect).
3. **Runs.** A read by key holds one snapshot for ``read_snapshot_seconds`` (and one chunk) at most:
   then it stops and goes on past its last durable key from a new snapshot at a new boundary, as a
   resumed read (below). So no session keeps the server's xmin horizon, which decides what VACUUM may
   remove, for longer than that. A read by block ranges cannot go on from another snapshot and keeps
   its one to the end.
4. The last chunk waits until the stream has received (and held or written) every transaction
   committing before the WAL's end at the last snapshot, so that every transaction that snapshot sees is
   judged. Its group then ends with the held records the rows lack (:func:`run_keep`: a change whose key
   was read by a run whose snapshot did not see it), in commit order, the progress tombstone and the
   table's ledger record: from then on the table's changes go straight to the log.

Per-key order (promise 3): every row read is as of its run's snapshot and precedes every held change
written after it, each newer than the row (the snapshot that read the key did not see it), which precede
every later change; changes before B are never written. No partial row before
a full one (promise 4): a partial update of a key at or after B finds, before it in the log, that key's
row as read (it existed then) or the insert that created it (held in order). An
update that changes a key and leaves TOAST values unchanged takes them from the old key's row in the
log, which a read under way may not hold yet: such an update starts the read over, and so does a change
of the table's columns (a new schema in the stream), so a row is never mixed from two shapes. A read
started over deletes its held records; its table is read again from a new snapshot at a later point
(its truncate markers supersede the chunks already written; that point is past every held change).

**Resume** (a read by key, after ``kill -9``, any stop or a renewal): the next run finds the progress
record and the holding file, cuts the file to the log's watermark (the slot sends the rest again) and
holds the table's changes; its new snapshot is read from the key past the last durable one, K1, without
markers. A held change goes to the log only when its key was read by a run whose snapshot did not see
it (:func:`run_keep`; runs 0, 1, ... each with its last key): every record already held when the new
snapshot is taken is seen by it, and the progress record keeps the snapshots that may see what the slot
sends again, so a process that resumes marks those as the one that stopped would have. A key change
crossing K1 is a delete of one key and a create of the other, each judged by its own key. A read whose
table's columns changed since, or a read by block ranges, starts over.

What a read holds on PostgreSQL: the REPEATABLE READ transaction that imported the snapshot (with its
xmin, which keeps VACUUM from removing rows deleted since B), for one run, and, from each read's start
on, the ACCESS SHARE lock of the tables of the snapshot begun so far. A read never makes DDL wait for it
(**giving way**): between chunks capture asks which sessions wait for a lock a read's snapshot holds
(``pg_blocking_pids``; ``ALTER TABLE`` or ``TRUNCATE`` of a table read, or a session queued behind one).
Each read of that snapshot then stops and ends its transaction, and goes on later from a new snapshot at
a later point, exactly as a resumed read above (past its last durable key, its held changes kept; one by
block ranges, or one that wrote no row yet, starts over); a reconnect of the replication session does the
same. So the DDL waits about one chunk (the chunks fetched ahead, one per session at once, are waited for
and dropped), the application's writers never queue behind it for a whole read, and xmin and locks are
held for one snapshot's run, not the read's. A read begins by locking its table (``lock_timeout``
``read_lock_timeout_ms``) and checking that no rewrite, ``TRUNCATE`` or change of its columns committed
since its snapshot (:meth:`~cdc.capture.snapshot.SnapshotReader.hold`): PostgreSQL shows a table
rewritten after a snapshot as empty to it, and a changed shape would mix two. Such a read waits for the
next snapshot; a change of columns then restarts the read in the new shape (its progress no longer
matches), never a mixed row. A new schema met in the stream restarts a read only when it differs from the
shape the read writes.

Views that sync during the read see the table's rows arrive chunk by chunk; the table is exact again, as of the
watermark, once the ledger record is in the log.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from uuid import UUID

import orjson

from cdc.capture.published_tables import PublishedTable
from cdc.capture.reads.held_changes import HeldChanges
from cdc.capture.snapshot_chunks import KEYSET_TYPES
from cdc.capture.snapshot_writer import KeysetPlan, OnlineParts, SnapshotWriter
from cdc.capture.table_snapshots import PendingSnapshot, ReadProgress
from cdc.capture.tables import TableShape
from event_format import is_truncate_key

#: Whether a held record, by its commit LSN and key, goes to the log when its read ends.
Keep = Callable[[int, bytes | None], bool]


def held_path(held_dir: Path, slot: str, relid: int) -> Path:
    """The holding file of a table's read (one read per table at a time)."""
    return held_dir / f"{slot}-{relid}.held"


def keyset_keys(shape: TableShape, primary_key: tuple[str, ...]) -> tuple[str, ...] | None:
    """The key a table is read by beside the stream (its primary key, in index order), or ``None`` when it
    is read by block ranges instead (no primary key, or one with a type outside
    :data:`~cdc.capture.snapshot_chunks.KEYSET_TYPES`): such a read starts over after a crash."""
    types = {column.name: column.type_name for column in shape.columns if column.key}
    if not primary_key or set(primary_key) != set(types) or any(types[k] not in KEYSET_TYPES for k in primary_key):
        return None
    return primary_key


def _typed(type_name: str, value: object) -> object:
    return UUID(str(value)) if type_name == "uuid" else int(str(value))


def run_keep(shape: TableShape, keys: tuple[str, ...] | None, earlier: tuple[tuple[str, ...] | None, ...]) -> Keep:
    """Which held records go to the log when the read ends. The read's earlier runs 0 .. n-1 wrote the
    keys up to ``earlier`` (the last key each had written, in order; ``None``: none yet), this one, run n,
    the rest. A record marked run r (the first run whose snapshot sees its transaction,
    :meth:`~cdc.capture.reads.held_changes.HeldChanges.run_of`) is already in the rows of runs r and later:
    it goes to the log only when its key was read by a run before r, so after that key's row. A key
    change is a delete of one key and a create of the other: each is judged by its own key. A read
    without ``keys`` (by block ranges) has one run."""
    bounds: list[tuple[object, ...] | None] = []
    types = {column.name: column.type_name for column in shape.columns}
    if keys is not None:
        for last in earlier:
            bounds.append(None if last is None else tuple(_typed(types[k], t) for k, t in zip(keys, last, strict=True)))

    def keep(run: int, key: bytes | None) -> bool:
        if run <= 0:
            return False
        if run > len(bounds):
            return True  # unseen by every snapshot of the read until its end
        bound = bounds[run - 1]
        if bound is None or key is None or is_truncate_key(key) or keys is None:
            return False  # a truncate seen by a later run starts the read over (HeldChanges.truncated)
        values = orjson.loads(key)
        return tuple(_typed(types[k], values[k]) for k in keys) <= bound  # type: ignore[operator]

    return keep


@dataclass
class OnlineRead:
    """One table read beside the stream from a snapshot (shared with the other tables of that snapshot),
    and its held changes."""

    table: PublishedTable
    pending: PendingSnapshot
    held: HeldChanges
    parts: OnlineParts
    shape: TableShape
    #: rows already in the log when this read began (a resumed read), and the key it resumed after
    resumed_rows: int = 0
    resumed_after: tuple[str, ...] | None = None
    estimate: int = 0
    started: float = field(default_factory=time.monotonic)
    chunks: int = 0
    abandoned: bool = False
    #: the progress record of the earlier run this read resumed (``None``: it read from the first key)
    resumed_from: ReadProgress | None = None
    #: a partial read's condition (``cdc snapshot --where``): see :mod:`cdc.capture.reads.partial_reads`
    condition: str | None = None

    @classmethod
    def start(
        cls,
        pending: PendingSnapshot,
        table: PublishedTable,
        writer: SnapshotWriter,
        held: HeldChanges,
        plan: KeysetPlan | None,
        keep: Keep | None,
        progress: ReadProgress | None = None,
        condition: str | None = None,
    ) -> OnlineRead:
        """The read of ``table`` in ``pending``'s snapshot (nothing is written until :meth:`next_chunk`);
        ``progress``: the earlier run's, when ``plan`` resumes it; ``condition``: a partial read's.

        The read's events are numbered (``source.sequence``) from 0: its rows' ``source.lsn`` lies past
        every position rows were labelled with before (``Capture._discover`` waits for that), so they
        order after every event already in the log."""
        held.run_started(len(plan.earlier) if plan is not None else 0, pending.xids, wal_end=pending.wal_end)
        shape = writer.shape_of(table)
        parts = writer.start_online(
            [table], pending.reader, pending.as_of, lambda: held.records(keep), {table.relid: plan} if plan else None,
            {table.relid: condition} if condition is not None else None,
        )  # fmt: skip
        pending.users += 1
        resumed = plan is not None and plan.after is not None
        return cls(
            table, pending, held, parts, shape,
            resumed_rows=plan.rows if plan is not None and resumed else 0,
            resumed_after=plan.after if plan is not None and resumed else None,
            estimate=pending.reader.estimate(table.relid) if condition is None else 0, resumed_from=progress if resumed else None,
            condition=condition,
        )  # fmt: skip

    @property
    def topic(self) -> str:
        return self.shape.topic

    @property
    def relid(self) -> int:
        return self.table.relid

    @property
    def done(self) -> bool:
        return self.parts.done

    @property
    def rows(self) -> int:
        """Rows of the table in the log, those of an earlier run of a resumed read included."""
        return self.parts.rows

    @property
    def progress(self) -> ReadProgress | None:
        """How far the log holds this read by key (its last durable progress record, or the one it resumed
        from); ``None`` for a read by block ranges or one that wrote no rows yet: those start over."""
        progress = self.parts.progress or self.resumed_from
        return progress if progress is not None and progress.key is not None else None

    def initial_progress(self) -> ReadProgress:
        """The progress of this read before its first chunk: no key past the one it starts after."""
        return ReadProgress(
            self.relid, self.topic, self.pending.boundary, self.resumed_after, self.resumed_rows,
            self.shape.fingerprint().hex(), condition=self.condition,
        )  # fmt: skip

    def next_chunk(self, writer: SnapshotWriter, position: str) -> bool:
        """Append the next chunk as a group at ``position``; whether the read is complete (the last chunk,
        the held records and the ledger record are then in the log)."""
        self.chunks += 1
        return writer.write_next(self.parts, position)

    def suspend(self) -> None:
        """Stop reading and release the snapshot (its transaction ends with its last read), keeping the held
        records for the run that resumes the read."""
        self.parts.close()
        self.pending.release()

    def close(self) -> None:
        """Stop reading, release the snapshot and delete the held records."""
        self.suspend()
        self.held.discard()


def progress_plan(
    progress: ReadProgress | None, keys: tuple[str, ...] | None, shape: TableShape, boundary: int
) -> KeysetPlan | None:
    """The plan of a read by ``keys`` at ``boundary``: past ``progress``'s key when it is a resumable
    earlier read of the same shape, else from the start."""
    if keys is None:
        return None
    if progress is not None and progress.key is not None and progress.fingerprint == shape.fingerprint().hex():
        return KeysetPlan(keys, progress.key, progress.rows, boundary, (*progress.earlier, (progress.boundary, progress.key)))
    return KeysetPlan(keys, None, 0, boundary)
