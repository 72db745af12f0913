"""The capture loop: initial snapshot, then streaming from the slot, exactly once into the log.

Guarantees and restart rules:

* **Positions.** The log's watermark position P (``%016X``) means: every transaction whose commit LSN
  is <= P is in the log, and no later one. A group of transactions has as P the end of its last
  transaction's commit record minus one (no transaction commits inside a commit record), so the slot
  is confirmed at exactly P + 1. A
  position the server reports (the consistent point C of a new slot, the WAL end E of a keepalive) is
  where the *next* record may start, and a transaction committing exactly there is not yet included,
  so it is recorded as C - 1 or E - 1 (commit records start on 8-byte boundaries, so no transaction
  commits at C - 1). Without this a transaction whose commit record starts exactly at C or E would be
  skipped as already held.
* **Durable before confirmed.** A flush position is sent to PostgreSQL only after
  :meth:`LogStore.append_group` returned for every transaction up to it (the log fsyncs before it
  returns). Several committed transactions share one group (one fsync) for throughput.
* **Whole transactions.** One source transaction is never split across groups, so the log's watermark
  always lies on a transaction boundary.
* **A slot that does not continue the log** (confirmed past P + 1: recreated by ``cdc setup`` after it
  was lost, or advanced by another client) never streamed what committed in between; capture then
  takes a new snapshot, which supersedes the log's rows (below), instead of leaving that gap.
* **Idempotent restart.** On start the log's watermark position P is read; the slot resends from its
  confirmed position, which may be behind P after a crash between the fsync and the confirmation, and
  every transaction whose commit LSN <= P is skipped. Relation messages of skipped transactions still
  update the relation cache (the server resends what each transaction needs).
* **Snapshot.** The watermark position ``0000000000000000`` (or no watermark) means no complete
  snapshot: the slot is (re)created with an exported snapshot and every included table is read into
  the log (by several sessions sharing the exported snapshot) in groups at position 0; the group that
  completes the snapshot has the slot's consistent point C minus one as position (the snapshot holds
  exactly the transactions that committed before C, and the slot streams exactly those that commit at
  or after C). An interrupted snapshot therefore never looks complete, and the next run starts it
  again from a new slot.
* **A restarted snapshot supersedes the partial one.** Rows the interrupted attempt wrote stay in the
  log (its groups were durable), and a row deleted since would never be deleted downstream. So the new
  snapshot writes, before a table's reads, a truncate marker (``op=t``, ``source.snapshot`` "true",
  ``source.lsn`` C - 1, sequence 0, on every partition) when the table's topic already holds records,
  and the marker alone on the topic of a table the attempt read but this one no longer captures. A
  consumer applying events in ``(lsn, sequence)`` order, or a partition in offset order, empties the
  table there and then sees exactly the new reads; compaction keeps the marker (the latest record of
  its key) after any stale row it keeps.
* **Tables that join later.** A published table the ledger (``<prefix>.__snapshots``) does not name
  gets no change event until its snapshot is in the log: :mod:`cdc.table_snapshots` takes it at a
  temporary slot's consistent point B, drops the table's changes committed before B, and writes its
  rows as one group at position B - 1 once every transaction before B is in the log.
* **Heartbeats.** When the captured tables are idle but the server's WAL moves, an empty group moves the
  position to the server's reported end (minus one) and the slot is confirmed there, so WAL does not
  pile up.
* **Stop.** On a stop request the current batch is flushed and confirmed; an open transaction is left
  to the slot, which resends it next time. ``once`` drains up to the WAL position current at start.
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import orjson
import psycopg
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

from cdc.catalog import Catalog, PublishedTable, steady
from cdc.data_dir import secure_data_dir
from cdc.errors import PrerequisiteError, PrivilegeError, SlotError, SourceError
from cdc.events import EventBuilder, TxContext, mark_last_read
from cdc.gc_tuning import relaxed_gc
from cdc.key_changes import KeyChangeValues, LogRows, discarded_values
from cdc.log_backend import Log, open_log
from cdc.lsn import Lsn
from cdc.metrics import CaptureMetrics
from cdc.settings import Settings
from cdc.slot_continuity import gap_after, slot_confirmed
from cdc.snapshot import CHUNK_ROWS, SnapshotReader
from cdc.source_checks import capture_problems
from cdc.storage_errors import StorageError, capture_storage_error
from cdc.streaming import ChangeReplayer, EmittedSchema, Transaction, TransactionAssembler
from cdc.table_snapshots import PendingSnapshot, SnapshotLedger, TableGate, take_snapshot
from cdc.tables import TableShape, fingerprint_of
from cdc.transport import Keepalive, ReplicationConnection, XLogData, decode_frame
from log_store import ProducerColumns, ProducerRecord, TopicPartition
from log_store.errors import StorageIOError
from log_store.topic_names import log_name

log = logging.getLogger("cdc.capture")

SNAPSHOT_POSITION = Lsn(0).hex16()


@dataclass
class Tuning:
    """Batching and timing knobs of the loop (defaults suit the benchmarks and the tests)."""

    batch_changes: int = 20_000
    batch_seconds: float = 0.2
    #: rows per snapshot chunk (see :data:`cdc.snapshot.AHEAD` for the measured trade-off)
    snapshot_chunk_rows: int = CHUNK_ROWS
    snapshot_group_chunks: int = 10  # chunks per group of the initial snapshot (one fsync each)
    heartbeat_seconds: float = 5.0
    discover_seconds: float = 5.0
    status_seconds: float = 10.0
    reconnect_seconds: float = 120.0
    memory_limit: int = 8 << 20


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
    #: new snapshots taken because the slot did not continue the log (:mod:`cdc.slot_continuity`)
    resnapshots: int = 0


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
        self.catalog = Catalog(settings.database_url)
        self.log: Log | None = None
        self.position = Lsn(0)
        self.confirmed = Lsn(0)
        self._target: int | None = None
        self._retarget_at = float("inf")
        self._topics: set[str] = set()
        # CDC_TABLES entries are plain identifiers with one dot between schema and table
        self._included = {tuple(name.split(".", 1)) for name in settings.tables}
        self.builder: EventBuilder | None = None
        self.replayer: ChangeReplayer | None = None
        self.ledger = SnapshotLedger("")
        self.gate = TableGate(self.ledger)
        self._table_snapshots: list[PendingSnapshot] = []  # ordered by boundary
        self._shape_changed = False  # a table's columns changed in the stream since the last discovery
        self._table_of_topic: dict[str, tuple[str, str]] = {}  # from the schema topic
        self._slots_made = 0  # temporary slots, for unique names
        self._read_back_warned: set[str] = set()  # tables whose partial updates capture read back (whole_rows)

    # -- set-up --------------------------------------------------------------------------------------

    def include(self, schema: str, table: str) -> bool:
        """Whether a published table is captured (``CDC_TABLES`` empty: all of the publication)."""
        return not self._included or (schema, table) in self._included

    def _new_shape(self, shape: TableShape) -> None:
        """A table's columns changed in the stream (or its first event is written): its topic must exist,
        and the next discovery (right after this batch) checks whether existing rows gained values
        without change events, as ``ADD COLUMN ... DEFAULT`` gives them, so that the table is read again."""
        self._ensure_topic(shape)
        self._shape_changed = True

    def _ensure_topic(self, shape: TableShape) -> None:
        assert self.log is not None
        if shape.topic in self._topics:
            return
        if shape.topic not in self.log.topics():
            self.log.ensure_topic(shape.topic, self.settings.partitions, compacted=bool(shape.key_indexes))
        self._topics.add(shape.topic)

    def _load_emitted_schemas(self) -> dict[str, EmittedSchema]:
        assert self.log is not None
        topic = self.builder.schema_topic if self.builder else ""
        emitted: dict[str, EmittedSchema] = {}
        if topic not in self.log.topics():
            self.log.ensure_topic(topic, 1, compacted=True)
            return emitted
        offset = self.log.start_offset(TopicPartition(topic, 0))
        while True:
            batch = self.log.read(TopicPartition(topic, 0), offset)
            if not batch:
                return emitted
            for record in batch:
                if record.key is not None and record.value is not None:
                    value = orjson.loads(record.value)
                    # by the names the record holds: a key written before names were escaped (a name with a
                    # dot) then meets the table's log name, and its next record follows this one
                    emitted[log_name(value["schema"], value["table"])] = (fingerprint_of(value), record.value)
                    self._table_of_topic[value["topic"]] = (value["schema"], value["table"])
            offset = batch[-1].offset + 1

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
        try:
            return self._run_while_kafka_fails()
        except StorageIOError as exc:
            raise self._storage_error(exc) from exc

    def _run_while_kafka_fails(self) -> CaptureStats:
        """:meth:`_run`, run again after a pause each time the log's Kafka brokers fail (continuous capture only).

        A failed group was aborted and nothing past the last committed one was confirmed, so a new run
        (the log reopened, its watermark read, the slot streamed from its confirmed position) loses and
        doubles nothing: it is a restart of capture in process. One warning line per attempt; the pause
        doubles from 1 s to 30 s. ``once`` fails at once instead, as does an error a restart cannot cure
        (another capture of the prefix took over, a refused login or permission, a record too large).
        """
        from log_store.kafka_log import KafkaLogError

        pause = 1.0
        while True:
            try:
                return self._run()
            except KafkaLogError as exc:
                if self.once or not exc.retriable:
                    raise
                self.metrics.errors.labels(kind="KafkaLogError").inc()
                log.warning("%s; capture starts again in %.0f s (nothing is confirmed to the source past LSN %s)",
                            exc, pause, Lsn(self.position + 1) if self.position else Lsn(0))
                if self.stop.wait(pause):
                    return self.stats
                pause = min(pause * 2, 30.0)

    def _storage_error(self, exc: StorageIOError) -> StorageError:
        if self.log is None:
            told = "nothing was confirmed to the source (nothing was read from it)"
            resume = "it starts from the log as it was"
        elif self.position == 0:
            told = "the initial snapshot did not complete and nothing was confirmed to the source"
            resume = "it takes the snapshot again"
        else:
            told = (f"nothing was confirmed to the source past LSN {Lsn(self.position + 1)}, the end of what the "
                    "log holds (the slot is confirmed only after the log fsyncs)")
            resume = "the slot resends everything after that"
        self.metrics.errors.labels(kind="StorageError").inc()
        return capture_storage_error(exc, self.settings.data_dir, told, resume)

    def _run(self) -> CaptureStats:
        secure_data_dir(self.settings.data_dir)
        with open_log(self.settings, writer=True) as store:
            self.log = store
            self.builder = EventBuilder(
                prefix=self.settings.topic_prefix, database=self._database_name(), partitions=self.settings.partitions,
                partitions_of=self._partitions_of,
            )
            # Kafka's compaction cannot fold a partial row onto the key's earlier one: write whole rows
            self.builder.whole_rows = self.settings.uses_kafka
            self._warn_of_kept_partition_counts()
            self.ledger = SnapshotLedger.load(store, self.builder.ledger_topic)
            self.gate = TableGate(self.ledger)
            self.replayer = ChangeReplayer(
                self.builder, self.catalog, self.settings.topic_for, self.include,
                self._load_emitted_schemas(), on_new_shape=self._new_shape, gate=self.gate,
            )
            watermark = store.latest_watermark()
            self.position = Lsn.from_hex16(watermark.position) if watermark else Lsn(0)
            try:
                if self.position == 0 or self._slot_skipped_ahead():
                    self._snapshot()
                if not self.stop.is_set():
                    self._stream_with_reconnect()
            finally:
                self._drop_table_snapshots()
                self.catalog.close()
        return self.stats

    def _partitions_of(self, topic: str) -> int:
        """The partition count of ``topic``: its own once it exists, ``CDC_PARTITIONS`` for a new one."""
        assert self.log is not None
        return self.log.partitions(topic) if topic in self.log.topics() else self.settings.partitions

    def _warn_of_rows_read_back(self) -> None:
        """Say once per table that its updates leave TOAST values out, which capture reads back from the log."""
        builder = self.replayer.builder if self.replayer is not None else None
        if builder is None or not builder.rows_read_back - self._read_back_warned:
            return
        for table in sorted(builder.rows_read_back - self._read_back_warned):
            log.warning(
                "updates of %s leave TOAST values out; the log (Kafka) cannot fold such partial rows, so capture reads "
                "each such row back from the log to write it whole, which slows it down; run ALTER TABLE %s "
                "REPLICA IDENTITY FULL so that updates carry those values", table, table)
        self._read_back_warned |= builder.rows_read_back

    def _warn_of_kept_partition_counts(self) -> None:
        """Say which existing topics keep a partition count other than ``CDC_PARTITIONS``.

        A key's partition is its hash modulo the topic's count, so a topic keeps the count it was created
        with (changing it would move keys, and the per-key order with them); the setting applies to new
        topics only.
        """
        assert self.log is not None and self.builder is not None
        wanted = self.settings.partitions
        internal = {self.builder.schema_topic, self.builder.ledger_topic}
        kept = [(topic, self.log.partitions(topic)) for topic in self.log.topics()
                if topic.startswith(f"{self.settings.topic_prefix}.") and topic not in internal]
        kept = [(topic, count) for topic, count in kept if count != wanted]
        if not kept:
            return
        counts = sorted({count for _, count in kept})
        log.warning(
            "topics %s keep the partition count they were created with, not CDC_PARTITIONS=%d (a key's partition is "
            "its hash modulo the topic's count; changing the count would move keys): only new topics get %d "
            "partitions; set CDC_PARTITIONS back to %s, or capture into a new CDC_DATA_DIR (a new snapshot) and "
            "rebuild the views from it",
            ", ".join(f"{topic} ({count} partitions)" for topic, count in kept), wanted, wanted,
            " or ".join(str(count) for count in counts),
        )

    def _slot_skipped_ahead(self) -> bool:
        """Whether the slot does not continue the log (:mod:`cdc.slot_continuity`): a new snapshot is due."""
        confirmed = slot_confirmed(self.settings.database_url, self.settings.slot)
        if not gap_after(self.position, confirmed):
            return False
        log.warning(
            "replication slot %s is confirmed at %s but the log holds transactions only up to %s: the slot was "
            "recreated or advanced by another client, and what committed in between never reached the log; "
            "taking a new snapshot that supersedes the log's rows",
            self.settings.slot, confirmed, Lsn(self.position + 1),
        )
        self.stats.resnapshots += 1
        return True

    # -- snapshot ------------------------------------------------------------------------------------

    def _published(self) -> list[PublishedTable]:
        tables = self.catalog.published_tables(self.settings.publication)
        if not tables:
            raise SourceError(
                f"publication {self.settings.publication} does not exist or publishes no table; run `cdc setup`"
            )
        return [t for t in tables if self.include(t.schema, t.table)]

    def _drop_slot_if_present(self) -> None:
        with psycopg.connect(self.settings.database_url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (self.settings.slot,)
            ).fetchone()
            if row is None:
                return
            if row[0] is not None:
                raise SlotError(
                    f"replication slot {self.settings.slot} is in use by PID {row[0]}; stop the other capture first"
                )
            conn.execute("SELECT pg_drop_replication_slot(%s)", (self.settings.slot,))

    def _snapshot(self) -> None:
        """Create the slot with an exported snapshot and copy every included table into the log.

        Rows go into groups of several chunks at position 0 (written chunk by chunk as they are read,
        one fsync per group); the final read, marked "last", and the ledger records form the group at
        the consistent point minus one that completes the snapshot, so an interrupted snapshot never
        looks complete.

        Each table's reads are preceded by truncate markers when its topic already holds records (left
        by an interrupted attempt), and the topic of a table the attempt read but this one does not
        gets the markers alone: applied in ``(lsn, sequence)`` order they drop every earlier record.
        """
        assert self.log is not None and self.builder is not None and self.replayer is not None
        tables = self._published()
        self._require_readable(tables)
        # read before the snapshot exists: a membership or column change after this is caught by the next
        # discovery
        published = {t.relid: t for t in tables}
        self._drop_slot_if_present()
        with ReplicationConnection(self.settings.database_url) as repl:
            created = repl.create_slot(self.settings.slot, export_snapshot=True)
            try:
                reader = SnapshotReader(self.settings.database_url, created.snapshot_name or "")
            except BaseException:
                self._drop_unfinished_slot(created.consistent_point)
                raise
        completed = False  # the log holds the whole snapshot: the slot is what the log continues from
        point = created.consistent_point
        as_of = Lsn(point - 1)  # every transaction committed before the consistent point
        log.info("snapshot at consistent point %s of %d tables", point, len(tables))
        ts_ms = time.time_ns() // 1_000_000
        saved_schemas = dict(self.replayer.emitted_schemas)
        try:
            # Before the groups: every topic exists, and per table its truncate markers (when an earlier
            # attempt left records) and schema record are ready to precede its rows.
            first = self._supersede_uncaptured(tables, as_of, ts_ms)
            heads: list[tuple[PublishedTable, TableShape, TxContext, list[ProducerRecord]]] = []
            for table in tables:
                shape = self._snapshot_shape(table)
                self._ensure_topic(shape)
                context = TxContext(as_of, reader.xmin, ts_ms, snapshot="true")
                head = self.replayer._schema_records(shape, as_of) + self._supersede(shape, context)
                heads.append((table, shape, context, head))
            done: list[tuple[TableShape, int]] = []

            tally = [0, 0]

            def parts() -> Iterator[tuple[list[ProducerRecord | ProducerColumns], bool]]:
                """The snapshot's records a list at a time (a chunk's reads as one block of columns), and
                whether the list is the final part (the last read, marked "last", and the ledger
                records), which goes into the completing group.

                Truncate markers and schema records go out with the next chunk of reads (a table's
                markers and schema record before its reads), so that the first list already holds rows.
                """
                carry: list[ProducerRecord | ProducerColumns] = list(first)
                held: ProducerColumns | None = None  # held back so that the final read is marked "last"
                for table, shape, context, head in heads:
                    carry += head
                    rows = 0
                    for block in self._with_progress(self._read_blocks(reader, shape, context, tally), table, reader):
                        if self.stop.is_set():
                            raise _SnapshotStopped
                        if held is not None:
                            yield [*carry, held], False
                            carry = []
                        held = block
                        rows += len(block)
                    done.append((shape, rows))
                final = carry
                if held is not None:
                    final += _last_marked(held)
                yield final + [self.ledger.record(shape, as_of, rows, ts_ms, published.get(shape.relid))
                               for shape, rows in done], True

            source = parts()
            upcoming = next(source)

            def group() -> Iterator[list[ProducerRecord | ProducerColumns]]:
                """Lists for one group at position 0: up to ``snapshot_group_chunks`` chunks, never the final part."""
                nonlocal upcoming
                for _ in range(max(1, self.tuning.snapshot_group_chunks)):
                    yield upcoming[0]
                    upcoming = next(source)
                    if upcoming[1]:
                        return

            with relaxed_gc():
                while not upcoming[1]:
                    # a block of columns counts as one item: a few at a time bound the memory
                    self.log.append_group(itertools.chain.from_iterable(group()), SNAPSHOT_POSITION,
                                          chunk_records=_SNAPSHOT_ITEMS)
                    self.stats.groups += 1
                self.log.append_group(upcoming[0], as_of.hex16(), chunk_records=_SNAPSHOT_ITEMS)
                completed = True
        except _SnapshotStopped:
            self.replayer.emitted_schemas = saved_schemas  # nothing of the group is in the log
            return
        except BaseException:
            self.replayer.emitted_schemas = saved_schemas
            raise
        finally:
            reader.close()
            if not completed:
                self._drop_unfinished_slot(point)
        self.ledger.add((shape for shape, _ in done), as_of, published)
        self.position = as_of
        self.stats.snapshot_rows += sum(rows for _, rows in done)
        self.stats.groups += 1
        self._observe(tally[0], tally[1], 0, None)

    def _drop_unfinished_slot(self, consistent_point: Lsn) -> None:
        """Drop the slot this run created for a first snapshot that did not complete.

        The log then has no complete snapshot, so the next run drops the slot anyway and creates one with
        a new exported snapshot: left in place it would only hold WAL for nobody. Only the slot this run
        created is dropped: one nobody uses whose confirmed position is still its consistent point. A
        new snapshot of a log that already holds one (the slot did not continue it) keeps its slot: its
        gap after the log's position is what makes the next run take the snapshot again, where a missing
        slot would stop capture until ``cdc setup`` made one. A failure to drop is logged, never raised
        over the error that ended the snapshot.
        """
        if self.position != 0:
            return
        slot = self.settings.slot
        try:
            with psycopg.connect(self.settings.database_url, autocommit=True, connect_timeout=10) as conn:
                dropped = conn.execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                    "WHERE slot_name = %s AND active_pid IS NULL AND confirmed_flush_lsn = %s::pg_lsn",
                    (slot, str(consistent_point)),
                ).fetchall()
        except psycopg.Error as exc:
            log.warning("could not drop replication slot %s, created for a snapshot that did not complete (%s); "
                        "it holds WAL until capture runs again or SELECT pg_drop_replication_slot('%s') drops it",
                        slot, str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__, slot)
            return
        if dropped:
            log.info("dropped replication slot %s: its snapshot did not complete, the next run takes a new one", slot)

    def _topic_has_records(self, topic: str) -> bool:
        assert self.log is not None
        return topic in self.log.topics() and any(
            self.log.end_offset(TopicPartition(topic, p)) > 0 for p in range(self.log.partitions(topic)))

    def _supersede(self, shape: TableShape, context: TxContext) -> list[ProducerRecord]:
        """Truncate markers (sequence 0 of ``context``) when the table's topic already holds records."""
        assert self.builder is not None
        return self.builder.truncate(shape, context) if self._topic_has_records(shape.topic) else []

    def _supersede_uncaptured(self, tables: list[PublishedTable], as_of: Lsn, ts_ms: int) -> list[ProducerRecord]:
        """Truncate markers for the topics of tables an interrupted snapshot read but this one does not."""
        captured = {self.settings.topic_for(t.schema, t.table) for t in tables}
        records: list[ProducerRecord] = []
        for topic, (schema, table) in sorted(self._table_of_topic.items()):
            if topic not in captured and self._topic_has_records(topic):
                shape = TableShape(0, schema, table, topic, ())
                records.extend(self._supersede(shape, TxContext(as_of, 0, ts_ms, snapshot="true")))
        return records

    def _snapshot_shape(self, table: PublishedTable) -> TableShape:
        info = self.catalog.table(table.relid)
        keys = info.primary_key or (info.identity_key if info.replica_identity == "index" else ())
        return TableShape.build(
            table.relid, table.schema, table.table, self.settings.topic_for(table.schema, table.table),
            list(info.columns), list(keys), not_null=info.not_null, type_names=self.catalog.type_names,
            attnums=info.attnums,
        )

    def _read_blocks(
        self, reader: SnapshotReader, shape: TableShape, context: TxContext, tally: list[int]
    ) -> Iterator[ProducerColumns]:
        """The snapshot reads of ``shape``, a block of columns per chunk, counted into ``tally``
        (events, value bytes)."""
        assert self.builder is not None
        encode = self.builder.read_encoder(shape, context)
        for block in reader.column_chunks(shape, encode, self.tuning.snapshot_chunk_rows):
            context.sequence += len(block)
            tally[0] += len(block)
            tally[1] += block.value_bytes()
            yield block

    def _with_progress(
        self, blocks: Iterator[ProducerColumns], table: PublishedTable, reader: SnapshotReader
    ) -> Iterator[ProducerColumns]:
        if not self.progress:
            yield from blocks
            return
        from rich.progress import Progress

        with Progress(transient=True) as bar:
            task = bar.add_task(f"snapshot {table.qualified}", total=reader.estimate(table.relid) or None)
            for block in blocks:
                yield block
                bar.advance(task, len(block))

    # -- streaming -----------------------------------------------------------------------------------

    def _stream_with_reconnect(self) -> None:
        retrying = Retrying(
            retry=retry_if_exception(_retryable),
            wait=wait_exponential(multiplier=0.2, max=5),
            stop=stop_after_delay(self.tuning.reconnect_seconds),
            reraise=True,
            before_sleep=lambda state: log.warning("reconnecting after: %s", state.outcome.exception() if state.outcome else "?"),
        )
        for attempt in retrying:
            with attempt:
                if attempt.retry_state.attempt_number > 1:
                    self.stats.reconnects += 1
                    self.metrics.reconnects.inc()
                with relaxed_gc():
                    self._stream()

    def _stream(self) -> None:
        """One replication session; returns when stopped or drained, raises on connection loss."""
        assert self.log is not None and self.replayer is not None
        tuning = self.tuning
        with ReplicationConnection(self.settings.database_url) as repl:
            repl.identify_system()
            confirmed = slot_confirmed(self.settings.database_url, self.settings.slot)
            if gap_after(self.position, confirmed):
                raise SlotError(
                    f"replication slot {self.settings.slot} was recreated or advanced elsewhere while capture "
                    f"reconnected (confirmed at {confirmed}, the log holds transactions up to {self.position}); "
                    "start capture again: it takes a new snapshot that supersedes the log's rows"
                )
            if self.once and self._target is None:
                self._target = self.catalog.wal_insert_position()
                self._retarget_at = time.monotonic() + self.catalog.async_commit_delay()
            # Snapshots that waited when the last session ended are taken again at a new point.
            self._drop_table_snapshots()
            self._discover()
            last_discovery = time.monotonic()
            repl.start(self.settings.slot, Lsn(0), self.settings.publication)
            assembler = TransactionAssembler(tuning.memory_limit)
            take = assembler.take
            pending: list[Transaction] = []
            pending_changes = 0
            first_pending = 0.0
            server_end: int = self.confirmed
            last_status = time.monotonic()
            last_heartbeat = time.monotonic()
            asked = False
            try:
                while True:
                    frames = repl.read_raw(tuning.batch_seconds / 4 if pending else 0.25)
                    index = 0
                    while True:
                        index = take(frames, index)  # changes of the open transaction, kept as bytes until its commit
                        if index >= len(frames):
                            break
                        frame = decode_frame(frames[index])
                        index += 1
                        if isinstance(frame, XLogData):
                            # Only keepalives and commits move server_end: an XLogData header inside a
                            # streamed block does not promise that earlier commits were all sent.
                            tx = assembler.feed(frame.payload, frame.data_start)
                            if tx is not None:
                                server_end = max(server_end, tx.end_lsn)
                                if tx.commit_lsn <= self.position:
                                    self.stats.skipped += 1
                                    self._skip(tx, repl, pending)
                                else:
                                    if pending and self._snapshot_due(tx.commit_lsn):
                                        # every transaction before the boundary is here: rows, then tx
                                        self._flush(pending, repl)
                                        pending, pending_changes = [], 0
                                    if self._snapshot_due(tx.commit_lsn):
                                        self._write_table_snapshots(tx.commit_lsn, repl)
                                    if not pending:
                                        first_pending = time.monotonic()
                                    pending.append(tx)
                                    pending_changes += tx.changes.count
                        elif isinstance(frame, Keepalive):
                            asked = False
                            server_end = max(server_end, frame.wal_end)
                            self.metrics.wal_bytes_behind.set(max(0, frame.wal_end - self.confirmed))
                            if frame.reply_requested:
                                repl.send_status(self.confirmed, self.confirmed)
                                last_status = time.monotonic()
                    now = time.monotonic()
                    if pending and (
                        not frames
                        or pending_changes >= tuning.batch_changes
                        or now - first_pending >= tuning.batch_seconds
                        or self.stop.is_set()
                    ):
                        self._flush(pending, repl)
                        pending, pending_changes = [], 0
                        last_status = time.monotonic()
                    idle = not pending and assembler.idle
                    if idle and self._snapshot_due(server_end):
                        self._write_table_snapshots(server_end, repl)
                    if self.gate.wanted or self._shape_changed or (
                        idle and now - last_discovery >= tuning.discover_seconds
                    ):
                        self._shape_changed = False
                        self._discover()
                        last_discovery = now
                    if self._target is not None and idle and now >= self._retarget_at:
                        self._retarget()
                    drained = (self._target is not None and idle and server_end >= self._target
                               and not self._table_snapshots)
                    if idle and server_end - 1 > self.position and (
                        drained or now - last_heartbeat >= tuning.heartbeat_seconds
                    ):
                        self._heartbeat(Lsn(server_end), repl)
                        last_heartbeat = last_status = now
                    if drained or (self.stop.is_set() and not pending):
                        repl.send_status(self.confirmed, self.confirmed)
                        repl.finish()
                        return
                    if not frames and (self._target is not None or self._table_snapshots) and not asked:
                        # ask where the server's WAL ends: a drain or a waiting snapshot needs to know
                        repl.send_status(self.confirmed, self.confirmed, reply=True)
                        asked = True
                        last_status = now
                    elif now - last_status >= tuning.status_seconds:
                        repl.send_status(self.confirmed, self.confirmed)
                        last_status = now
            except SourceError as exc:
                self.metrics.errors.labels(kind=type(exc).__name__).inc()
                if pending:
                    try:
                        self._flush(pending, None)
                    finally:
                        pending = []
                raise
            finally:
                for tx in pending:
                    tx.close()
                assembler.reset()

    def _retarget(self) -> None:
        """``once``: lower the drain target to the flushed WAL once every commit made before the start is flushed.

        The target is the WAL insert position at the start, which covers commits not yet flushed
        (``synchronous_commit = off``). The server flushes such a commit within three times
        ``wal_writer_delay``; after that the flush position covers every commit made before the start,
        and WAL past it holds no commit of interest (only records such as page pruning, which the server
        may leave unflushed for many seconds). Waiting for those would only delay the exit.
        """
        assert self._target is not None
        self._target = Lsn(min(self._target, self.catalog.wal_flush_position()))
        self._retarget_at = float("inf")

    # -- tables added mid-stream (see cdc.table_snapshots) ---------------------------------------------

    def _discover(self) -> None:
        """Snapshot every published, included table that the ledger does not cover (see
        :meth:`SnapshotLedger.covers`: also a table added back, whose partitions changed or that was given
        a column its existing rows hold values in) and no snapshot waits for."""
        tables: list[PublishedTable] = []
        for table in self.catalog.published_tables(self.settings.publication):
            if not self.include(table.schema, table.table):
                continue
            if self.ledger.covers(table.log_name, table.relid, table.membership, table.columns):
                self.ledger.note_columns(table.log_name, table.columns)
            elif table.relid not in self.gate.holds:
                tables.append(table)
        self.gate.wanted.clear()  # a wanted table no longer published is no longer captured
        if tables:
            # read twice: a table whose publication entry or columns change while they are read (its
            # listing and its entry rows are read with different catalog snapshots) waits for the next
            # discovery rather than recording a state it was never in
            again = {t.relid: steady(t) for t in self.catalog.published_tables(self.settings.publication)}
            unsteady = [t for t in tables if again.get(t.relid) != steady(t)]
            if unsteady:
                log.info("publication of %s changed while it was read; its snapshot waits for the next discovery",
                         ", ".join(t.qualified for t in unsteady))
            tables = [t for t in tables if t not in unsteady]
        if not tables:
            return
        self._require_readable(tables)
        self._slots_made += 1
        name = f"{self.settings.slot[:40]}_add_{os.getpid()}_{self._slots_made}"
        pending = take_snapshot(self.settings.database_url, name, tables)
        self.stats.tables_added += len(tables)
        for table in tables:
            self.gate.holds[table.relid] = pending.boundary
        self._table_snapshots.append(pending)
        log.info("snapshot of %s at %s, written when the stream reaches it",
                 ", ".join(t.qualified for t in tables), pending.boundary)

    def _require_readable(self, tables: list[PublishedTable]) -> None:
        """Refuse to snapshot ``tables`` (before any slot is made for it) when the role cannot read one."""
        unreadable = set(self.catalog.unreadable([t.relid for t in tables]))
        if unreadable:
            names = ", ".join(t.qualified for t in tables if t.relid in unreadable)
            raise PrivilegeError(
                f"the capture role cannot read {names}, published by {self.settings.publication}, so it cannot "
                f"snapshot it; run GRANT SELECT ON {names} TO the capture role (ALTER DEFAULT PRIVILEGES "
                "... GRANT SELECT ON TABLES covers tables created later)"
            )

    def _snapshot_due(self, reached: int) -> bool:
        return bool(self._table_snapshots) and self._table_snapshots[0].boundary <= reached

    def _write_table_snapshots(self, reached: int, repl: ReplicationConnection) -> None:
        """Write every waiting snapshot whose boundary the stream has ``reached`` (nothing before it is in flight)."""
        while self._snapshot_due(reached):
            pending = self._table_snapshots.pop(0)
            try:
                self._write_table_snapshot(pending, repl)
            finally:
                pending.close()

    def _write_table_snapshot(self, pending: PendingSnapshot, repl: ReplicationConnection) -> None:
        """One group at the boundary minus one: per table, truncate markers if needed, schema, rows, ledger record."""
        assert self.log is not None and self.builder is not None and self.replayer is not None
        as_of = Lsn(pending.boundary - 1)
        ts_ms = time.time_ns() // 1_000_000
        saved_schemas = dict(self.replayer.emitted_schemas)
        # the membership and columns read before the snapshot was taken, never later ones (which could
        # include a partition attached after the snapshot, whose rows it does not hold)
        published = {t.relid: t for t in pending.tables}
        heads: list[tuple[TableShape, TxContext, list[ProducerRecord]]] = []
        for table in pending.tables:
            shape = self._snapshot_shape(table)
            self._ensure_topic(shape)
            context = TxContext(as_of, pending.reader.xmin, ts_ms, snapshot="true")
            heads.append((shape, context, self._supersede(shape, context) + self.replayer._schema_records(shape, as_of)))
        rows: list[int] = []

        def records() -> Iterator[ProducerRecord | ProducerColumns]:
            held: ProducerColumns | None = None  # held back so that the final read is marked "last"
            status_at = time.monotonic()
            for shape, context, head in heads:
                yield from head
                count = 0
                for block in self._read_blocks(pending.reader, shape, context, tally):
                    if held is not None:
                        yield held
                    held = block
                    count += len(block)
                    if time.monotonic() - status_at >= self.tuning.status_seconds:
                        repl.send_status(self.confirmed, self.confirmed)  # the stream waits; keep it alive
                        status_at = time.monotonic()
                rows.append(count)
            if held is not None:
                yield from _last_marked(held)
            for (shape, _, _), count in zip(heads, rows, strict=True):
                yield self.ledger.record(shape, as_of, count, ts_ms, published.get(shape.relid))

        tally = [0, 0]
        try:
            self.log.append_group(records(), as_of.hex16(), chunk_records=_SNAPSHOT_ITEMS)
        except BaseException:
            self.replayer.emitted_schemas = saved_schemas  # nothing of the group is in the log
            raise
        shapes = [shape for shape, _, _ in heads]
        self.ledger.add(shapes, as_of, published)
        for shape in shapes:
            self.gate.holds.pop(shape.relid, None)
        self.position = as_of
        self.stats.snapshot_rows += sum(rows)
        self.stats.groups += 1
        self._observe(tally[0], tally[1], 0, None)
        log.info("snapshot of %s written: %d rows as of %s", ", ".join(s.qualified for s in shapes), sum(rows), as_of)

    def _drop_table_snapshots(self) -> None:
        """Forget waiting snapshots (their tables are found again by the next discovery)."""
        for pending in self._table_snapshots:
            pending.close()
        self._table_snapshots.clear()
        self.gate.holds.clear()

    def _skip(self, tx: Transaction, repl: ReplicationConnection, pending: list[Transaction]) -> None:
        """A transaction the log already holds: replay it only for its Relation messages."""
        assert self.replayer is not None
        self.replayer.builder.previous_values = discarded_values  # these records are never written
        try:
            for _ in self.replayer.records(tx):
                pass
        finally:
            self.replayer.builder.previous_values = None
        tx.close()
        if not pending and tx.end_lsn > self.confirmed:
            self.confirmed = Lsn(tx.end_lsn)

    def _flush(self, pending: list[Transaction], repl: ReplicationConnection | None) -> None:
        """Append ``pending`` as one group at the last commit LSN, then confirm its end to the server."""
        assert self.log is not None and self.replayer is not None
        # The group is handed to the log as a generator: the log writes it in bounded chunks, so a
        # million-row transaction is never held in memory (its changes wait in a spill file until here).
        tally = [0, 0]
        changes: Iterator[ProducerRecord] = itertools.chain.from_iterable(self.replayer.records(tx) for tx in pending)
        wanted = self.replayer.key_changes(pending, partial=self.replayer.builder.whole_rows)
        if wanted:
            # key changes that leave TOAST values unchanged take them from the old key's row, and so do, on a
            # log that cannot fold partial rows, updates that keep their key (cdc.key_changes)
            values = KeyChangeValues(wanted, LogRows(self.log))
            self.replayer.builder.previous_values = values
            changes = values.watch(changes)
        records = _counted(changes, tally)
        last = pending[-1]
        saved_schemas = dict(self.replayer.emitted_schemas)
        try:
            self.log.append_group(records, _group_position(last).hex16())
        except BaseException:
            self.replayer.emitted_schemas = saved_schemas  # nothing of the group is in the log
            raise
        finally:
            self.replayer.builder.previous_values = None
        self._warn_of_rows_read_back()
        self.stats.events += tally[0]
        self.stats.groups += 1
        self.stats.transactions += len(pending)
        self.position = _group_position(last)
        self.confirmed = Lsn(max(self.confirmed, last.end_lsn))
        self._observe(tally[0], tally[1], len(pending), last.commit_ts_ms)
        for tx in pending:
            tx.close()
        if repl is not None:
            repl.send_status(self.confirmed, self.confirmed)

    def _observe(self, events: int, value_bytes: int, transactions: int, commit_ts_ms: int | None) -> None:
        """Update the exported metrics after a group became durable (snapshot groups have no commit time)."""
        metrics = self.metrics
        metrics.transactions.inc(transactions)
        metrics.bytes.inc(value_bytes)
        metrics.events.inc(events)
        metrics.confirmed_lsn.set(int(self.confirmed))
        if commit_ts_ms is not None:
            metrics.seconds_behind.set(max(0.0, time.time() - commit_ts_ms / 1000))

    def _heartbeat(self, end: Lsn, repl: ReplicationConnection) -> None:
        """Every transaction committed before the server's WAL end ``end`` is in the log: record and confirm it.

        A transaction whose commit record starts exactly at ``end`` may still come, so the log records
        ``end - 1``; the server is told ``end``, from where it resends anything not yet committed.
        """
        assert self.log is not None
        self.log.append_group([], Lsn(end - 1).hex16())
        self.stats.groups += 1
        self.position = Lsn(end - 1)
        self.confirmed = Lsn(max(self.confirmed, end))
        repl.send_status(self.confirmed, self.confirmed)
        self.metrics.confirmed_lsn.set(int(self.confirmed))
        self.metrics.wal_bytes_behind.set(0)
        self.metrics.seconds_behind.set(0)


