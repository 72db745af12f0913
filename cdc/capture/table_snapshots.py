"""Tables that join the capture mid-stream: a snapshot at a temporary slot's consistent point, and the ledger.

**The ledger.** The compacted topic ``<prefix>.__snapshots`` holds one record per table whose snapshot
the log holds complete (key: the table's log name as a JSON string, ``"<schema>.<table>"`` for plain
names, see :mod:`log_store.topic_names`; value ``{"schema", "table", "topic",
"relid", "lsn", "rows", "membership", "columns"}``, the last two as the catalog described the table when
it was snapshotted, see :class:`~cdc.capture.catalog.PublishedTable`). It is written in the same group as the
snapshot's last rows, so after a crash either both are in the log or neither. A table's change events enter the log only once the
ledger names it (or its snapshot is under way, below): :class:`TableGate` is what the replayer asks.

**A table added to the publication** (or recreated, or captured by a log without a ledger entry for it,
or added back after it left the publication, or published via a root that gained or lost a partition,
or given a column whose existing rows hold values no change event carried and a rewrite wrote: ``ADD
COLUMN`` with a volatile default, an identity or a domain with a constraint, see
:func:`cdc.capture.catalog.columns_filled_since`; a constant default is carried by the schema record
instead, :mod:`cdc.capture.stored_defaults`) is
snapshotted the way PostgreSQL's own logical replication synchronises a table added to a subscription:

1. Capture notices a published, included table the ledger does not cover: at the start of every
   replication session, every few seconds while idle, right after a batch in which a table's columns
   changed, and when the stream carries a change of a table the ledger does not name (that change is
   held back, see 3).
2. A ``TEMPORARY`` logical slot is created with an exported snapshot on a second replication
   connection, and the snapshot is imported into a REPEATABLE READ transaction
   (:class:`~cdc.capture.snapshot.SnapshotReader`); the slot is dropped as soon as that is done, only its
   consistent point B matters. B splits every transaction in two: one committing before B is visible
   in the snapshot, one committing at or after B is not (a slot created at B streams exactly those).
3. Until the stream reaches B, the table's changes are dropped: all of them commit before B (they were
   received before the slot existed, or commit before B by the check), so the snapshot holds their
   effect. When the stream reaches B (a transaction committing at or after B arrives, or the server
   reports WAL past B with nothing in flight), the table's rows are written as one group at position
   B - 1: ``op=r`` with ``source.lsn`` B - 1, preceded by truncate markers when the topic already holds
   records (they supersede what an earlier capture of the table left), followed by the ledger record.
   The rows go in chunks beside the stream, the table's changes at or after B held until the last one
   (:mod:`cdc.capture.online_read`). From then on every change of the table is written.

Why no change is lost or doubled: every change of the table belongs to one transaction with commit LSN
L. If L < B it is in the snapshot and never written from the stream; if L >= B it is not in the
snapshot and is written from the stream, after the snapshot's rows (position B - 1 < L). Before the
table's snapshot exists no change of it is written at all, so nothing older can precede the rows. A
crash before the group is durable leaves neither rows nor ledger record; the next session takes a new
snapshot at a later point, and the changes the first attempt dropped are older than that point too.

Why not the watermark algorithm of DBLog (Debezium's incremental snapshot): written with
``pg_logical_emit_message`` its watermarks would need no more privileges, and it interleaves chunks with
the stream too. But a chunk row whose key changes inside the watermark window is dropped in favour of
the streamed event, and that event can be a partial row (an update leaving a TOAST value unchanged
carries no value for it), so the log would hold a partial row with no full row before it (promise 4).
Here one boundary that PostgreSQL defines orders every read row before every change of the table that
the log gets from the stream (:mod:`cdc.capture.online_read`), so neither case arises.

Costs and requirements: one more replication slot and WAL sender for a moment; creating the slot waits
for the transactions running at that moment to end (as the initial snapshot does); the snapshot
transaction stays open until the last chunk of the read, or until the read gives way to DDL
(:mod:`cdc.capture.online_read`). Privileges:
REPLICATION and SELECT on the table, as for the initial snapshot; a table created after the capture
role was set up needs its own ``GRANT SELECT`` (or ``ALTER DEFAULT PRIVILEGES ... GRANT SELECT ON
TABLES``), else capture stops with a :class:`~cdc.capture.errors.PrivilegeError` naming the grant.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import orjson

from cdc.capture.catalog import PublishedTable, columns_filled_since, key_changed
from cdc.capture.errors import SourceError
from cdc.capture.lsn import Lsn
from cdc.capture.snapshot import SnapshotReader
from cdc.capture.tables import TableShape
from cdc.capture.transport import ReplicationConnection
from log_store import ProducerRecord, TopicPartition

if TYPE_CHECKING:
    from log_store.log import Log


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One snapshotted table: its OID, publication membership and column marks when snapshotted (see
    :class:`~cdc.capture.catalog.PublishedTable`), the LSN its rows are as of."""

    relid: int
    lsn: int
    membership: str | None = None
    columns: str | None = None


