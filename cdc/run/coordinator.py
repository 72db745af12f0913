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
  :mod:`cdc.capture.stream_core`'s, tested without I/O; a session (:mod:`cdc.run.stream_session`) carries
  them out, and this module sets the run up and decides where the log begins.
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
from functools import partial
from pathlib import Path

from cdc.capture.capture_topics import CaptureTopics
from cdc.capture.catalog import Catalog
from cdc.capture.change_replayer import ChangeReplayer
from cdc.capture.discovery import captured_tables
from cdc.capture.errors import PrerequisiteError
from cdc.capture.events import EventBuilder
from cdc.capture.group_writer import GroupWriter
from cdc.capture.initial_snapshot import begin_again, begin_log
from cdc.capture.lsn import Lsn
from cdc.capture.outbox import Outbox, dead_letter_topic
from cdc.capture.outbox_table import OutboxColumns
from cdc.capture.reads.online_read import OnlineRead
from cdc.capture.reads.scheduler import ReadScheduler
from cdc.capture.slot_continuity import drop_idle_slot, slot_lost, slot_skipped_ahead
from cdc.capture.snapshot_writer import SnapshotWriter, SnapshotWritten, published_shape
from cdc.capture.stream_core import StreamCore
from cdc.capture.streaming import Transaction
from cdc.capture.table_snapshots import PendingSnapshot, SnapshotLedger, TableGate
from cdc.capture.tables import TableShape
from cdc.capture.timelines import divergence
from cdc.capture.transport import ReplicationConnection
from cdc.capture.visibility import ReceivedXids
from cdc.config.data_dir import secure_data_dir
from cdc.config.log_backend import open_log
from cdc.config.settings import Settings
from cdc.observe.metrics import CaptureMetrics
from cdc.run.storage_errors import capture_storage_error
from cdc.run.stream_session import StreamSession
from cdc.run.tuning import CaptureStats, Tuning
from cdc.setup.failover import slot_failover
from cdc.setup.source_checks import capture_problems
from log_store.errors import StorageIOError
from log_store.log import Log

log = logging.getLogger("cdc.capture")


def outbox_tables(views_file: Path) -> dict[tuple[str, str], OutboxColumns]:
    """The outbox tables the views file declares (``[outbox."<schema>.<table>"]``), by ``(schema, table)``."""
    from derived_views.definitions import load

    tables: dict[tuple[str, str], OutboxColumns] = {}
    for name, table in load(views_file).outbox.items():
        schema, _, relation = name.partition(".")
        tables[(schema, relation)] = OutboxColumns(table.id, table.aggregatetype, table.aggregateid, table.type, table.payload)
    return tables


class Capture(StreamSession):
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