class _SnapshotStopped(Exception):
    """A stop request during the initial snapshot: its group is abandoned (the log cuts it back)."""


def _group_position(last: Transaction) -> Lsn:
    """The watermark position of a group ending with ``last``: the end of its commit record minus one.

    No transaction commits inside a commit record, so every commit <= that position is in the log, and
    the slot is confirmed at exactly the position plus one (:mod:`cdc.slot_continuity` relies on it).
    """
    return Lsn(max(last.commit_lsn, last.end_lsn - 1))


def _last_marked(block: ProducerColumns) -> list[ProducerRecord | ProducerColumns]:
    """``block`` with its last read marked "last": the read that completes a snapshot."""
    return [block.slice(0, len(block) - 1), mark_last_read(block.record(len(block) - 1))]


#: Items a snapshot group hands the log at a time: records, or blocks of one chunk's reads each.
_SNAPSHOT_ITEMS = 2


def _counted(records: Iterator[ProducerRecord], tally: list[int]) -> Iterator[ProducerRecord]:
    """Pass ``records`` through, adding their number and value bytes to ``tally`` as they go."""
    events = size = 0
    try:
        for record in records:
            events += 1
            value = record[2]
            if value is not None:
                size += len(value)
            yield record
    finally:
        tally[0] += events
        tally[1] += size
