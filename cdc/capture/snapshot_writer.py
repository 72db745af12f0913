"""One writer for both kinds of snapshot: the initial one, and tables that join later (:mod:`cdc.capture.table_snapshots`).

What a snapshot puts in the log, in this order per table:

* truncate markers (``op=t``, ``source.snapshot`` "true", sequence 0, on every partition) when the
  table's topic already holds records, left by an interrupted attempt (its groups were durable, and a
  row deleted since would otherwise never be deleted downstream): a consumer applying events in
  ``(lsn, sequence)`` order empties the table there and then sees exactly the new reads (compaction
  keeps the marker, the latest record of its key, after any stale row it keeps). The initial snapshot
  also writes the markers alone on the topic of a table an earlier attempt read but this one no longer
  captures;
* a tombstone (at ``(as_of, 0)``) for every key the topic holds, when the table is read again because
  the publication's column list or row filter changed (or may have: a topic without a ledger record
  under the rule now), or its events are keyed by other columns now (a new primary key or replica
  identity index, :mod:`cdc.capture.key_marks`): the reads then supersede the records of every key they read again, and the
  tombstones those of keys the new rule no longer publishes, so compaction removes every record written
  under the old rule (the truncate markers alone hide them from consumers, but compaction keeps a key's
  latest record whatever comes after it);
* its schema record, when the table's columns differ from the last one written;
* its reads, a block of columns per chunk.

The very last read is marked "last", and the ledger's records (``<prefix>.__snapshots``) follow it.
They form the final part, which always goes into the group at the snapshot's position ``as_of``, so a
snapshot that was cut short never looks complete. The initial snapshot writes the parts before it in
groups at position 0 (one fsync each, memory bounded); a table read beside the stream
(:mod:`cdc.capture.reads.online_read`, :meth:`SnapshotWriter.start_online`) writes a group per chunk at the
stream's position, with a progress record each when read by key, and its final part (the last rows,
the held changes, the progress tombstone, the ledger record) in the last. Schema records handed out for
a group the log did not take are forgotten again, so the next attempt writes them too.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import closing
from dataclasses import dataclass, field

from cdc.capture.catalog import Catalog
from cdc.capture.change_replayer import ChangeReplayer
from cdc.capture.column_marks import key_changed
from cdc.capture.events import EventBuilder, ReadEncoder, TxContext, mark_last_read, tombstone_headers
from cdc.capture.lsn import Lsn
from cdc.capture.published_tables import PublishedTable, rule_of
from cdc.capture.reads.read_conditions import with_row_filter
from cdc.capture.snapshot import SnapshotReader
from cdc.capture.table_snapshots import ReadProgress, SnapshotLedger
from cdc.capture.tables import TableShape
from event_format import is_truncate_key
from event_format.masks import Mask
from log_store import ProducerColumns, ProducerRecord, TopicPartition
from log_store.log import Log

#: Items a snapshot group hands the log at a time: records, or blocks of one chunk's reads each.
_SNAPSHOT_ITEMS = 2

Item = ProducerRecord | ProducerColumns


def held_keys(log: Log, topic: str) -> list[bytes]:
    """The keys of the rows ``topic`` holds: every key whose latest record is not a tombstone, truncate
    markers left out (read from each partition's start)."""
    held: dict[bytes, None] = {}
    for partition in range(log.partitions(topic)):
        tp = TopicPartition(topic, partition)
        offset, end = log.start_offset(tp), log.end_offset(tp)
        while offset < end and (batch := log.read(tp, offset)):
            for record in batch:
                if is_truncate_key(record.key) or record.key is None:
                    continue
                if record.value is None:
                    held.pop(record.key, None)
                else:
                    held[record.key] = None
            offset = batch[-1].offset + 1
    return list(held)


def published_shape(catalog: Catalog, topic_for: Callable[[str, str], str], table: PublishedTable) -> TableShape:
    """The shape of a published table as the catalog has it now, keyed by its primary key, else by the
    index its replica identity names (no key: replica identity FULL or nothing).

    Only the columns the publication publishes are in it (as in the Relation messages pgoutput sends),
    so a read never selects another; a key the column list leaves out is no key (the stream's events
    carry no value of it either)."""
    info = catalog.table(table.relid)
    keys = info.primary_key or (info.identity_key if info.replica_identity == "index" else ())
    columns = table.published_columns(info)
    if not all(table.publishes(key) for key in keys):
        keys = ()
    return TableShape.build(
        table.relid,
        table.schema,
        table.table,
        topic_for(table.schema, table.table),
        columns,
        list(keys),
        not_null=info.not_null,
        type_names=catalog.type_names,
        attnums=info.attnums,
        masks=catalog.mask_functions({column: Mask.parse(spec) for column, spec in table.masks}),
    )


@dataclass
class _Table:
    """One table of a snapshot: what goes before its reads, and how many rows it had."""

    published: PublishedTable
    shape: TableShape
    context: TxContext
    head: list[ProducerRecord]
    rows: int = 0
    #: the condition of a partial read (``cdc snapshot --where``): no markers, no ledger record
    condition: str | None = None


@dataclass
class SnapshotWritten:
    """What a snapshot put in the log."""

    shapes: list[TableShape] = field(default_factory=list)
    rows: int = 0
    events: int = 0
    value_bytes: int = 0
    groups: int = 0


@dataclass(frozen=True)
class KeysetPlan:
    """How a table is read beside the stream by key: its primary key in index order, the key of the last
    row already in the log (``None``: from the start), the rows already there, the boundary of this run,
    and the boundary and last key of each earlier run of a resumed read."""

    keys: tuple[str, ...]
    after: tuple[str, ...] | None
    rows: int
    boundary: int
    earlier: tuple[tuple[int, tuple[str, ...] | None], ...] = ()


@dataclass
class OnlineParts:
    """A snapshot written a part at a time beside the stream (:meth:`SnapshotWriter.start_online`)."""

    heads: list[_Table]
    parts: Iterator[tuple[Iterable[Item] | None, bool]]
    written: SnapshotWritten
    as_of: Lsn
    done: bool = False
    #: the progress of a read by key as far as the log holds it (the last part appended), and that of
    #: the part about to be appended
    progress: ReadProgress | None = None
    upcoming: ReadProgress | None = None
    #: whether the final part may be written: a read's last rows wait until the stream received every
    #: transaction its snapshot sees (:mod:`cdc.capture.reads.online_read`)
    may_finish: Callable[[], bool] = lambda: True
    #: every row is read and the final part waits for :attr:`may_finish` (the read is then neither
    #: renewed nor suspended: its last rows would be read again)
    finishing: bool = False
    #: the runs whose snapshot may see transactions the log does not hold yet, for the progress records
    recent_snapshots: Callable[[], tuple[tuple[int, str, int], ...]] = lambda: ()
    #: the holding file's lasting caps, for the progress records
    held_caps: Callable[[], tuple[tuple[int, int], ...]] = lambda: ()
    #: by log name, what the replayer noted as written of a table's schema before this read handed out a
    #: schema record the log does not hold yet (it waits in a part not appended)
    unwritten_schemas: dict[str, tuple[bytes, bytes] | None] = field(default_factory=dict)
    #: the replayer that noted them, told again what the log holds when the read stops first
    replayer: ChangeReplayer | None = None

    @property
    def rows(self) -> int:
        """Rows read so far."""
        return sum(head.rows for head in self.heads)

    def close(self) -> None:
        """Stop reading (the reader's threads end). A schema record handed out for a part never appended
        is noted as unwritten again, so that the table's next read (or event) writes it: else the log
        would hold the table's rows without its columns."""
        close = getattr(self.parts, "close", None)
        if close is not None:
            close()
        if self.replayer is not None and not self.done:
            for name, previous in self.unwritten_schemas.items():
                if previous is None:
                    self.replayer.emitted_schemas.pop(name, None)
                else:
                    self.replayer.emitted_schemas[name] = previous
        self.unwritten_schemas.clear()


@dataclass
class SnapshotWriter:
    """Writes snapshots into ``log`` (see the module's docstring for what and in which order)."""

    log: Log
    builder: EventBuilder
    replayer: ChangeReplayer
    ledger: SnapshotLedger
    shape_of: Callable[[PublishedTable], TableShape]
    ensure_topic: Callable[[TableShape], None]
    #: rows per chunk of a read beside the stream (``CDC_SNAPSHOT_CHUNK_ROWS``)
    online_chunk_rows: int = 20_000

    def start_online(
        self,
        tables: list[PublishedTable],
        reader: SnapshotReader,
        as_of: Lsn,
        held: Callable[[], Iterable[Item]],
        plans: Mapping[int, KeysetPlan] | None = None,
        conditions: Mapping[int, str] | None = None,
    ) -> OnlineParts:
        """A read of ``tables`` beside the stream (:mod:`cdc.capture.reads.online_read`), written a part at a
        time by :meth:`write_next`: the first part holds the markers and schema records and the first
        chunk, the final one the last rows, then ``held()``'s records, then the ledger records.

        ``plans``: by OID, the tables read by key (keyset pagination), whose every part carries a progress
        record (:class:`~cdc.capture.table_snapshots.ReadProgress`); a plan that resumes an earlier read
        writes no markers and starts past its key. Other tables are read by block ranges.

        ``conditions``: by OID, the tables of which only the rows a condition selects are read (a partial
        read, ``cdc snapshot --where``): the log keeps its other rows, so no markers go before them, and
        the ledger's record of the table stays as it is."""
        online = OnlineParts([], iter(()), SnapshotWritten(), as_of, replayer=self.replayer)
        online.parts = self._online_parts(online, tables, reader, as_of, held, plans or {}, conditions or {})
        return online

    def write_next(self, online: OnlineParts, position: str) -> bool:
        """Append the next part of ``online`` as a group at ``position``; whether it was the final one
        (the ledger then covers its tables). Schema records of a part the log did not take are
        written again with the next attempt."""
        with self.replayer.tentative_schemas():
            items, final = next(online.parts)
            if items is None:  # the final part waits for the stream
                return False
            self.log.append_group(items, position, chunk_records=_SNAPSHOT_ITEMS)
        online.unwritten_schemas.clear()  # the heads built so far went into this part
        online.written.groups += 1
        online.progress = online.upcoming
        if final:
            heads = online.heads
            whole = [h for h in heads if h.condition is None]  # a partial read leaves the ledger's record as it is
            self.ledger.add((h.shape for h in whole), online.as_of, {h.shape.relid: h.published for h in whole})
            online.written.shapes = [h.shape for h in heads]
            online.written.rows = sum(h.rows for h in heads)
            online.done = True
        return final

    def _online_parts(
        self,
        online: OnlineParts,
        tables: list[PublishedTable],
        reader: SnapshotReader,
        as_of: Lsn,
        held: Callable[[], Iterable[Item]],
        plans: Mapping[int, KeysetPlan],
        conditions: Mapping[int, str],
    ) -> Iterator[tuple[Iterable[Item] | None, bool]]:
        ts_ms = time.time_ns() // 1_000_000
        for published in tables:
            name = published.log_name
            online.unwritten_schemas.setdefault(name, self.replayer.emitted_schemas.get(name))
            plan = plans.get(published.relid)
            condition = conditions.get(published.relid)
            if (plan is not None and plan.after is not None) or condition is not None:
                shape = self.shape_of(published)
                self.ensure_topic(shape)
                context = TxContext(as_of, reader.xmin, ts_ms, snapshot="true")
                rows = plan.rows if plan is not None else 0
                head = self.replayer.schema_records(shape, as_of)
                online.heads.append(_Table(published, shape, context, head, rows, condition))
            else:
                online.heads.append(self._table(published, as_of, reader.xmin, ts_ms))
        carry: list[Item] = []
        last: ProducerColumns | None = None  # held back so that the final read is marked "last"
        progress: list[Item] = []
        state: ReadProgress | None = None
        for table in online.heads:
            carry += table.head
            encode = self.builder.read_encoder(table.shape, table.context)
            plan = plans.get(table.shape.relid)
            for block, key in self._online_blocks(table, reader, encode, plan):
                table.context.sequence += len(block)
                table.rows += len(block)
                online.written.events += len(block)
                online.written.value_bytes += block.value_bytes()
                if last is not None:
                    online.upcoming = state
                    yield [*carry, last, *progress], False
                    carry = []
                last = block
                progress, state = [], None
                if plan is not None:
                    fingerprint = table.shape.fingerprint().hex()
                    state = ReadProgress(
                        table.shape.relid, table.shape.topic, plan.boundary, key, table.rows, fingerprint, plan.earlier,
                        table.condition, online.recent_snapshots(), online.held_caps(),
                    )  # fmt: skip
                    progress = [self.ledger.progress_record(table.shape, state, ts_ms)]
        online.upcoming = None
        final: list[Item] = carry
        if last is not None:
            final += [last.slice(0, len(last) - 1), mark_last_read(last.record(len(last) - 1))]
        online.finishing = True
        while not online.may_finish():
            yield None, False
        done: list[Item] = [self.ledger.progress_done(t.shape, ts_ms) for t in online.heads if t.shape.relid in plans]
        done += [record for t in online.heads for record in self.ledger.asked_done(t.shape.log_name, t.condition, ts_ms)]
        ledger: list[Item] = [
            self.ledger.record(t.shape, as_of, t.rows, ts_ms, t.published) for t in online.heads if t.condition is None
        ]
        yield itertools.chain(final, held(), done, ledger), True

    def _online_blocks(
        self, table: _Table, reader: SnapshotReader, encode: ReadEncoder, plan: KeysetPlan | None
    ) -> Iterator[tuple[ProducerColumns, tuple[str, ...] | None]]:
        """The table's chunks with the key of each one's last row: by key past the plan's, else by block range;
        of the rows the publication's row filter and the read's condition select."""
        row_filter = with_row_filter(table.published.row_filter, table.condition)
        if plan is None:
            for block in reader.column_chunks(table.shape, encode, self.online_chunk_rows, row_filter=row_filter):
                yield block, None
            return
        rows = reader.rows_within(table.shape.relid, self.online_chunk_rows)
        chunks = reader.keyset_chunks(table.shape, encode, plan.keys, plan.after, 0, rows, row_filter=row_filter)
        with closing(chunks):
            yield from chunks

    def _table(self, table: PublishedTable, as_of: Lsn, xmin: int, ts_ms: int) -> _Table:
        """A table's shape, with its topic made, and the records that precede its reads."""
        shape = self.shape_of(table)
        self.ensure_topic(shape)
        context = TxContext(as_of, xmin, ts_ms, snapshot="true")
        head = self._supersede(shape, context)
        if head and self._rule_changed(table):
            position = tombstone_headers(as_of, 0)
            head += [ProducerRecord(shape.topic, key, None, ts_ms, position) for key in held_keys(self.log, shape.topic)]
        head += self.replayer.schema_records(shape, as_of)
        return _Table(table, shape, context, head)

    def _rule_changed(self, table: PublishedTable) -> bool:
        """Whether the records the log holds of ``table`` may have been written under another column list
        or row filter than the publication's now (the ledger's record of it names another, or none), or
        keyed by other columns (:mod:`cdc.capture.key_marks`)."""
        entry = self.ledger.entries.get(table.log_name)
        if entry is None or entry.membership is None or rule_of(entry.membership) != rule_of(table.membership):
            return True
        return entry.columns is not None and key_changed(entry.columns, table.columns)

    def _topic_has_records(self, topic: str) -> bool:
        return topic in self.log.topics() and any(
            self.log.end_offset(TopicPartition(topic, p)) > 0 for p in range(self.log.partitions(topic))
        )

    def _supersede(self, shape: TableShape, context: TxContext) -> list[ProducerRecord]:
        """Truncate markers (sequence 0 of ``context``) when the table's topic already holds records."""
        return self.builder.truncate(shape, context) if self._topic_has_records(shape.topic) else []

    def supersede_uncaptured(
        self, captured: set[str], uncaptured: Mapping[str, tuple[str, str]], as_of: Lsn, ts_ms: int
    ) -> list[ProducerRecord]:
        """Truncate markers for the topics of tables an interrupted snapshot read but this one does not."""
        records: list[ProducerRecord] = []
        for topic, (schema, table) in sorted(uncaptured.items()):
            if topic not in captured and self._topic_has_records(topic):
                shape = TableShape(0, schema, table, topic, ())
                records.extend(self._supersede(shape, TxContext(as_of, 0, ts_ms, snapshot="true")))
        return records
