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
  reads every table again beside the stream, superseding the log's rows (below), instead of leaving that gap.
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
  stream, holding the table's own later changes until the last chunk is in the log. When each read
  begins, gets a chunk, gives way, goes on or ends is :mod:`cdc.capture.reads.scheduler`'s to carry out,
  between two passes of the streaming loop and after each group.
* **Heartbeats.** When the captured tables are idle but the server's WAL moves, an empty group moves the
  position to the server's reported end (minus one) and the slot is confirmed there, so WAL does not
  pile up.
* **Stop.** On a stop request the current batch is flushed and confirmed; an open transaction is left
  to the slot, which resends it next time. ``once`` drains up to the WAL position current at start.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

from cdc.capture.capture_topics import CaptureTopics
from cdc.capture.catalog import Catalog
from cdc.capture.discovery import captured_tables
from cdc.capture.errors import PrerequisiteError, PrivilegeError, SlotError, SlotLostError, SourceError
from cdc.capture.events import EventBuilder
from cdc.capture.gc_tuning import relaxed_gc
from cdc.capture.group_writer import GroupWriter
from cdc.capture.initial_snapshot import begin_again, begin_log
from cdc.capture.lsn import Lsn
from cdc.capture.outbox import Outbox, dead_letter_topic
from cdc.capture.outbox_table import OutboxColumns
from cdc.capture.pgoutput.messages import LogicalMessage
from cdc.capture.reads.online_read import OnlineRead
from cdc.capture.reads.scheduler import ReadScheduler, ReadStats, ReadTuning
from cdc.capture.reads.snapshot_requests import SnapshotRequest
from cdc.capture.slot_continuity import drop_idle_slot, require_continuity, slot_confirmed, slot_lost, slot_skipped_ahead
from cdc.capture.snapshot_writer import SnapshotWriter, SnapshotWritten, published_shape
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
from cdc.capture.table_snapshots import PendingSnapshot, SnapshotLedger, TableGate
from cdc.capture.tables import TableShape
from cdc.capture.timelines import divergence
from cdc.capture.transport import Keepalive, ReplicationConnection, XLogData, decode_frame
from cdc.capture.visibility import ReceivedXids
from cdc.config.data_dir import secure_data_dir
from cdc.config.log_backend import open_log
from cdc.config.settings import Settings
from cdc.observe.metrics import CaptureMetrics
from cdc.run.storage_errors import capture_storage_error
from cdc.setup.failover import slot_failover
from cdc.setup.source_checks import capture_problems
from log_store import ProducerRecord
from log_store.errors import StorageIOError
from log_store.log import Log

log = logging.getLogger("cdc.capture")


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