@dataclass(frozen=True, slots=True)
class ReadProgress:
    """A read beside the stream (:mod:`cdc.capture.online_read`) as far as the log holds it: the table's
    OID and topic, the boundary B its current run reads at, the primary key (in index order) of its last
    row in the log (column texts; ``None``: no row yet), the rows written, the shape's fingerprint (hex),
    and for each earlier run of the read (it was resumed) its boundary and the last key it wrote; for a
    partial read (``cdc snapshot --where``), its condition."""

    relid: int
    topic: str
    boundary: int
    key: tuple[str, ...] | None
    rows: int
    fingerprint: str
    earlier: tuple[tuple[int, tuple[str, ...] | None], ...] = ()
    condition: str | None = None


def _progress_key(log_name: str) -> bytes:
    return orjson.dumps(["read", log_name])


def _cancelled_key(log_name: str) -> bytes:
    return orjson.dumps(["cancelled", log_name])


def _asked_key(log_name: str, where: str | None) -> bytes:
    return orjson.dumps(["asked", log_name, where])


class SnapshotLedger:
    """The tables whose snapshot the log holds complete, loaded from and written to ``topic``; and the
    progress of the reads under way beside the stream (:attr:`reads`: records keyed ``["read", name]``,
    written with each chunk, a tombstone with the read's last); and the tables whose read was cancelled
    (:attr:`cancelled`: records keyed ``["cancelled", name]``, a tombstone when one is asked for again)."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.entries: dict[str, LedgerEntry] = {}
        self.reads: dict[str, ReadProgress] = {}
        #: tables whose read was cancelled (``cdc snapshot --cancel``), by log name: left out of capture
        self.cancelled: set[str] = set()
        #: reads ``cdc snapshot`` asked for and that have not ended, as (log name, the condition of a partial
        #: one or ``None`` for a whole one), in the order asked (records keyed ``["asked", name, where]``,
        #: see :meth:`asked_record`)
        self.asked: dict[tuple[str, str | None], None] = {}

    @classmethod
    def load(cls, log: Log, topic: str) -> SnapshotLedger:
        """The ledger as the log holds it (created empty, as a compacted topic, when missing)."""
        ledger = cls(topic)
        if topic not in log.topics():
            log.ensure_topic(topic, 1, compacted=True)
            return ledger
        partition = TopicPartition(topic, 0)
        offset = log.start_offset(partition)
        while batch := log.read(partition, offset):
            for record in batch:
                if record.key is None:
                    continue
                name = orjson.loads(record.key)
                if isinstance(name, list) and name[0] == "cancelled":
                    (ledger.cancelled.add if record.value is not None else ledger.cancelled.discard)(str(name[1]))
                    continue
                if isinstance(name, list) and name[0] == "asked":
                    asked = (str(name[1]), None if name[2] is None else str(name[2]))
                    if record.value is None:
                        ledger.asked.pop(asked, None)
                    else:
                        ledger.asked[asked] = None
                    continue
                if isinstance(name, list):  # ["read", name]: a read's progress
                    ledger._load_progress(str(name[1]), record.value)
                    continue
                if record.value is None:
                    ledger.entries.pop(name, None)
                else:
                    value = orjson.loads(record.value)
                    ledger.entries[name] = LedgerEntry(
                        int(value["relid"]), int(value["lsn"]), value.get("membership"), value.get("columns")
                    )
            offset = batch[-1].offset + 1
        return ledger

    def _load_progress(self, name: str, value: bytes | None) -> None:
        if value is None:
            self.reads.pop(name, None)
            return
        data = orjson.loads(value)
        key = data.get("key")
        self.reads[name] = ReadProgress(
            int(data["relid"]), str(data["topic"]), int(data["boundary"]), tuple(key) if key is not None else None,
            int(data["rows"]), str(data["fingerprint"]),
            tuple((int(b), tuple(k) if k is not None else None) for b, k in data.get("earlier", ())),
            data.get("where"),
        )  # fmt: skip

    def progress_record(self, shape: TableShape, progress: ReadProgress, ts_ms: int | None = None) -> ProducerRecord:
        """The record of a read's ``progress`` (append it with the chunk it counts)."""
        value: dict[str, object] = {
            "relid": progress.relid,
            "topic": progress.topic,
            "boundary": progress.boundary,
            "key": list(progress.key) if progress.key is not None else None,
            "rows": progress.rows,
            "fingerprint": progress.fingerprint,
            "earlier": [[b, list(k) if k is not None else None] for b, k in progress.earlier],
        }
        if progress.condition is not None:
            value["where"] = progress.condition
        return self._record(_progress_key(shape.log_name), orjson.dumps(value), ts_ms)

    def progress_done(self, shape: TableShape, ts_ms: int | None = None) -> ProducerRecord:
        """The tombstone of a read's progress (append it with the read's last chunk)."""
        self.reads.pop(shape.log_name, None)
        return self._record(_progress_key(shape.log_name), None, ts_ms)

    def _record(self, key: bytes, value: bytes | None, ts_ms: int | None) -> ProducerRecord:
        """A record of the ledger's topic, stamped ``ts_ms`` (the records of one group share one), else now."""
        return ProducerRecord(self.topic, key, value, time.time_ns() // 1_000_000 if ts_ms is None else ts_ms)

    def covers(
        self,
        name: str,
        relid: int,
        membership: str | None = None,
        columns: str | None = None,
    ) -> bool:
        """Whether the log holds a complete snapshot of this table under this log name.

        A table recreated under the same name (new OID) or renamed (new topic) is not covered, nor one
        whose publication ``membership`` changed since its snapshot (removed from the publication and
        added back, a partition attached or detached), nor one given a column since whose existing
        rows may hold values no change event carried (``columns``, see
        :func:`cdc.capture.catalog.columns_filled_since`; a column whose values for older rows the stream
        carries, :mod:`cdc.capture.stored_defaults`, is none), nor one whose events are keyed by other
        columns since (:func:`cdc.capture.catalog.key_changed`). ``None`` (the stream's question) skips a test,
        and so does an entry without column marks (written by an earlier version, until :meth:`note_columns`).
        Nor is a table with a read under way (a progress record: its truncate markers are in the log) or
        whose read was cancelled, whatever its entry says.
        """
        entry = self.entries.get(name)
        if entry is None or entry.relid != relid or name in self.cancelled or name in self.reads:
            return False  # a read under way (its progress record) already superseded the table's records
        if columns is not None and entry.columns is not None and columns_filled_since(entry.columns, columns, relid):
            return False
        if columns is not None and entry.columns is not None and key_changed(entry.columns, columns):
            return False  # the log holds rows under keys no later event names (cdc.capture.key_marks)
        return membership is None or entry.membership is None or entry.membership == membership

    def progress_gone(self, name: str, ts_ms: int | None = None) -> ProducerRecord:
        """The tombstone of the progress of a read of ``name`` that is over without its last chunk: its
        table left the capture, or its holding file is gone (a read that starts over writes new ones)."""
        self.reads.pop(name, None)
        return self._record(_progress_key(name), None, ts_ms)

    def cancel_record(self, name: str, ts_ms: int | None = None) -> list[ProducerRecord]:
        """The records of a cancelled read of the table ``name`` (append them in a group of their own): its
        progress tombstone and a ``["cancelled", name]`` record. The table's log holds what the read wrote
        after its truncate markers, not the rest: capture writes none of its changes from then on (a
        partial row of a key the log lacks would break promise 4) and takes no snapshot of it, until
        ``cdc snapshot`` asks for it again (:meth:`read_requested`)."""
        self.cancelled.add(name)
        asked = self.asked_done(name, None, ts_ms)
        return [self.progress_gone(name, ts_ms), self._record(_cancelled_key(name), b"{}", ts_ms), *asked]

    def asked_record(self, name: str, where: str | None, ts_ms: int | None = None) -> ProducerRecord:
        """The record of a read ``cdc snapshot`` asked for (``where``: a partial read's condition), written
        in the group of the transaction that carried the request: a capture that stops before the read
        ends finds it when it starts again, and reads the table again (:meth:`read_again`) or in part."""
        self.asked[(name, where)] = None
        return self._record(_asked_key(name, where), orjson.dumps({"where": where}), ts_ms)

    def asked_done(self, name: str, condition: str | None, ts_ms: int | None = None) -> list[ProducerRecord]:
        """The tombstones of the requests for reads of ``name`` that a read ending now serves: a whole read
        (``condition`` ``None``) serves them all, a partial read those with its own condition."""
        done = [asked for asked in self.asked if asked[0] == name and (condition is None or asked[1] == condition)]
        for asked in done:
            del self.asked[asked]
        return [self._record(_asked_key(*asked), None, ts_ms) for asked in done]

    def read_requested(self, name: str, ts_ms: int | None = None) -> list[ProducerRecord]:
        """``cdc snapshot`` asks for a cancelled table again: the tombstone of its cancellation (none when
        it was not cancelled)."""
        if name not in self.cancelled:
            return []
        self.cancelled.discard(name)
        return [self._record(_cancelled_key(name), None, ts_ms)]

    def read_again(self, name: str) -> bool:
        """The table is to be read again (``cdc snapshot``): the ledger covers it no more (no OID matches
        0), but its entry keeps saying under which column list and row filter the log's records were
        written, so the read supersedes them with truncate markers alone, without a tombstone for every
        key the topic holds (reading them all back is what made a read's first chunk slow). Whether the
        ledger covered it until now."""
        entry = self.entries.get(name)
        if entry is None or entry.relid == 0:
            return False
        self.entries[name] = dataclasses.replace(entry, relid=0)
        return True

    def note_columns(self, name: str, columns: str) -> None:
        """Judge later columns of a table the ledger covers against ``columns``, its marks now (in memory:
        a restart judges them against the marks its snapshot recorded, which can only take one snapshot
        too many). A column added since without values for the existing rows then stays unjudged when it
        gets a default later, and an entry written without marks gets them."""
        entry = self.entries.get(name)
        if entry is not None:
            self.entries[name] = dataclasses.replace(entry, columns=columns)

    def record(self, shape: TableShape, lsn: int, rows: int, ts_ms: int, table: PublishedTable | None = None) -> ProducerRecord:
        """The ledger record of a snapshot of ``shape`` as of ``lsn`` (append it with the last rows);
        ``table``: the table as published when the snapshot was taken, whose membership and column marks
        the record keeps."""
        value: dict[str, object] = {
            "schema": shape.schema,
            "table": shape.table,
            "topic": shape.topic,
            "relid": shape.relid,
            "lsn": lsn,
            "rows": rows,
        }
        if table is not None:
            value["membership"] = table.membership
            value["columns"] = table.columns
        return self._record(orjson.dumps(shape.log_name), orjson.dumps(value), ts_ms)

    def add(self, shapes: Iterable[TableShape], lsn: int, tables: dict[int, PublishedTable] | None = None) -> None:
        """Note snapshots whose group is durable (a recreated table replaces its old entry); ``tables``:
        by OID, the tables as published when the snapshot was taken."""
        for shape in shapes:
            table = (tables or {}).get(shape.relid)
            self.entries[shape.log_name] = LedgerEntry(
                shape.relid, lsn, table.membership if table else None, table.columns if table else None
            )


@dataclass
class TableGate:
    """Decides whether a table's change events of one transaction may enter the log.

    Yes when the ledger covers the table; when a snapshot taken at boundary B waits to be written
    (``holds``), only for transactions committing at or after B; otherwise no, and the table is noted
    in ``wanted`` (OID -> qualified name) so that capture snapshots it next.
    """

    ledger: SnapshotLedger
    holds: dict[int, int] = field(default_factory=dict)
    wanted: dict[int, str] = field(default_factory=dict)

    def admits(self, shape: TableShape, commit_lsn: int) -> bool:
        if self.ledger.covers(shape.log_name, shape.relid):
            return True
        if shape.log_name in self.ledger.cancelled:
            return False
        boundary = self.holds.get(shape.relid)
        if boundary is not None:
            return commit_lsn >= boundary
        self.wanted[shape.relid] = shape.qualified
        return False


@dataclass(frozen=True)
class PartialRead:
    """A request to read again the rows of a table that ``condition`` selects (:mod:`cdc.capture.read_conditions`,
    as checked SQL), past the key ``after`` (``None``: from the first; a read that stopped early goes on
    from its last key), ``rows`` of them already read."""

    condition: str
    after: tuple[str, ...] | None = None
    rows: int = 0
    #: the shape's fingerprint (hex) ``after`` was read in: a read in another shape starts from the first key
    fingerprint: str = ""


@dataclass
class PendingSnapshot:
    """Tables read in a snapshot taken at ``boundary``, waiting for the stream to reach it."""

    boundary: Lsn
    tables: list[PublishedTable]
    reader: SnapshotReader
    started: float = field(default_factory=time.monotonic)
    #: by OID, the tables of which only some rows are read (``cdc snapshot --where``), and what to read
    partial: dict[int, PartialRead] = field(default_factory=dict)
    #: reads (:mod:`cdc.capture.online_read`) that use the snapshot: it closes with the last
    users: int = 0

    def release(self) -> None:
        """One read of the snapshot ended: close it when it was the last."""
        self.users -= 1
        if self.users <= 0:
            self.close()

    @property
    def as_of(self) -> Lsn:
        """The position the snapshot's rows are as of: every transaction committing before the boundary."""
        return Lsn(self.boundary - 1)

    def close(self) -> None:
        self.reader.close()


def take_snapshot(url: str, slot: str, tables: list[PublishedTable]) -> PendingSnapshot:
    """A snapshot for ``tables`` at the consistent point of a new temporary slot named ``slot``.

    The slot is gone when this returns (it is temporary and its connection is closed); the snapshot
    lives on in the returned reader's transaction.
    """
    with ReplicationConnection(url) as repl:
        try:
            created = repl.create_slot(slot, export_snapshot=True, temporary=True)
        except SourceError as exc:
            raise type(exc)(
                f"{exc}; snapshotting a table added to the publication needs one free replication slot and "
                "WAL sender for a moment (raise max_replication_slots or max_wal_senders if they are used up)"
            ) from None
        reader = SnapshotReader(url, created.snapshot_name or "")
    return PendingSnapshot(created.consistent_point, tables, reader)
