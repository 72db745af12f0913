"""Tables that join the capture mid-stream: a snapshot taken beside the stream, and the ledger.

**The ledger.** The compacted topic ``<prefix>.__snapshots`` holds one record per table whose snapshot
the log holds complete (key: the table's log name as a JSON string, ``"<schema>.<table>"`` for plain
names, see :mod:`log_store.topic_names`; value ``{"schema", "table", "topic",
"relid", "lsn", "rows", "membership", "columns"}``, the last two as the catalog described the table when
it was snapshotted, see :class:`~cdc.capture.published_tables.PublishedTable`). It is written in the same group as the
snapshot's last rows, so after a crash either both are in the log or neither. A table's change events enter the log only once the
ledger names it (or its snapshot is under way, below): :class:`TableGate` is what the replayer asks.

**A table added to the publication** (or recreated, or captured by a log without a ledger entry for it,
or added back after it left the publication, or published via a root that gained or lost a partition,
or given a column whose existing rows hold values no change event carried and a rewrite wrote: ``ADD
COLUMN`` with a volatile default, an identity or a domain with a constraint, see
:func:`cdc.capture.column_marks.columns_filled_since`; a constant default is carried by the schema record
instead, :mod:`cdc.capture.added_column_fills`) is
snapshotted the way PostgreSQL's own logical replication synchronises a table added to a subscription:

1. Capture notices a published, included table the ledger does not cover: at the start of every
   replication session, every few seconds while idle, right after a batch in which a table's columns
   changed, and when the stream carries a change of a table the ledger does not name (that change is
   held back, see 3).
2. A plain REPEATABLE READ transaction exports a snapshot (:func:`take_snapshot`), which the reader's
   sessions import. Its boundary B is the stream's reach when it is taken: every transaction committing
   before B was received, so the snapshot sees it (a snapshot in which such a transaction is not yet
   visible, PostgreSQL's moment between the commit record and visibility, is refused and taken again).
   No replication slot is made, so nothing waits for the transactions running on the server: a
   session left idle in a transaction delays neither the read nor the stream.
3. The table's changes committing before B are dropped (the snapshot holds their effect). From B on
   they are held, each marked with the first of the read's snapshots that sees its transaction, judged
   by transaction ID (:mod:`cdc.capture.visibility`): a transaction committing at or after B may still
   be in the snapshot (it committed in the moment before it was taken). The table's rows are written
   in chunks beside the stream (:mod:`cdc.capture.reads.online_read`), ``op=r`` with ``source.lsn`` B - 1,
   preceded by truncate markers when the topic already holds records (they supersede what an earlier
   capture of the table left); the last chunk waits until the stream has passed the WAL's end at the
   snapshot (every transaction it sees is then received and judged), and is followed by the held changes
   the rows lack and the ledger record. From then on every change of the table is written.

Why no change is lost or doubled: every change of the table belongs to one transaction. If it commits
before B it is in the snapshot and never written from the stream; if at or after B, it is written after
the rows unless the snapshot that read its key sees it (then the row holds it). Before the table's
snapshot exists no change of it is written at all, so nothing older can precede the rows. A crash
before the group is durable leaves neither rows nor ledger record; the next session takes a new
snapshot at a later point, and the changes the first attempt dropped are older than that point too.

Why not the watermark algorithm of DBLog (Debezium's incremental snapshot): a chunk row whose key
changes inside the watermark window is dropped in favour of the streamed event, and that event can be
a partial row (an update leaving a TOAST value unchanged carries no value for it), so the log would hold
a partial row with no full row before it (promise 4); and a transaction whose commit record precedes
the low watermark may not yet be visible to the chunk's query. Here every read row precedes every change
of its key that the log gets from the stream, and each change is judged against the snapshot itself.

Costs and requirements: a snapshot held for a few seconds at most (a read by key goes on from a new
one every ``read_snapshot_seconds``; a read by block ranges keeps one to its end), with its xmin and the
ACCESS SHARE lock of the tables it reads (DDL never waits for it: :mod:`cdc.capture.reads.online_read`).
Privileges: SELECT on the table, as for the initial snapshot; a table created after the capture role was
set up needs its own ``GRANT SELECT`` (or ``ALTER DEFAULT PRIVILEGES ... GRANT SELECT ON TABLES``), else
capture stops with a :class:`~cdc.capture.errors.PrivilegeError` naming the grant.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import orjson
import psycopg

from cdc.capture.catalog import SESSION_OPTIONS, wal_end_sql
from cdc.capture.column_marks import columns_filled_since, key_changed
from cdc.capture.errors import SourceError
from cdc.capture.lsn import Lsn
from cdc.capture.published_tables import PublishedTable
from cdc.capture.snapshot import SnapshotReader
from cdc.capture.tables import TableShape
from cdc.capture.visibility import ReceivedXids, SnapshotXids
from log_store import ProducerRecord, TopicPartition

if TYPE_CHECKING:
    from log_store.log import Log

log = logging.getLogger("cdc.capture")


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One snapshotted table: its OID, publication membership and column marks when snapshotted (see
    :class:`~cdc.capture.published_tables.PublishedTable`), the LSN its rows are as of."""

    relid: int
    lsn: int
    membership: str | None = None
    columns: str | None = None


