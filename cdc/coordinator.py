"""The capture loop: streaming from the slot exactly once into the log, and the tables read beside it.

Guarantees and restart rules:

* **Positions.** The log's watermark position P (``%016X``) means: every transaction whose commit LSN
  is <= P is in the log, and no later one. A group of transactions has as P the end of its last
  transaction's commit record minus one (no transaction commits inside a commit record), so the slot
  is confirmed at exactly P + 1. A position the server reports (the consistent point C of a new slot,
  the WAL end E of a keepalive) is where the *next* record may start, and a transaction committing
  exactly there is not yet included, so it is recorded as C - 1 or E - 1 (commit records start on
  8-byte boundaries, so no transaction commits at C - 1). Without this a transaction whose commit
  record starts exactly at C or E would be skipped as already held.
* **Durable before confirmed** and **whole transactions**: a flush position is sent to PostgreSQL only
  after the log fsynced (or Kafka committed) every transaction up to it, and a source transaction is
  never split across groups; several share one group (one fsync) for throughput. The decisions are
  :mod:`cdc.capture.stream_core`'s, tested without I/O; this module carries them out.
* **A slot that does not continue the log** (confirmed past P + 1: recreated by ``cdc setup`` after it
  was lost, or advanced by another client) never streamed what committed in between; capture then
  takes a new snapshot, which supersedes the log's rows (below), instead of leaving that gap.
* **Idempotent restart.** On start the log's watermark position P is read; the slot resends from its
  confirmed position, which may be behind P after a crash between the fsync and the confirmation, and
  every transaction whose commit LSN <= P is skipped. Relation messages of skipped transactions still
  update the relation cache (the server resends what each transaction needs).
* **A new log.** No watermark (or the position ``0000000000000000``): :mod:`cdc.capture.initial_snapshot` makes
  the slot anew and the log begins at its consistent point minus one; every captured table is then read
  beside the stream as a table that joins later is (below), resumable past its last durable chunk.
* **Tables that join later.** A published table the ledger (``<prefix>.__snapshots``) does not name
  gets no change event until its snapshot is in the log: :mod:`cdc.capture.table_snapshots` takes a plain
  snapshot at the stream's reach B (no slot, nothing waited for) and drops the table's changes committed
  before B; once every
  transaction before B is in the log, :mod:`cdc.capture.reads.online_read` writes its rows in chunks beside the
  stream, holding the table's own later changes until the last chunk is in the log.
* **Heartbeats.** When the captured tables are idle but the server's WAL moves, an empty group moves the
  position to the server's reported end (minus one) and the slot is confirmed there, so WAL does not
  pile up.
* **Stop.** On a stop request the current batch is flushed and confirmed; an open transaction is left
  to the slot, which resends it next time. ``once`` drains up to the WAL position current at start.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

from cdc.capture.capture_topics import CaptureTopics
from cdc.capture.catalog import Catalog, PublishedTable
from cdc.capture.discovery import captured_tables, snapshot_new_tables
from cdc.capture.errors import ConfigError, PrerequisiteError, PrivilegeError, SlotError, SourceError
from cdc.capture.events import EventBuilder
from cdc.capture.gc_tuning import relaxed_gc
from cdc.capture.group_writer import GroupWriter
from cdc.capture.initial_snapshot import begin_log, take_initial_snapshot
from cdc.capture.lsn import Lsn
from cdc.capture.pgoutput.messages import LogicalMessage
from cdc.capture.reads.held_changes import HeldChanges
from cdc.capture.reads.online_read import OnlineRead, held_path, keyset_keys, progress_plan, run_keep
from cdc.capture.reads.partial_reads import PartialRequests, flush_records, going_on
from cdc.capture.reads.read_conditions import checked_condition
from cdc.capture.reads.read_throttle import ReadThrottle
from cdc.capture.reads.snapshot_requests import SnapshotRequest
from cdc.capture.slot_continuity import require_continuity, slot_skipped_ahead
from cdc.capture.snapshot_writer import KeysetPlan, SnapshotWriter, SnapshotWritten, published_shape
from cdc.capture.stream_core import (
    AppendGroup,
    Command,
    Discover,
    Finish,
    Heartbeat,
    Retarget,
    SendStatus,
    Skip,
    StreamCore,
    StreamTuning,
    WriteSnapshot,
)
from cdc.capture.streaming import ChangeReplayer, Transaction, TransactionAssembler
from cdc.capture.table_snapshots import PartialRead, PendingSnapshot, ReadProgress, SnapshotLedger, TableGate
from cdc.capture.tables import TableShape
from cdc.capture.transport import Keepalive, ReplicationConnection, XLogData, decode_frame
from cdc.capture.visibility import ReceivedXids
from cdc.data_dir import secure_data_dir
from cdc.failover import slot_failover
from cdc.log_backend import open_log
from cdc.metrics import CaptureMetrics
from cdc.settings import Settings
from cdc.source_checks import capture_problems
from cdc.storage_errors import capture_storage_error
from log_store import ProducerRecord
from log_store.errors import StorageIOError
from log_store.log import Log

log = logging.getLogger("cdc.capture")


@dataclass(frozen=True)
class Tuning(StreamTuning):
    """Batching and timing knobs of capture: the streaming loop's (:class:`StreamTuning`) and the snapshot's,
    reconnection's and memory's (defaults suit the benchmarks and the tests)."""

    #: rows per chunk of every read (``None``: ``CDC_SNAPSHOT_CHUNK_ROWS``; see :data:`cdc.capture.snapshot.AHEAD`
    #: for the measured trade-off)
    snapshot_chunk_rows: int | None = None
    snapshot_group_chunks: int = 10  # chunks per group of the initial snapshot (one fsync each)
    reconnect_seconds: float = 120.0
    memory_limit: int = 8 << 20
    #: how often, at most, capture looks for sessions waiting for a lock a read holds (between chunks)
    lock_check_seconds: float = 0.05
    #: how long a read waits for its table's lock, at its start and in each chunk's query
    read_lock_timeout_ms: int = 200
    #: how long a read by key reads from one snapshot before it goes on from a new one (xmin held at most that)
    read_snapshot_seconds: float = 2.0


@dataclass
class CaptureStats:
    """What one run did."""

    snapshot_rows: int = 0
    tables_added: int = 0
    transactions: int = 0
    skipped: int = 0
    events: int = 0
    groups: int = 0
    reconnects: int = 0
    #: new snapshots taken because the slot did not continue the log (:mod:`cdc.capture.slot_continuity`)
    resnapshots: int = 0
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


def _lasting_caps(held: HeldChanges) -> tuple[tuple[int, int], ...]:
    return tuple(held.lasting_caps)


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, SourceError) and not isinstance(exc, (SlotError, PrivilegeError, PrerequisiteError))


class Capture:
    """One capture run over one log (which it opens as the single writer)."""

    def __init__(
        self,
        settings: Settings,
        *,
        once: bool = False,
        stop: threading.Event | None = None,
        tuning: Tuning | None = None,
        progress: bool | None = None,
        metrics: CaptureMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics or CaptureMetrics()
        self.once = once
        self.stop = stop or threading.Event()
        self.tuning = tuning or Tuning()
        self.progress = sys.stderr.isatty() if progress is None else progress
        self.stats = CaptureStats()
        self.catalog = Catalog(settings.database_url, publication=settings.publication, mask_key=settings.mask_key_bytes)
        self.log: Log | None = None
        #: the streaming decisions: what the log holds, what the server was told, waiting table snapshots
        self.core: StreamCore[Transaction, PendingSnapshot] = StreamCore(self.tuning, Lsn(0))
        self.topics: CaptureTopics | None = None
        # CDC_TABLES entries are plain identifiers with one dot between schema and table
        self._included = {tuple(name.split(".", 1)) for name in settings.tables}
        self.builder: EventBuilder | None = None
        self.replayer: ChangeReplayer | None = None
        self.ledger = SnapshotLedger("")
        self.gate = TableGate(self.ledger)
        self.writer: SnapshotWriter | None = None
        self.groups: GroupWriter | None = None
        self._shape_changed = False  # a table's columns changed in the stream since the last discovery
        self._table_of_topic: dict[str, tuple[str, str]] = {}  # from the schema topic
        self._read_back_warned: set[str] = set()  # tables warned of once: their partial updates are read back
        self._failover = False  # the slot a snapshot makes is a failover slot (cdc.failover)
        self.reads: list[OnlineRead] = []  # tables read beside the stream, in the order they began
        self._turn = 0  # the read whose chunk came last
        #: by OID: reads an earlier run left under way (their progress, their held changes), to resume
        self.resumes: dict[int, tuple[ReadProgress, HeldChanges]] = {}
        self._resume_snapshotted: set[int] = set()  # resumes whose new snapshot waits for the stream
        self._resume_due = False  # a read was suspended in this run: discover (take its new snapshot) next
        self._next_lock_check = 0.0
        self._throttle = ReadThrottle(settings.snapshot_rows_per_second)
        self._received = ReceivedXids()  # transactions the stream received, that a new snapshot must see
        self._next_wal_nudge = 0.0  # when a read's end may next make the server flush its WAL
        self._waiting_since: float | None = None  # since when a read's end waits for the stream
        self._label_floor = 0  # the highest position a snapshot's rows were labelled with (see _discover)
        self._first_reads: set[int] = set()  # tables a new log reads first: not counted as tables added
        self._resumes_over: list[tuple[str, HeldChanges]] = []  # resumes started over: files to delete
        self._cancels: list[str] = []  # tables whose read a request in the group being written cancels
        self.partial = PartialRequests()  # partial reads asked for, not begun (cdc.capture.reads.partial_reads)
        self._reshaped: list[OnlineRead] = []  # partial reads to stop after the group being written
        #: partial reads stopped with their session: (read, its progress), flushed when the next one begins
        self._parked: list[tuple[OnlineRead, ReadProgress | None]] = []

    @property
    def position(self) -> Lsn:
        """Every transaction committed at or before it is in the log, and no later one."""
        return self.core.position

    @position.setter
    def position(self, value: Lsn) -> None:
        self.core.position = value

    @property
    def confirmed(self) -> Lsn:
        """The position confirmed to the slot: everything before it is durable in the log."""
        return self.core.confirmed

    # -- set-up --------------------------------------------------------------------------------------

    def include(self, schema: str, table: str) -> bool:
        """Whether a published table is captured (``CDC_TABLES`` empty: all of the publication)."""
        return not self._included or (schema, table) in self._included

    def _new_shape(self, shape: TableShape) -> None:
        """A table's columns changed in the stream (or its first event is written): its topic must exist,
        and the next discovery (right after this batch) checks whether existing rows gained values
        without change events that the log does not carry, as a rewriting ``ADD COLUMN`` gives them, so
        that the table is read again (a constant default's value is carried by the schema record, see
        :mod:`cdc.capture.stored_defaults`)."""
        assert self.topics is not None
        self.topics.ensure(shape)
        self._shape_changed = True
        # a read holds its table's lock from the check of its columns on (OnlineRead), so a shape of its
        # own is the one it reads: only another one (met in the stream first) starts it over
        fingerprint = shape.fingerprint()
        reading = [
            read for read in self.reads
            if shape.relid == read.relid and not read.abandoned and read.shape.fingerprint() != fingerprint
        ]  # fmt: skip
        # a partial read stops once this group is in the log, its held changes written, and goes on in the
        # new shape (cdc.capture.reads.partial_reads); a whole read starts over
        self._reshaped += [read for read in reading if read.condition is not None]
        whole = [read for read in reading if read.condition is None]
        if whole:
            self._abandon(whole, f"the columns of {shape.qualified} changed")

    def _database_name(self) -> str:
        return self.settings.database_url.rsplit("/", 1)[-1].split("?", 1)[0]

    def run(self) -> CaptureStats:
        """Snapshot when needed, then stream until stopped (or, with ``once``, until drained).

        A source capture cannot work with (wal_level, REPLICATION, publication, ``CDC_TABLES``) is refused
        first, with ``cdc setup``'s fixes, before the log or the slot is touched.

        A file operation of the log that the operating system refuses (a full disk, permission bits, a
        file where the data directory belongs) stops the run with one :class:`StorageError` saying what
        the source was told: nothing the log did not fsync, so the next run loses nothing.
        """
        problems = capture_problems(self.settings)
        if problems:
            raise PrerequisiteError(problems)
        self._failover = slot_failover(self.settings)
        try:
            return self._run_while_kafka_fails()
        except StorageIOError as exc:
            self.metrics.errors.labels(kind="StorageError").inc()
            position = None if self.log is None else self.position
            raise capture_storage_error(exc, self.settings.data_dir, position) from exc

    def _run_while_kafka_fails(self) -> CaptureStats:
        """:meth:`_run`, run again after a pause each time the log's Kafka brokers fail (continuous capture only).

        A failed group was aborted and nothing past the last committed one was confirmed, so a new run
        (the log reopened, its watermark read, the slot streamed from its confirmed position) loses and
        doubles nothing: it is a restart of capture in process. One warning line per attempt; the pause
        doubles from 1 s to 30 s. ``once`` fails at once instead, as does an error a restart cannot cure
        (another capture of the prefix took over, a refused login or permission, a record too large).
        """
        from log_store.kafka.log import KafkaLogError

        pause = 1.0
        while True:
            try:
                return self._run()
            except KafkaLogError as exc:
                if self.once or not exc.retriable:
                    raise
                self.metrics.errors.labels(kind="KafkaLogError").inc()
                log.warning(
                    "%s; capture starts again in %.0f s (nothing is confirmed to the source past LSN %s)",
                    exc,
                    pause,
                    Lsn(self.position + 1) if self.position else Lsn(0),
                )
                if self.stop.wait(pause):
                    return self.stats
                pause = min(pause * 2, 30.0)

    def _run(self) -> CaptureStats:
        secure_data_dir(self.settings.data_dir)
        with open_log(self.settings, writer=True) as store:
            self.log = store
            self.topics = topics = CaptureTopics(store, self.settings.partitions)
            self.builder = EventBuilder(
                prefix=self.settings.topic_prefix,
                database=self._database_name(),
                partitions=self.settings.partitions,
                partitions_of=topics.partitions_of,
            )
            # Kafka's compaction cannot fold a partial row onto the key's earlier one: write whole rows
            self.builder.whole_rows = self.settings.uses_kafka
            topics.warn_of_kept_partition_counts(
                self.settings.topic_prefix, {self.builder.schema_topic, self.builder.ledger_topic}
            )
            self.ledger = SnapshotLedger.load(store, self.builder.ledger_topic)
            self.gate = TableGate(self.ledger)
            emitted, self._table_of_topic = topics.emitted_schemas(self.builder.schema_topic)
            self.replayer = ChangeReplayer(
                self.builder,
                self.catalog,
                self.settings.topic_for,
                self.include,
                emitted,
                on_new_shape=self._new_shape,
                gate=self.gate,
            )
            self.replayer.on_message = self._requested
            chunk_rows = self.tuning.snapshot_chunk_rows or self.settings.snapshot_chunk_rows
            self.writer = SnapshotWriter(
                store, self.builder, self.replayer, self.ledger,
                partial(published_shape, self.catalog, self.settings.topic_for), topics.ensure,
                chunk_rows, self.progress, chunk_rows,
            )  # fmt: skip
            self.groups = GroupWriter(store, self.replayer, self._read_back_warned, abandon=self._abandon_topics)
            watermark = store.latest_watermark()
            self.position = Lsn.from_hex16(watermark.position) if watermark else Lsn(0)
            self._label_floor = int(self.position)
            try:
                url, slot = self.settings.database_url, self.settings.slot
                if self.position == 0:
                    self._begin_log()
                elif slot_skipped_ahead(url, slot, self.position):
                    self.stats.resnapshots += 1
                    self._snapshot()
                    if not self.stop.is_set():
                        self._forget_reads()
                if not self.stop.is_set():
                    self._reopen_reads()
                    self._stream_with_reconnect()
            finally:
                self._drop_table_snapshots()
                self._close_resumes()
                self._parked.clear()  # the next run writes their held changes, from their progress records
                self.catalog.close()
        return self.stats

    # -- snapshot ------------------------------------------------------------------------------------

    def _begin_log(self) -> None:
        """A log without a position begins where the slot is (:func:`~cdc.capture.initial_snapshot.begin_log`);
        every captured table is then read beside the stream, as a table that joins later is. Rows an older
        version's interrupted snapshot left are labelled with that slot's position: reads wait for the
        stream to move past it (:meth:`_discover`), so that their truncate markers order after them."""
        assert self.log is not None and self.writer is not None
        tables = captured_tables(self.catalog, self.settings.publication, self.include)
        captured = {self.writer.shape_of(table).topic for table in tables}
        self.position = begin_log(
            self.settings.database_url, self.settings.slot, self.log, self.writer,
            captured=captured, uncaptured=self._table_of_topic, failover=self._failover,
        )  # fmt: skip
        if not self._table_of_topic:  # no row is labelled yet: the reads may be as of the slot's position
            self._label_floor = 0
        self._first_reads = {table.relid for table in tables}
        self.core.confirmed = Lsn(self.position + 1)  # where the slot is: nothing before it is asked for

    def _snapshot(self) -> None:
        """Take a new snapshot of every captured table from a new slot (:mod:`cdc.capture.initial_snapshot`), the
        slot having skipped changes the log lacks."""
        assert self.writer is not None
        tables = captured_tables(self.catalog, self.settings.publication, self.include)
        taken = take_initial_snapshot(
            self.settings.database_url, self.settings.slot, tables, self.writer,
            uncaptured=self._table_of_topic, group_chunks=self.tuning.snapshot_group_chunks,
            stopped=self.stop.is_set, failover=self._failover,
        )  # fmt: skip
        if taken is not None:
            self.position, written = taken
            self._count_snapshot(written)

    def _count_snapshot(self, written: SnapshotWritten) -> None:
        self.stats.snapshot_rows += written.rows
        self.stats.groups += written.groups
        self.metrics.group_durable(written.events, written.value_bytes, 0, int(self.confirmed), None)

    # -- streaming -----------------------------------------------------------------------------------

    def _stream_with_reconnect(self) -> None:
        """:meth:`_stream`, opened again after a lost connection: one warning line per attempt, pauses
        growing from 0.2 s to 5 s, for at most ``reconnect_seconds``. A multi-host ``CDC_DATABASE_URL``
        (``host=a,b`` with ``target_session_attrs=primary``) reaches whichever server is primary then, so
        after a failover capture resumes from the promoted standby's synced slot
        (:mod:`cdc.capture.slot_continuity` says why nothing is written twice or out of order)."""
        retrying = Retrying(
            retry=retry_if_exception(_retryable),
            wait=wait_exponential(multiplier=0.2, max=5),
            stop=stop_after_delay(self.tuning.reconnect_seconds),
            reraise=True,
            before_sleep=lambda state: log.warning(
                "reconnecting after: %s (attempt %d, next in %.1f s, for up to %.0f s)",
                state.outcome.exception() if state.outcome else "?",
                state.attempt_number,
                state.next_action.sleep if state.next_action else 0.0,
                self.tuning.reconnect_seconds,
            ),
        )
        for attempt in retrying:
            with attempt:
                if attempt.retry_state.attempt_number > 1:
                    self.stats.reconnects += 1
                    self.metrics.reconnects.inc()
                with relaxed_gc():
                    self._stream()

    def _stream(self) -> None:
        """One replication session, its decisions taken by :attr:`core` (:mod:`cdc.capture.stream_core`); returns
        when stopped or drained, raises on connection loss (complete transactions are appended first,
        without confirming them: the next session skips them as the log's)."""
        core = self.core
        with ReplicationConnection(self.settings.database_url) as repl:
            repl.identify_system()
            require_continuity(self.settings.database_url, self.settings.slot, self.position)
            if self.once and core.target is None:
                core.drain_to(self.catalog.wal_insert_position(), time.monotonic() + self.catalog.async_commit_delay())
            # Snapshots that waited when the last session ended are taken again at a new point, and
            # reads under way go on from new ones; the slot sends again what the log does not hold.
            self._drop_table_snapshots()
            self._flush_parked()
            for _, held in self.resumes.values():
                held.cut_to(self.position)
            self._discover()
            repl.start(self.settings.slot, Lsn(0), self.settings.publication)
            assembler = TransactionAssembler(self.tuning.memory_limit)
            core.begin_session(time.monotonic())
            try:
                while True:
                    frames = repl.read_raw(core.read_timeout())
                    self._receive(frames, assembler, repl)
                    pass_ = core.tick(
                        time.monotonic(), got_frames=bool(frames), stop=self.stop.is_set(),
                        assembler_idle=assembler.idle, wants_discovery=self._wants_discovery,
                    )  # fmt: skip
                    if self._carry_out(pass_, repl):
                        return
                    if self.reads:
                        self._read_chunk()
            except SourceError as exc:
                self.metrics.errors.labels(kind=type(exc).__name__).inc()
                group = core.take_pending()
                if group:
                    self._append(group)  # not confirmed: the connection is gone, the next session skips it
                raise
            finally:
                for tx in core.take_pending():
                    tx.close()
                assembler.reset()

    def _receive(self, frames: list[bytes | memoryview], assembler: TransactionAssembler, repl: ReplicationConnection) -> None:
        """Feed one read's frames to the assembler, and each whole transaction and keepalive to :attr:`core`."""
        core, take = self.core, assembler.take
        index = 0
        while True:
            index = take(frames, index)  # changes of the open transaction, kept as bytes until its commit
            if index >= len(frames):
                return
            frame = decode_frame(frames[index])
            index += 1
            if isinstance(frame, XLogData):
                # Only keepalives and commits move the server's end: an XLogData header inside a
                # streamed block does not promise that earlier commits were all sent.
                tx = assembler.feed(frame.payload, frame.data_start)
                if tx is not None:
                    self._received.add(tx.xid)
                    self._carry_out(core.committed(tx, time.monotonic()), repl)
            elif isinstance(frame, Keepalive):
                self.metrics.wal_bytes_behind.set(max(0, frame.wal_end - core.confirmed))
                self._carry_out(core.keepalive(frame.wal_end, frame.reply_requested, time.monotonic()), repl)

    def _carry_out(self, commands: Iterable[Command[Transaction, PendingSnapshot]], repl: ReplicationConnection) -> bool:
        """Carry out :attr:`core`'s commands in order; whether the session is finished."""
        for command in commands:
            match command:
                case AppendGroup(transactions=group):
                    self._send(self._append(group), repl)
                case Skip(transaction=tx):
                    self.stats.skipped += 1
                    assert self.replayer is not None
                    self.replayer.replay_relations(tx)
                case SendStatus():
                    self._send(command, repl)
                case WriteSnapshot(snapshot=pending):
                    self._start_read(pending)
                case Heartbeat(end=end):
                    self._heartbeat(end, repl)
                case Discover():
                    self._shape_changed = self._resume_due = False
                    self._discover()
                case Retarget():
                    self.core.retarget(self.catalog.wal_flush_position())
                case Finish(flushed=flushed):
                    repl.send_status(flushed, flushed)
                    repl.finish()
                    return True
        return False

    @staticmethod
    def _send(status: SendStatus, repl: ReplicationConnection) -> None:
        repl.send_status(status.flushed, status.flushed, reply=status.reply)

    def _wants_discovery(self) -> bool:
        """Whether a discovery is due now: a table's change met the gate, a table's columns changed, or a
        read waits for a new snapshot. Tables waiting for their turn to be read (``gate.wanted``) wait
        for a read to end first, so that a new log's tables do not make every pass look at the catalog."""
        wanted = bool(self.gate.wanted) and self._room() > 0
        return wanted or self._shape_changed or self._resume_due

    def _room(self) -> int:
        """How many more reads may begin: ``CDC_SNAPSHOT_CONCURRENCY`` less those under way or waiting for the stream."""
        waiting = sum(len(p.tables) for p in self.core.waiting)
        return self.settings.snapshot_concurrency - len(self.reads) - waiting

    # -- tables added mid-stream (see cdc.capture.table_snapshots) ---------------------------------------------

    def _discover(self) -> None:
        """Take a snapshot of the tables that need one (:mod:`cdc.capture.discovery`), read when the stream reaches it.

        A read's rows are as of its boundary minus one, which must lie past every position a snapshot's
        rows were labelled with before (the log's position at the start, the reads begun since): rows
        labelled alike would not order after those. While the stream has not moved past it, the snapshot
        waits (the server is asked where its WAL ends, and to flush it)."""
        boundary = Lsn(max(self.core.server_end, self.position + 1))
        if boundary - 1 <= self._label_floor:
            self.core.want_end = max(self.core.want_end, self._label_floor + 2)
            self._resume_due = True
            now = time.monotonic()
            if now >= self._next_wal_nudge:
                self._next_wal_nudge = now + 1.0
                self.catalog.flush_wal()
            return
        resuming = set(self.resumes) - self._resume_snapshotted
        busy = {read.shape.log_name for read in self.reads} | {t.log_name for p in self.core.waiting for t in p.tables}
        in_part = {read.shape.log_name for read in self.reads if read.condition is not None} | {
            t.log_name for p in self.core.waiting for t in p.tables if t.relid in p.partial
        }
        pending = snapshot_new_tables(
            self.catalog, self.settings.database_url, self.settings.publication, self.include, self.ledger, self.gate,
            boundary=boundary, resuming=resuming,
            partial=self.partial.due(busy), read_in_part=in_part, received=self._received, room=self._room(),
            sessions=self.settings.snapshot_sessions,
        )  # fmt: skip
        if pending is not None:
            for table in pending.tables:  # the runs that resume reads: their held records are all older
                if (resume := self.resumes.get(table.relid)) is not None:
                    resume[1].run_started(len(resume[0].earlier) + 1, pending.xids, taken_now=True, wal_end=pending.wal_end)
            self.partial.taken(pending)
            self.stats.tables_added += sum(
                t.relid not in pending.partial and t.relid not in resuming and t.relid not in self._first_reads
                for t in pending.tables
            )
            self._first_reads -= {t.relid for t in pending.tables}
            self._resume_snapshotted |= {t.relid for t in pending.tables}
            self.core.waiting.append(pending)
        if resuming - self._resume_snapshotted:
            self._drop_resumes_left_out()

    def _drop_resumes_left_out(self) -> None:
        """Reads to resume whose table capture no longer takes (it left the publication or ``CDC_TABLES``)
        are over: their holding files go, and their progress records get tombstones, so that
        ``cdc snapshot --status`` and ``cdc lag`` stop listing them."""
        assert self.log is not None and self.groups is not None
        taken = {t.relid for t in self.catalog.published_tables(self.settings.publication) if self.include(t.schema, t.table)}
        records: list[ProducerRecord] = []
        for relid in [relid for relid in self.resumes if relid not in taken]:
            progress, held = self.resumes.pop(relid)
            self.groups.held.pop(progress.topic, None)
            self.gate.holds.pop(relid, None)
            held.discard()
            name = next((name for name, read in self.ledger.reads.items() if read.relid == relid), None)
            if name is not None:
                records.append(self.ledger.progress_gone(name))
            log.info("the read of %s is over: its table is no longer captured", progress.topic)
        if records:
            self.log.append_group(records, self.position.hex16())

    def _requested(self, message: LogicalMessage, commit_ts_ms: int) -> list[ProducerRecord]:
        """A ``cdc snapshot`` request (:mod:`cdc.capture.reads.snapshot_requests`) in a transaction being written:
        its tables' ledger entries are forgotten, so the discovery after this group reads them again (a
        partial read's table is read in part instead, :mod:`cdc.capture.reads.partial_reads`). The records to
        write in the same group: the ledger's note of each request taken (a capture that stops before
        the read ends finds it when it starts again), and the tombstone of a cancellation it lifts."""
        request = SnapshotRequest.parse(message.content)
        if request is None:
            return []
        if request.where is not None:
            try:
                return self._partial_requested(request, commit_ts_ms, Lsn(message.lsn))
            except SourceError:
                raise  # the connection to the source: the group is not confirmed, the slot sends it again
            except Exception:  # a request must never stop capture: any role may send one
                log.exception("ignored a request at %s to read %s in part", Lsn(message.lsn), request.tables)
                return []
        records: list[ProducerRecord] = []
        for name in request.tables:
            uncancelled = self.ledger.read_requested(name)
            if self.ledger.read_again(name) or uncancelled:
                self._drop_partial(name)
                records += [*uncancelled, self.ledger.asked_record(name, None)]
                self._shape_changed = True
                self.stats.reads_requested += 1
                log.info("%s is read again, as asked at %s", name, Lsn(message.lsn))
        self._cancels += request.cancel
        return records

    def _drop_partial(self, name: str) -> None:
        """A whole read of ``name`` is asked for: its partial reads, asked for, waiting or under way, give way
        to it (one under way ends at once, its held changes deleted: the whole read's snapshot, taken
        later, holds their effect, and the gate drops the table's changes until then)."""
        self.partial.drop(name)
        for pending in list(self.core.waiting):
            for relid in [t.relid for t in pending.tables if t.log_name == name and t.relid in pending.partial]:
                self._unwait(relid)
        partial = [read for read in self.reads if read.shape.log_name == name and read.condition is not None]
        self._abandon(partial, "a whole read was asked for")

    def _partial_requested(self, request: SnapshotRequest, commit_ts_ms: int, lsn: Lsn) -> list[ProducerRecord]:
        """A partial read asked for (``cdc snapshot --where``): queued when ``CDC_REQUEST_KEY`` signed it and
        its condition passes the checks again here; any other is logged and ignored."""
        if not request.signed_by(self.settings.request_key_bytes, commit_ts_ms):
            log.warning(
                "ignored a request at %s to read a table in part: it is not signed with CDC_REQUEST_KEY, or more than "
                "five minutes passed between signing and sending it", lsn,
            )  # fmt: skip
            return []
        published = {t.log_name: t for t in self.catalog.published_tables(self.settings.publication)}
        table = published.get(request.tables[0]) if len(request.tables) == 1 else None
        if table is None or not self.include(table.schema, table.table) or request.where is None:
            log.warning("ignored a request at %s to read %s in part: capture does not read it", lsn, request.tables)
            return []
        if not self.ledger.covers(table.log_name, table.relid):
            log.warning(
                "ignored a request at %s to read %s in part: a whole read of it is under way or due (it holds those rows), "
                "or its read was cancelled (`cdc snapshot %s` reads it whole)", lsn, table.log_name, table.log_name,
            )  # fmt: skip
            return []
        try:
            condition = checked_condition(request.where, table, self.catalog)
        except ConfigError as exc:
            log.warning("ignored a request at %s to read %s in part: %s", lsn, table.log_name, exc)
            return []
        self.partial.ask(table.log_name, PartialRead(condition.sql))
        self._resume_due = True
        self.stats.reads_requested += 1
        log.info("the rows of %s where %s are read again, as asked at %s", table.log_name, condition.sql, lsn)
        return [self.ledger.asked_record(table.log_name, condition.sql)]

    def _cancel_reads(self) -> None:
        """Carry out the cancellations of the group just written (:mod:`cdc.capture.reads.snapshot_requests`):
        each read of a named table, under way, waiting for its snapshot or due, stops; its held changes
        and its progress go, and the ledger records the table as left out
        (:meth:`~cdc.capture.table_snapshots.SnapshotLedger.cancel_record`), in a group of their own."""
        assert self.log is not None
        names, self._cancels = self._cancels, []
        records: list[ProducerRecord] = []
        published = {t.log_name: t.relid for t in self.catalog.published_tables(self.settings.publication)} if names else {}
        for name in names:
            relid = published.get(name)
            if relid is not None and self._cancel_partial(name, relid):
                records += self.ledger.asked_done(name, None)
                continue
            if relid is None or self.ledger.covers(name, relid):
                log.info("no read of %s under way or due: nothing to cancel", name)
                continue
            for read in [read for read in self.reads if read.relid == relid]:
                self._end_read(read)
            resume = self.resumes.pop(relid, None)
            if resume is not None:
                self.groups.held.pop(resume[0].topic, None)  # type: ignore[union-attr]
                resume[1].discard()
            self._resume_snapshotted.discard(relid)
            self._unwait(relid)
            self.gate.holds.pop(relid, None)
            self.gate.wanted.pop(relid, None)
            records += self.ledger.cancel_record(name)
            self.stats.reads_cancelled += 1
            log.info("the read of %s is cancelled: its changes are left out until `cdc snapshot %s`", name, name)
        if records:
            self.log.append_group(records, self.position.hex16())
        self.core.reading = bool(self.reads)

    def _cancel_partial(self, name: str, relid: int) -> bool:
        """Stop the partial reads of ``name`` (asked for, waiting or under way: one under way writes its held
        changes first); whether there was one. The table stays captured: the log holds all of it."""
        if not self.ledger.covers(name, relid):
            return False
        asked = self.partial.drop(name)
        waiting = any(relid in pending.partial for pending in self.core.waiting)
        self._unwait(relid)
        reading = [read for read in self.reads if read.relid == relid and read.condition is not None]
        for read in reading:  # its request's tombstone goes with its held changes
            self._end_read(read, flush=True, done=self.ledger.asked_done(name, None))
        if asked or waiting or reading:
            self.stats.reads_cancelled += 1
            log.info("the partial read of %s is cancelled", name)
        return asked or waiting or bool(reading)

    def _forget_reads(self) -> None:
        """A new snapshot of every table is in the log: the reads an earlier run left under way are over
        (their held changes are older than its rows, and would overwrite newer values): their progress
        records get tombstones and their holding files go."""
        assert self.log is not None
        gone = [self.ledger.progress_gone(name) for name in list(self.ledger.reads)]
        held_dir = self.settings.data_dir / "held"
        for path in held_dir.glob(f"{self.settings.slot}-*.held") if held_dir.exists() else ():
            path.unlink(missing_ok=True)
        if gone:
            self.log.append_group(gone, self.position.hex16())

    def _reopen_reads(self) -> None:
        """Find the reads an earlier run left under way (a progress record in the ledger and its holding
        file): their held changes are kept (cut to the log's position) and the gate holds their tables'
        changes from their first boundary on, until a new snapshot resumes them. Other holding files of
        this slot are deleted (their reads start over). A partial read's held changes go to the log now,
        and it goes on as a new partial read (:mod:`cdc.capture.reads.partial_reads`). A read ``cdc snapshot``
        asked for that has not ended (the ledger's note of it) is asked for again."""
        assert self.groups is not None
        assert self.log is not None
        held_dir = self.settings.data_dir / "held"
        kept: set[Path] = set()
        gone = []
        for name, progress in list(self.ledger.reads.items()):
            path = held_path(held_dir, self.settings.slot, progress.relid)
            if progress.relid in self.resumes:
                continue
            if progress.condition is not None:
                self._flush_held(name, progress, path)
                continue
            if not path.exists():
                gone.append(self.ledger.progress_gone(name))
                continue
            held = HeldChanges.reopen(path, self.position, next_run=len(progress.earlier) + 1)
            if held.truncated:  # the read starts over (Capture._start_truncated_over)
                held.discard()
                gone.append(self.ledger.progress_gone(name))
                continue
            held.remember(progress.snapshots, progress.caps)
            kept.add(path)
            self.resumes[progress.relid] = (progress, held)
            self.gate.holds[progress.relid] = progress.boundary
            self.groups.held[progress.topic] = held
            log.info("resuming the read of %s after %d rows", progress.topic, progress.rows)
        for path in held_dir.glob(f"{self.settings.slot}-*.held") if held_dir.exists() else ():
            if path not in kept:
                path.unlink(missing_ok=True)
        if gone:
            self.log.append_group(gone, self.position.hex16())
        for name, where in self.ledger.asked:  # asked for by `cdc snapshot`, not ended
            if where is None:
                self.ledger.read_again(name)
            elif not self.partial.holds(name, where):  # (the read that goes on from its progress is that one)
                self.partial.ask(name, PartialRead(where))

    def _flush_held(self, name: str, progress: ReadProgress, path: Path) -> None:
        """A partial read an earlier run or session left (its progress record, its holding file at ``path``):
        its held changes go to the log now, and it goes on past its last key (:mod:`cdc.capture.reads.partial_reads`)."""
        assert self.log is not None and progress.condition is not None
        held = HeldChanges.reopen(path, self.position) if path.exists() else HeldChanges(path)
        self.log.append_group(flush_records(held, self.ledger, name, self.position), self.position.hex16())
        held.discard()
        self.partial.first(name, going_on(progress, progress.condition, progress.rows))
        log.info("the partial read of %s goes on after %d rows", progress.topic, progress.rows)

    def _flush_parked(self) -> None:
        """The partial reads the last session stopped: their held changes go to the log, before any group of
        this session, and they go on (:meth:`_flush_held`)."""
        parked, self._parked = self._parked, []
        for read, progress in parked:
            self._flush_held(read.shape.log_name, progress or read.initial_progress(), read.held.path)

    def _start_read(self, pending: PendingSnapshot) -> None:
        """The stream reached ``pending``'s boundary: each of its tables is read beside the stream
        (:mod:`cdc.capture.reads.online_read`), with the membership and columns read before the snapshot was
        taken, never later ones (which could include a partition attached after the snapshot, whose
        rows it does not hold). A table an earlier run began reading resumes past its last durable key."""
        assert self.writer is not None and self.groups is not None
        self._label_floor = max(self._label_floor, int(pending.as_of))
        self.core.snapshot_durable(pending.as_of)
        held_dir = self.settings.data_dir / "held"
        for table in pending.tables:
            shape = self.writer.shape_of(table)
            why = pending.reader.hold(shape, partial(self.catalog.relation_state, table.relid), self.tuning.read_lock_timeout_ms)
            self._resume_snapshotted.discard(table.relid)
            if why is not None:
                self._read_later(table, why, pending)
                continue
            keys = keyset_keys(shape, self.catalog.table(table.relid).primary_key)
            wanted = pending.partial.get(table.relid)
            if wanted is not None:
                self._start_partial(pending, table, shape, keys, wanted)
                continue
            self.partial.drop(table.log_name)  # a whole read holds every row a partial one would
            resume = self.resumes.pop(table.relid, None)
            plan = progress_plan(resume[0] if resume else None, keys, shape, pending.boundary)
            if resume is not None and plan is not None and plan.after is not None:
                held = resume[1]
            else:  # from the first key: the new snapshot sees every change held so far
                if resume is not None:
                    resume[1].discard()
                    self.groups.held.pop(resume[0].topic, None)
                    resume = None
                held = HeldChanges(held_path(held_dir, self.settings.slot, table.relid))
            keep = run_keep(shape, keys, tuple(last for _, last in plan.earlier) if plan is not None else ())
            read = OnlineRead.start(pending, table, self.writer, held, plan, keep, resume[0] if resume else None)
            read.parts.may_finish = partial(self._stream_reached, pending.wal_end)
            read.parts.recent_snapshots = partial(self._recent_snapshots, held)
            read.parts.held_caps = partial(_lasting_caps, held)
            self.reads.append(read)
            self.groups.held[read.topic] = held
            log.info(
                "reading %s as of %s beside the stream%s", table.qualified, pending.as_of,
                f", resumed after {read.resumed_rows} rows" if read.resumed_after is not None else "",
            )  # fmt: skip
        if pending.users == 0:
            pending.close()
        self.core.reading = bool(self.reads)

    def _recent_snapshots(self, held: HeldChanges) -> tuple[tuple[int, str, int], ...]:
        """The runs of a read whose snapshot may see a transaction the log does not hold yet."""
        return held.recent(self.position)

    def _stream_reached(self, end: Lsn) -> bool:
        """Whether the stream received, and wrote or held, every transaction committing before ``end`` (the
        WAL's end when a read's snapshot was taken: the transactions it sees). Until then a read's last rows wait, so that
        each of those transactions is judged against the read's snapshots (held, or dropped as already in
        the rows) rather than written after them again; the server is asked where its WAL ends meanwhile."""
        now = time.monotonic()
        if self.core.server_end >= end:
            self._waiting_since = None
            return not self.core.pending  # received, and each of them past the group writer
        self.core.want_end = max(self.core.want_end, end)
        self._waiting_since = self._waiting_since or now
        if now - self._waiting_since >= 0.5 and now >= self._next_wal_nudge:
            # the server sends only flushed WAL, and what lies before ``end`` (hint bits' page images, say)
            # may stay unflushed on an idle server: a transaction that takes an ID flushes it with its commit
            self._next_wal_nudge = now + 1.0
            self.catalog.flush_wal()
        return False

    def _start_partial(
        self,
        pending: PendingSnapshot,
        table: PublishedTable,
        shape: TableShape,
        keys: tuple[str, ...] | None,
        wanted: PartialRead,
    ) -> None:
        """Begin the partial read ``wanted`` of ``table`` in ``pending``'s snapshot (:mod:`cdc.capture.reads.partial_reads`):
        by key past ``wanted.after`` when it was read in the same shape, else from the first row."""
        assert self.writer is not None and self.groups is not None and self.log is not None
        try:  # the columns the publication publishes may have changed since it was asked for
            checked_condition(wanted.condition, table, self.catalog)
        except ConfigError as exc:
            log.warning("the partial read of %s is not done: %s", table.log_name, exc)
            done = self.ledger.asked_done(table.log_name, wanted.condition)
            if done:
                self.log.append_group(done, self.position.hex16())
            return
        plan = None
        if keys is not None:
            same = wanted.after is not None and wanted.fingerprint == shape.fingerprint().hex()
            plan = KeysetPlan(keys, wanted.after if same else None, wanted.rows if same else 0, pending.boundary)
        held = HeldChanges(held_path(self.settings.data_dir / "held", self.settings.slot, table.relid))
        read = OnlineRead.start(pending, table, self.writer, held, plan, None, condition=wanted.condition)
        # its progress is in the log before any change of the table is held: a kill -9 at any moment leaves
        # a record that makes the next run write what the holding file holds
        self.log.append_group([self.ledger.progress_record(shape, read.initial_progress())], self.position.hex16())
        self.reads.append(read)
        self.groups.held[read.topic] = held
        self.groups.folded.add(read.topic)  # the log holds a full row of every key: never abandoned for one
        log.info("reading the rows of %s where %s as of %s beside the stream", table.qualified, wanted.condition, pending.as_of)

    def _read_later(self, table: PublishedTable, why: str, pending: PendingSnapshot) -> None:
        """``table`` cannot be read in the snapshot that reached the stream (:meth:`SnapshotReader.hold`
        says why): a read that resumes waits for the next discovery's snapshot; one that had not begun
        starts then (the gate drops the table's changes until that snapshot, which holds their effect;
        a partial read's are written all along)."""
        self.stats.reads_yielded += 1
        self._resume_due = True
        wanted = pending.partial.get(table.relid)
        if wanted is not None:
            self.partial.first(table.log_name, wanted)
        elif table.relid not in self.resumes:
            self.gate.holds.pop(table.relid, None)
            self.gate.wanted[table.relid] = table.qualified
        log.info("the read of %s waits for a new snapshot: %s", table.qualified, why)

    def _give_way_to_locks(self) -> bool:
        """Suspend every read whose snapshot holds a lock another session waits for (``ALTER TABLE``,
        ``TRUNCATE`` of a table read, or a session queued behind them); whether any was.

        A read's snapshot transaction keeps the ``ACCESS SHARE`` lock of each table it read until it ends,
        and the application's writers queue behind DDL that waits for it. Checked between chunks, at most
        every ``lock_check_seconds``; the DDL then waits about one chunk's time."""
        now = time.monotonic()
        if now < self._next_lock_check:
            return False
        self._next_lock_check = now + self.tuning.lock_check_seconds
        snapshots = {pid: read.pending for read in self.reads for pid in read.pending.reader.pids}
        blocking = {id(snapshots[pid]) for pid in self.catalog.blocking(list(snapshots))}
        for read in [read for read in self.reads if id(read.pending) in blocking and not read.parts.finishing]:
            self.stats.reads_yielded += 1
            self._suspend(read, "another session waits for a lock it holds")
        return bool(blocking)

    def _renew_snapshots(self) -> bool:
        """Suspend every read by key whose snapshot is ``read_snapshot_seconds`` old and that has a durable
        key to go on from (:meth:`_suspend`): it goes on past it from a new snapshot, taken at once
        (no slot, nothing waited for: :func:`~cdc.capture.table_snapshots.take_snapshot`). So no snapshot
        of a read holds the server's xmin horizon (what VACUUM may remove) for longer than that and a
        chunk. A read by block ranges keeps its one snapshot to the end (it could not go on from another).
        Whether any was suspended."""
        now = time.monotonic()
        old = [
            read
            for read in self.reads
            if read.progress is not None
            and not read.parts.finishing
            and now - read.pending.started >= self.tuning.read_snapshot_seconds
        ]
        for read in old:
            self.stats.snapshots_renewed += 1
            self._suspend(read, f"its snapshot is {now - read.pending.started:.1f} s old", renewal=True)
        return bool(old)

    def _suspend(self, read: OnlineRead, why: str, *, renewal: bool = False) -> None:
        """Stop ``read`` and release its snapshot: a read by key goes on from its last durable key with a
        new snapshot at a later point, as after a restart (:func:`~cdc.capture.reads.online_read.run_keep`),
        its held changes kept; a read by block ranges, or one that wrote no rows yet, starts over. A partial
        read writes its held changes now and goes on as a new one (:mod:`cdc.capture.reads.partial_reads`)."""
        progress = read.progress
        if read.condition is not None:
            self._stop_partial(read, why)
        elif progress is None:
            self._abandon([read], why)
            self._end_read(read)
        else:
            self.reads.remove(read)
            read.suspend()
            self.resumes[read.relid] = (progress, read.held)
            self.ledger.reads[read.shape.log_name] = progress
            self._resume_snapshotted.discard(read.relid)
            self.core.reading = bool(self.reads)
            log.log(
                logging.DEBUG if renewal else logging.INFO,
                "the read of %s stops after %d rows and goes on from a new snapshot: %s", read.topic, read.rows, why,
            )  # fmt: skip
        self._resume_due = True

    def _stop_partial(self, read: OnlineRead, why: str, *, park: bool = False) -> None:
        """Stop the partial read ``read`` early (:mod:`cdc.capture.reads.partial_reads`): its held changes go to the
        log and it goes on from a new snapshot past its last durable key. ``park``: its session is ending
        (maybe because the log failed): nothing is written now; the next session writes them first
        (:meth:`_flush_parked`), or the next run does, from the progress record in the log."""
        progress = read.parts.progress or read.initial_progress()
        if park:
            self._detach(read)
            read.suspend()
            read.held.close()
            self._parked.append((read, progress))
        else:
            self._end_read(read, flush=True)
            self.partial.first(read.shape.log_name, going_on(progress, read.condition or "", read.rows))
        self._resume_due = True
        log.info("the partial read of %s stops after %d rows and goes on from a new snapshot: %s", read.topic, read.rows, why)

    def _read_chunk(self) -> None:
        """Append the next chunk of one of the first ``CDC_SNAPSHOT_CONCURRENCY`` reads, each in turn,
        unless the reads gave way to a lock (:meth:`_give_way_to_locks`). A partial read whose condition
        fails on a row (``1 / n`` with ``n = 0``, a cast of a text that is no number) ends there, its held
        changes written and its request forgotten: asked again, it would fail again."""
        assert self.writer is not None
        if self._give_way_to_locks() or self._renew_snapshots() or not self.reads:
            return
        now = time.monotonic()
        self.core.throttled = not self._throttle.allows(now)
        if self.core.throttled:
            self.stats.reads_throttled += 1
            return
        running = self.reads[: self.settings.snapshot_concurrency]
        self._turn = (self._turn + 1) % len(running)
        read = running[self._turn]
        try:
            rows = read.parts.written.events  # rows this run read (a resumed run's earlier rows aside)
            finished = read.next_chunk(self.writer, self.position.hex16())
            self._throttle.took(read.parts.written.events - rows, now)
            if not finished and read.parts.finishing:
                self.core.throttled = True  # the last part waits for the stream: wait for frames, not spin
        except SourceError as exc:
            sqlstate = str(getattr(exc.__cause__, "sqlstate", None) or "")
            if read.condition is None or sqlstate[:2] not in ("22", "42"):
                raise
            log.error("the partial read of %s ends: its condition failed on a row: %s", read.shape.log_name, exc)
            done = self.ledger.asked_done(read.shape.log_name, read.condition)
            self._end_read(read, flush=True, done=done)
            return
        if finished:
            self._finish(read)

    def _finish(self, read: OnlineRead) -> None:
        """``read``'s last part (rows, held records, ledger record) is in the log: its table's changes go
        straight to the log from now on."""
        self._end_read(read)
        if read.condition is not None:
            self._resume_due = True  # a whole read of the table may wait for it to end (discovery)
        written = read.parts.written
        written.events += read.held.handed_out  # the held changes its last group wrote are events too
        written.value_bytes += read.held.handed_out_bytes
        self._count_snapshot(written)
        self.stats.held_changes += read.held.count
        self.stats.reads_resumed += read.resumed_after is not None
        log.info(
            "snapshot of %s written: %d rows as of %s in %d groups, %d changes held during the read",
            read.table.qualified, written.rows, read.pending.as_of, written.groups, read.held.count,
        )  # fmt: skip

    def _end_read(self, read: OnlineRead, *, flush: bool = False, done: list[ProducerRecord] | None = None) -> None:
        """Forget ``read`` (finished or abandoned): its holding file is deleted, the gate holds its table no
        more. ``flush``: a partial read that stops early writes its held changes first, in a group of their
        own, with ``done`` (its request's tombstone, when it ends for good)."""
        assert self.log is not None
        if flush:
            read.parts.close()
            records = flush_records(read.held, self.ledger, read.shape.log_name, self.position, done or ())
            self.log.append_group(records, self.position.hex16())
        self._detach(read)
        read.close()
        self.core.reading = bool(self.reads)

    def _detach(self, read: OnlineRead) -> None:
        """Take ``read`` out of the reads under way: its table's records go straight to the log again."""
        assert self.groups is not None
        if read in self.reads:
            self.reads.remove(read)
        self.groups.held.pop(read.topic, None)
        self.groups.folded.discard(read.topic)
        self.gate.holds.pop(read.relid, None)
        self.core.reading = bool(self.reads)

    def _abandon_topics(self, topics: set[str]) -> None:
        """The group being written needs rows of these held topics the log may not hold yet: read their tables again."""
        why = "an update changed a key and left TOAST values unchanged"
        reading = [read for read in self.reads if read.topic in topics and not read.abandoned]
        self._abandon(reading, why)
        for relid, (progress, held) in list(self.resumes.items()):
            if progress.topic in topics:
                self._resume_over(relid, progress, held, why)

    def _unwait(self, relid: int) -> None:
        """Take a table out of the snapshots waiting to be read (one left with no table is released)."""
        for pending in list(self.core.waiting):
            pending.tables = [table for table in pending.tables if table.relid != relid]
            pending.partial.pop(relid, None)
            if not pending.tables:
                self.core.waiting.remove(pending)
                pending.close()

    def _resume_over(self, relid: int, progress: ReadProgress, held: HeldChanges, why: str) -> None:
        """A read waiting to be resumed starts over instead (its held records would hold a row the log
        may lack): as :meth:`_abandon`, and no snapshot already taken to resume it is read."""
        del self.resumes[relid]
        self._resume_snapshotted.discard(relid)
        self._resumes_over.append((progress.topic, held))  # deleted once the group being written is done
        self._unwait(relid)
        self.gate.holds.pop(relid, None)
        self.gate.wanted[relid] = progress.topic
        self.stats.reads_abandoned += 1
        log.info("the read of %s starts again from a new snapshot: %s", progress.topic, why)

    def _abandon(self, reads: list[OnlineRead], why: str) -> None:
        """Stop ``reads`` at once: the gate refuses their tables' changes from here on (the next discovery
        takes a new snapshot); their files go once the group being written is done (:meth:`_reap`)."""
        for read in reads:
            read.abandoned = True
            if read.condition is not None:  # its held changes are not all in the log: read the whole table
                self.ledger.read_again(read.shape.log_name)
            self.gate.holds.pop(read.relid, None)
            self.gate.wanted[read.relid] = read.table.qualified
            self.stats.reads_abandoned += 1
            log.info("the read of %s starts again from a new snapshot: %s", read.table.qualified, why)

    def _reap(self) -> None:
        for read in [read for read in self.reads if read.abandoned]:
            self._end_read(read)
        assert self.groups is not None
        for topic, held in self._resumes_over:
            self.groups.held.pop(topic, None)
            held.discard()
        self._resumes_over.clear()

    def _drop_table_snapshots(self) -> None:
        """Forget waiting snapshots (their tables are found again by the next discovery) and suspend the
        reads by key under way (:meth:`_suspend`): with reads an earlier run left, they are resumed from
        new snapshots; the others start over."""
        for pending in self.core.waiting:
            self.partial.put_back(pending)
            pending.close()
        self.core.waiting.clear()
        for read in list(self.reads):
            if read.condition is not None:
                self._stop_partial(read, "the replication session ended", park=True)
            elif read.progress is None:
                self._end_read(read)
            else:
                self._suspend(read, "the replication session ended")
        self._resume_snapshotted.clear()
        self.gate.holds = {relid: boundary for relid, boundary in self.gate.holds.items() if relid in self.resumes}

    def _close_resumes(self) -> None:
        """Close the holding files of reads not finished: the next run resumes them (:meth:`_reopen_reads`)."""
        for _, held in self.resumes.values():
            held.close()
        self.resumes.clear()

    # -- groups --------------------------------------------------------------------------------------

    def _append(self, group: list[Transaction]) -> SendStatus:
        """Append ``group`` as one group (:mod:`cdc.capture.group_writer`); the status that confirms it, to send."""
        assert self.groups is not None
        try:
            written = self.groups.append(group)
        finally:
            self._reap()
        self._start_truncated_over()
        status = self.core.group_durable(group)
        reshaped, self._reshaped = self._reshaped, []
        for read in [read for read in reshaped if read in self.reads]:
            self._stop_partial(read, f"the columns of {read.shape.qualified} changed")
        if self._cancels:
            self._cancel_reads()
        self.stats.events += written.events
        self.stats.groups += 1
        self.stats.transactions += len(group)
        last = group[-1].commit_ts_ms
        self.metrics.group_durable(written.events, written.value_bytes, len(group), status.flushed, last)
        return status

    def _start_truncated_over(self) -> None:
        """Reads whose table a group just truncated start over from a new snapshot: the rows read before
        the ``TRUNCATE`` and those read after it could not both stand beside one truncate marker."""
        why = "its table was truncated"
        truncated = [read for read in self.reads if read.held.truncated and read.condition is None and not read.abandoned]
        if truncated:
            self._abandon(truncated, why)
            self._reap()
        for relid, (progress, held) in list(self.resumes.items()):
            if held.truncated:
                self._resume_over(relid, progress, held, why)
        self._reap()

    def _heartbeat(self, end: Lsn, repl: ReplicationConnection) -> None:
        """Every transaction committed before the server's WAL ``end`` is in the log: record and confirm it."""
        assert self.log is not None
        self.log.append_group([], Lsn(end - 1).hex16())
        self.stats.groups += 1
        self._send(self.core.heartbeat_durable(end), repl)
        self.metrics.caught_up(int(self.confirmed))