def outbox_tables(views_file: Path) -> dict[tuple[str, str], OutboxColumns]:
    """The outbox tables the views file declares (``[outbox."<schema>.<table>"]``), by ``(schema, table)``."""
    from derived_views.definitions import load

    tables: dict[tuple[str, str], OutboxColumns] = {}
    for name, table in load(views_file).outbox.items():
        schema, _, relation = name.partition(".")
        tables[(schema, relation)] = OutboxColumns(table.id, table.aggregatetype, table.aggregateid, table.type, table.payload)
    return tables


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
        metrics: CaptureMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics or CaptureMetrics()
        self.once = once
        self.stop = stop or threading.Event()
        self.tuning = tuning or Tuning()
        self.stats = CaptureStats()
        self.catalog = Catalog(
            settings.database_url,
            publication=settings.publication,
            mask_key=settings.mask_key_bytes,
            primary_url=settings.primary_url,
        )
        self.log: Log | None = None
        #: the streaming decisions: what the log holds, what the server was told, waiting table snapshots
        self.core: StreamCore[Transaction, PendingSnapshot] = StreamCore(self.tuning, Lsn(0))
        self.topics: CaptureTopics | None = None
        # CDC_TABLES entries are plain identifiers with one dot between schema and table
        self._included = {tuple(name.split(".", 1)) for name in settings.tables}
        #: the outbox tables the views file declares: routed as events, never captured as tables
        self._outbox_tables = outbox_tables(settings.views_file)
        self.builder: EventBuilder | None = None
        self.replayer: ChangeReplayer | None = None
        self.ledger = SnapshotLedger("")
        self.gate = TableGate(self.ledger)
        self.writer: SnapshotWriter | None = None
        self.groups: GroupWriter | None = None
        self._table_of_topic: dict[str, tuple[str, str]] = {}  # from the schema topic
        self._read_back_warned: set[str] = set()  # tables warned of once: their partial updates are read back
        self._failover = False  # the slot a snapshot makes is a failover slot (cdc.setup.failover)
        self._received = ReceivedXids()  # transactions the stream received, that a new snapshot must see
        #: the tables read beside the stream (:mod:`cdc.capture.reads`)
        self.scheduler = ReadScheduler(
            settings, self.tuning, self.stats, self.catalog, self.core, self._received, self._count_snapshot
        )

    @property
    def reads(self) -> list[OnlineRead]:
        """The reads under way, in the order they began."""
        return self.scheduler.reads

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
        """Whether a published table is captured (``CDC_TABLES`` empty: all of the publication); an outbox
        table is not (its inserts are routed as events, :mod:`cdc.capture.outbox_table`)."""
        if (schema, table) in self._outbox_tables:
            return False
        return not self._included or (schema, table) in self._included

    def _new_shape(self, shape: TableShape) -> None:
        """A table's columns changed in the stream (or its first event is written): its topic must exist,
        and the next discovery (right after this batch) checks whether existing rows gained values
        without change events that the log does not carry, as a rewriting ``ADD COLUMN`` gives them, so
        that the table is read again (a constant default's value is carried by the schema record, see
        :mod:`cdc.capture.added_column_fills`)."""
        assert self.topics is not None
        self.topics.ensure(shape)
        self.scheduler.new_shape(shape)

    def _table_topic(self, topic: str) -> bool:
        """Whether ``topic`` is a captured table's (an outbox event is never written there)."""
        if topic in self._table_of_topic:
            return True
        return self.replayer is not None and any(shape.topic == topic for shape in self.replayer.relations.values())

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
            self.replayer.outbox = Outbox(
                self.settings.outbox_message_prefix,
                self.settings.outbox_key_field,
                dead_letter_topic(self.settings.topic_prefix),
                self._table_topic,
            )
            self.replayer.ensure_events_topic = topics.ensure_events
            self.replayer.outbox_tables = self._outbox_tables
            chunk_rows = self.tuning.snapshot_chunk_rows or self.settings.snapshot_chunk_rows
            self.writer = SnapshotWriter(
                store, self.builder, self.replayer, self.ledger,
                partial(published_shape, self.catalog, self.settings.topic_for), topics.ensure,
                chunk_rows,
            )  # fmt: skip
            self.groups = GroupWriter(store, self.replayer, self._read_back_warned, abandon=self.scheduler.abandon_topics)
            self.scheduler.attach(store, self.ledger, self.gate, self.writer, self.groups, self.include)
            watermark = store.latest_watermark()
            self.position = Lsn.from_hex16(watermark.position) if watermark else Lsn(0)
            self.scheduler.label_floor = int(self.position)
            try:
                url, slot = self.settings.database_url, self.settings.slot
                if self.position == 0:
                    self._begin_log()
                elif (diverged := self._diverged()) is not None:
                    log.warning("%s; every captured table is read again, superseding the log's rows", diverged)
                    self.stats.resnapshots += 1
                    self._begin_again()
                elif self.settings.recreate_lost_slot and (lost := slot_lost(url, slot)) is not None:
                    self.stats.resnapshots += 1
                    self._recreate_lost_slot(lost)
                elif slot_skipped_ahead(url, slot, self.position):
                    self.stats.resnapshots += 1
                    self._begin_again()
                if not self.stop.is_set():
                    self.scheduler.reopen_reads()
                    self._stream_with_reconnect()
            finally:
                self.scheduler.run_ended()
                self.catalog.close()
        return self.stats

    # -- snapshot ------------------------------------------------------------------------------------

    def _begin_log(self) -> None:
        """A log without a position begins where the slot is (:func:`~cdc.capture.initial_snapshot.begin_log`);
        every captured table is then read beside the stream, as a table that joins later is. Rows an older
        version's interrupted snapshot left are labelled with that slot's position: reads wait for the
        stream to move past it (:meth:`ReadScheduler.discover`), so that their truncate markers order after them."""
        assert self.log is not None and self.writer is not None
        tables = captured_tables(self.catalog, self.settings.publication, self.include)
        captured = {self.writer.shape_of(table).topic for table in tables}
        self.position = begin_log(
            self.settings.database_url, self.settings.slot, self.log, self.writer,
            captured=captured, uncaptured=self._table_of_topic, failover=self._failover, primary_url=self.settings.primary_url,
        )  # fmt: skip
        if not self._table_of_topic:  # no row is labelled yet: the reads may be as of the slot's position
            self.scheduler.label_floor = 0
        self.scheduler.first_reads = {table.relid for table in tables}
        self.core.confirmed = Lsn(self.position + 1)  # where the slot is: nothing before it is asked for

    def _diverged(self) -> str | None:
        """Why the log diverged from the source (a promotion forked the WAL below its position,
        :mod:`cdc.capture.timelines`), or ``None``."""
        with ReplicationConnection(self.settings.database_url) as repl:
            return divergence(repl, self.ledger.timeline, self.position)[1]

    def _follow_timeline(self, repl: ReplicationConnection) -> None:
        """At a session's start: the log records the source's timeline before streaming on it. A timeline
        that forked below the log's position (a promotion mid-run) stops the session: the next run reads
        every table again (:mod:`cdc.capture.timelines`)."""
        assert self.log is not None
        timeline, diverged = divergence(repl, self.ledger.timeline, self.position)
        if diverged is not None and slot_confirmed(self.settings.database_url, self.settings.slot) is None:
            return  # the slot is gone too: starting the stream says so, with `cdc setup` as the fix
        if diverged is not None:
            raise SlotLostError(f"{diverged}; start capture again: it reads every captured table again")
        if timeline != self.ledger.timeline:
            self.log.append_group([self.ledger.timeline_record(timeline)], self.position.hex16())

    def _recreate_lost_slot(self, lost: str) -> None:
        """``CDC_RECREATE_LOST_SLOT``: the slot is missing or invalidated (``lost`` says which); it is made
        again and every captured table read again (:meth:`_begin_again`), said in one warning line."""
        tables = captured_tables(self.catalog, self.settings.publication, self.include)
        names = ", ".join(table.qualified for table in tables[:10]) + (", ..." if len(tables) > 10 else "")
        log.warning(
            "replication slot %s %s; CDC_RECREATE_LOST_SLOT is on: it is made again, and the %d captured tables "
            "are read again beside the stream, superseding the log's rows (what committed since the log's "
            "position %s is in those reads, not as change events): %s",
            self.settings.slot, lost, len(tables), self.position, names,
        )  # fmt: skip
        drop_idle_slot(self.settings.database_url, self.settings.slot)  # an invalidated slot goes
        self._begin_again()

    def _begin_again(self) -> None:
        """The slot skipped changes the log lacks: the log goes on where the slot is and every captured table
        is read again beside the stream (:func:`~cdc.capture.initial_snapshot.begin_again`)."""
        assert self.log is not None and self.writer is not None and self.ledger is not None
        tables = captured_tables(self.catalog, self.settings.publication, self.include)
        with ReplicationConnection(self.settings.database_url) as repl:
            timeline = repl.identify_system()[1]  # the log goes on on it (cdc.capture.timelines)
        self.position = begin_again(
            self.settings.database_url, self.settings.slot, self.log, self.writer, self.ledger,
            tables=[self.writer.shape_of(table) for table in tables], uncaptured=self._table_of_topic,
            ended_reads=self.scheduler.end_reads(), noted=[self.ledger.timeline_record(timeline)],
            failover=self._failover, primary_url=self.settings.primary_url,
        )  # fmt: skip
        self.scheduler.drop_holding_files()
        self.core.confirmed = Lsn(self.position + 1)  # where the slot is: nothing before it is asked for

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
            self._follow_timeline(repl)
            require_continuity(self.settings.database_url, self.settings.slot, self.position)
            if self.once and core.target is None:
                core.drain_to(self.catalog.wal_insert_position(), time.monotonic() + self.catalog.async_commit_delay())
            # Snapshots that waited when the last session ended are taken again at a new point, and
            # reads under way go on from new ones; the slot sends again what the log does not hold.
            self.scheduler.begin_session()
            repl.start(self.settings.slot, Lsn(0), self.settings.publication)
            assembler = TransactionAssembler(self.tuning.memory_limit, self.settings.outbox_message_prefix)
            core.begin_session(time.monotonic())
            try:
                while True:
                    frames = repl.read_raw(core.read_timeout())
                    self._receive(frames, assembler, repl)
                    pass_ = core.tick(
                        time.monotonic(), got_frames=bool(frames), stop=self.stop.is_set(),
                        assembler_idle=assembler.idle, wants_discovery=self.scheduler.wants_discovery,
                    )  # fmt: skip
                    if self._carry_out(pass_, repl):
                        return
                    if self.scheduler.reads:
                        self.scheduler.read_chunk()
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
                    self.scheduler.start_read(pending)
                case Heartbeat(end=end):
                    self._heartbeat(end, repl)
                case Discover():
                    self.scheduler.discovery_due()
                    self.scheduler.discover()
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

    def _requested(self, message: LogicalMessage, commit_ts_ms: int) -> list[ProducerRecord]:
        """A ``cdc snapshot`` request (:mod:`cdc.capture.reads.snapshot_requests`) in a transaction being written,
        handed to the reads (:meth:`ReadScheduler.requested`); the records to write in the same group."""
        request = SnapshotRequest.parse(message.content)
        if request is None:
            return []
        return self.scheduler.requested(request, commit_ts_ms, Lsn(message.lsn))

    # -- groups --------------------------------------------------------------------------------------

    def _append(self, group: list[Transaction]) -> SendStatus:
        """Append ``group`` as one group (:mod:`cdc.capture.group_writer`); the status that confirms it, to send."""
        assert self.groups is not None
        try:
            written = self.groups.append(group)
        finally:
            self.scheduler.reap()
        self.scheduler.start_truncated_over()
        status = self.core.group_durable(group)
        self.scheduler.group_written()
        self.stats.events += written.events
        self.stats.groups += 1
        self.stats.transactions += len(group)
        last = group[-1].commit_ts_ms
        self.metrics.group_durable(written.events, written.value_bytes, len(group), status.flushed, last)
        return status

    def _heartbeat(self, end: Lsn, repl: ReplicationConnection) -> None:
        """Every transaction committed before the server's WAL ``end`` is in the log: record and confirm it."""
        assert self.log is not None
        self.log.append_group([], Lsn(end - 1).hex16())
        self.stats.groups += 1
        self._send(self.core.heartbeat_durable(end), repl)
        self.metrics.caught_up(int(self.confirmed))