@dataclass(frozen=True, slots=True)
class ReadProgress:
    """A read beside the stream (:mod:`cdc.capture.reads.online_read`) as far as the log holds it: the table's
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
    #: the runs whose snapshot may see a transaction the log does not hold yet
    #: (:meth:`~cdc.capture.reads.held_changes.HeldChanges.recent`)
    snapshots: tuple[tuple[int, str, int], ...] = ()
    #: the holding file's lasting caps (:attr:`~cdc.capture.reads.held_changes.HeldChanges.lasting_caps`)
    caps: tuple[tuple[int, int], ...] = ()


def _progress_key(log_name: str) -> bytes:
    return orjson.dumps(["read", log_name])


def _cancelled_key(log_name: str) -> bytes:
    return orjson.dumps(["cancelled", log_name])


def _asked_key(log_name: str, where: str | None) -> bytes:
    return orjson.dumps(["asked", log_name, where])


#: the key of the record naming the source's timeline the log's positions are on (:mod:`cdc.capture.timelines`)
_TIMELINE_KEY = orjson.dumps(["timeline"])


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
        #: the source's timeline the log's positions are on, as last recorded (:mod:`cdc.capture.timelines`)
        self.timeline: int | None = None

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
                if record.key == _TIMELINE_KEY:
                    ledger.timeline = int(orjson.loads(record.value)["timeline"]) if record.value is not None else None
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
            tuple((int(r), str(t), int(e)) for r, t, e in data.get("snapshots", ())),
            tuple((int(o), int(r)) for o, r in data.get("caps", ())),
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
        if progress.snapshots:
            value["snapshots"] = [list(entry) for entry in progress.snapshots]
        if progress.caps:
            value["caps"] = [list(cap) for cap in progress.caps]
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
        :func:`cdc.capture.column_marks.columns_filled_since`; a column whose values for older rows the stream
        carries, :mod:`cdc.capture.added_column_fills`, is none), nor one whose events are keyed by other
        columns since (:func:`cdc.capture.column_marks.key_changed`). ``None`` (the stream's question) skips a test,
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

    def timeline_record(self, timeline: int, ts_ms: int | None = None) -> ProducerRecord:
        """The record saying the log's positions from its group on are on the source's ``timeline``."""
        self.timeline = timeline
        return self._record(_TIMELINE_KEY, orjson.dumps({"timeline": timeline}), ts_ms)

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
    """A request to read again the rows of a table that ``condition`` selects (:mod:`cdc.capture.reads.read_conditions`,
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
    #: which transactions the snapshot sees (:mod:`cdc.capture.visibility`)
    xids: SnapshotXids = SnapshotXids(0, 0)
    #: the WAL's end when it was taken: every transaction it sees commits before it
    wal_end: Lsn = Lsn(0)
    started: float = field(default_factory=time.monotonic)
    #: by OID, the tables of which only some rows are read (``cdc snapshot --where``), and what to read
    partial: dict[int, PartialRead] = field(default_factory=dict)
    #: reads (:mod:`cdc.capture.reads.online_read`) that use the snapshot: it closes with the last
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


#: one statement of the exporting transaction: the snapshot's name, its transaction IDs, and how many of
#: the IDs it holds in progress have committed already (their commit record is written, PostgreSQL has
#: not yet made them visible: the stream may have sent them)
_EXPORT = (
    "SELECT pg_export_snapshot(), pg_current_snapshot()::text, "
    "(SELECT count(*) FROM pg_snapshot_xip(pg_current_snapshot()) AS x WHERE pg_xact_status(x) = 'committed'), "
    f"{wal_end_sql('pg_current_wal_insert_lsn()')}::text, current_setting('wal_block_size')::int"
)

#: the sizes of a WAL page's header: a page's first record starts after it (the first page of a segment has
#: the long one), and the insert position PostgreSQL reports at a page's start already points past it
_PAGE_HEADERS = (24, 40)


def _record_end(insert: Lsn, page: int) -> Lsn:
    """Where the last record written before ``insert`` (the reported insert position) ends: the stream
    reports positions as record ends, so an insert position just past a page's header is the page's start."""
    return Lsn(insert - insert % page) if insert % page in _PAGE_HEADERS else insert


def take_snapshot(
    url: str, tables: list[PublishedTable], boundary: Lsn, received: ReceivedXids | None = None, sessions: int = 2
) -> PendingSnapshot | None:
    """A snapshot for ``tables`` that sees every transaction committing before ``boundary``, or ``None``
    when it cannot be had at once (take it again on a later pass).

    ``boundary``: the stream's reach (every transaction committing before it was received; ``received``
    their IDs). A plain REPEATABLE READ transaction exports the snapshot, which the reader's sessions
    import; nothing waits for any other transaction (a replication slot made for the purpose would wait
    for every transaction holding an ID). Each received transaction has its commit record written, so
    it is visible to the snapshot unless PostgreSQL has not made it visible yet (a moment, or a
    synchronous standby's answer): a snapshot that does not see one of them is refused, and taken again
    (:class:`~cdc.capture.visibility.ReceivedXids`). A process that received nothing yet (it starts, and
    its holding files hold what an earlier one received) refuses a snapshot holding, as in progress, an
    ID that has committed. The transactions
    at or after the boundary are judged by ID against the snapshot (:class:`SnapshotXids`): those it sees
    are in its rows, the others come after them (:mod:`cdc.capture.reads.online_read`). ``sessions``: how many
    sessions import it (each reads chunks of its own, :class:`~cdc.capture.snapshot.SnapshotReader`).
    """
    try:
        conn = psycopg.connect(url, options=SESSION_OPTIONS, client_encoding="UTF8", autocommit=False)
    except psycopg.OperationalError as exc:
        raise SourceError(f"cannot connect for a table's snapshot: {str(exc).strip().splitlines()[0]}") from None
    reader: SnapshotReader | None = None
    try:
        with conn:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            row = conn.execute(_EXPORT).fetchone()
            assert row is not None
            name, xids, committed = str(row[0]), SnapshotXids.parse(str(row[1])), int(row[2])  # type: ignore[call-overload]
            wal_end = _record_end(Lsn.parse(str(row[3])), int(row[4]))  # type: ignore[call-overload]
            if received.unseen_by(xids) if received else committed:
                log.info("a transaction that committed is not visible yet to a new snapshot; it is taken again")
                conn.rollback()
                return None
            reader = SnapshotReader(url, name, sessions)  # imported while the exporting transaction is open
            conn.rollback()
    except psycopg.Error as exc:  # the server went away (a restart, a failover): capture reconnects
        if reader is not None:
            reader.close()
        raise SourceError(f"a table's snapshot failed: {str(exc).strip().splitlines()[0]}") from exc
    return PendingSnapshot(boundary, tables, reader, xids, wal_end)
