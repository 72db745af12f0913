"""From a committed transaction to log records.

:class:`ChangeReplayer` turns one committed transaction (:class:`~cdc.capture.streaming.Transaction`) into
records lazily, in the order the server sent the changes, numbering them with ``source.sequence``. It
owns the relation cache. Replaying in commit order is what keeps the cache right: the server sends every
Relation message a transaction needs inside it (also inside a streamed one), before the first change that
uses it.

Outbox events (:mod:`cdc.capture.outbox`, :mod:`cdc.capture.outbox_table`) travel among the row changes:
the replayer turns a transactional outbox message the assembler kept, or a row inserted into an outbox
table, into an event among the transaction's records, taking the transaction's next ``sequence``.

Guarantees: records of a transaction come out in change order; a transaction's schema record
precedes its first event that uses a new shape; nothing is emitted for an aborted transaction (nor for an
aborted subtransaction of a streamed one); no event of a table is emitted unless its gate
(:class:`~cdc.capture.table_snapshots.TableGate`) admits the table for the transaction, which it does only
once the table's snapshot is in the log or ordered before the transaction.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from cdc.capture.added_column_fills import filled_values
from cdc.capture.catalog import Catalog
from cdc.capture.errors import SourceError
from cdc.capture.events import EventBuilder, TxContext, new_record
from cdc.capture.key_changes import discarded_values, read_back_key
from cdc.capture.lsn import Lsn
from cdc.capture.outbox import UNSURE, Outbox, Rejected
from cdc.capture.outbox_table import OutboxColumns, RoutedTable, raw_values, text_values
from cdc.capture.pgoutput.decoder import Decoder
from cdc.capture.pgoutput.messages import (
    UNCHANGED,
    Delete,
    Insert,
    LogicalMessage,
    Relation,
    Truncate,
    TypeInfo,
    Update,
)
from cdc.capture.published_tables import TableInfo
from cdc.capture.row_codec import InsertEncoder
from cdc.capture.streaming import Transaction
from cdc.capture.tables import TableShape
from cdc.errors import ConfigError
from event_format.masks import MESSAGE_PREFIX
from log_store.record import ProducerRecord

if TYPE_CHECKING:
    from cdc.capture.table_snapshots import TableGate

log = logging.getLogger("cdc.capture")

_XID = struct.Struct("!I")
_I32 = struct.Struct("!i")
_LSN = struct.Struct("!Q")
_U32 = struct.Struct("!I")
#: the top-level ``ts_ms`` of fast-path inserts is read from the clock once per this many events
_CLOCK_EVERY = 1024


TableFilter = Callable[[str, str], bool]
#: A table's last schema record: its fingerprint (:meth:`~cdc.capture.tables.TableShape.fingerprint`) and value.
EmittedSchema = tuple[bytes, bytes]


def _attribute_numbers(columns: list[tuple[str, int, int]], info: TableInfo | None) -> tuple[tuple[str, int], ...]:
    """The attribute number of each column of a Relation message, from the catalog read since.

    The catalog may already be past the message (a rename after it): a column is matched by name when
    the catalog has it at the same place, else by place when the catalog has as many columns and the
    same type there (renamed since), else by name anywhere; unmatched columns get 0 (unknown).
    """
    if info is None:
        return ()
    sent = {name for name, _, _ in columns}  # a generated column only when published (PostgreSQL 18)
    catalog = [
        (column, number)
        for column, (_, number) in zip(info.columns, info.attnums, strict=False)
        if column[0] not in info.generated or column[0] in sent
    ]
    by_name = {column[0]: number for column, number in catalog}
    out = []
    for index, (name, type_oid, _) in enumerate(columns):
        number = by_name.get(name, 0)
        if index < len(catalog) and len(catalog) == len(columns):
            (catalog_name, catalog_type, _), at = catalog[index]
            if catalog_name == name or (catalog_type == type_oid and name not in by_name):
                number = at
        out.append((name, number))
    return tuple(out)


class ChangeReplayer:
    """Owns the relation cache; turns committed transactions into records for the log.

    ``emitted_schemas`` maps ``schema.table`` to the fingerprint and value of the record last written to
    the schema topic (loaded from the log at start), so a restart does not write the same schema record
    twice, and a new record carries the earlier versions on (:func:`~cdc.capture.tables.earlier_versions`). ``gate``, when
    given, is asked once per table and transaction whether the table's events may be written; a table
    it refuses contributes nothing to the transaction's records (not even a schema record).
    """

    def __init__(
        self,
        builder: EventBuilder,
        catalog: Catalog,
        topic_for: Callable[[str, str], str],
        include: TableFilter,
        emitted_schemas: dict[str, EmittedSchema] | None = None,
        on_new_shape: Callable[[TableShape], None] | None = None,
        gate: TableGate | None = None,
    ) -> None:
        self.builder = builder
        self.catalog = catalog
        self.topic_for = topic_for
        self.include = include
        self.relations: dict[int, TableShape] = {}
        self.type_names: dict[int, str] = {}
        self.emitted_schemas: dict[str, EmittedSchema] = dict(emitted_schemas or {})
        self.on_new_shape = on_new_shape
        self.gate = gate
        #: told of each request message (:mod:`cdc.capture.reads.snapshot_requests`) of a transaction written to
        #: the log, with the transaction's commit time (milliseconds); the records it returns (the ledger's
        #: note of the request) go into the same group
        self.on_message: Callable[[LogicalMessage, int], list[ProducerRecord]] | None = None
        #: the outbox rules (:mod:`cdc.capture.outbox`): outbox messages become events of their own topics
        self.outbox: Outbox | None = None
        #: makes an outbox topic (or the dead-letter topic) before its first record is written
        self.ensure_events_topic: Callable[[str], None] = lambda topic: None
        #: the outbox tables by ``(schema, table)`` (:mod:`cdc.capture.outbox_table`): routed, not captured
        self.outbox_tables: dict[tuple[str, str], OutboxColumns] = {}
        self._routed: dict[int, RoutedTable] = {}  # by relation id, from their Relation messages
        self._replaying = False

    def shape_from_relation(self, relation: Relation) -> TableShape:
        """The table's shape from a Relation message; the key is the primary key whenever the old key the
        server sends holds it (replica identity FULL, or an index over it), else the identity's columns."""
        columns = [(c.name, c.type_oid, c.typmod) for c in relation.columns]
        info: TableInfo | None
        try:
            info = self.catalog.table(relation.relid)
        except SourceError:
            info = None  # dropped since: keys and nullability then come from the message alone
        flagged = [c.name for c in relation.columns if c.key]
        if (
            info is not None
            and info.primary_key
            and (relation.replica_identity == "full" or set(info.primary_key) <= set(flagged))
        ):
            # the primary key stays the event key whatever the replica identity (FULL flags every column,
            # an index may hold more columns than the key): a key that moved would split a row in two
            keys = list(info.primary_key)
        elif relation.replica_identity == "full":
            keys = []
        else:
            keys = flagged
        type_names = dict(self.type_names)
        type_names.update(self.catalog.type_names)
        return TableShape.build(
            relation.relid,
            relation.namespace,
            relation.name,
            self.topic_for(relation.namespace, relation.name),
            columns,
            keys,
            not_null=info.not_null if info else frozenset(),
            type_names=type_names,
            attnums=_attribute_numbers(columns, info),
            masks=self.catalog.stream_masks(relation.namespace, relation.name),
        )

    @contextmanager
    def tentative_schemas(self) -> Iterator[None]:
        """Forget the schema records handed out inside the block when it fails: nothing of the group they
        went into is in the log, so the next group must write them again."""
        saved = dict(self.emitted_schemas)
        try:
            yield
        except BaseException:
            self.emitted_schemas = saved
            raise

    def replay_relations(self, tx: Transaction) -> None:
        """Replay a transaction the log already holds only to follow its Relation messages (the server
        resends what each transaction needs), then close it; its records are thrown away."""
        self._replaying = True
        try:
            with self.builder.previous_values_from(discarded_values):
                for _ in self.records(tx):
                    pass
        finally:
            self._replaying = False
            tx.close()

    def schema_records(self, shape: TableShape, lsn: int, sequence: int = 0, *, stream: bool = False) -> list[ProducerRecord]:
        """The schema record of ``shape`` as of ``(lsn, sequence)`` when its columns differ from the last
        one written (empty otherwise); a new one is noted as written and reported to ``on_new_shape``.

        ``stream``: the record precedes the first streamed event with these columns, so a column added
        since with a stored default gets the value the older rows hold (:mod:`cdc.capture.added_column_fills`);
        a snapshot's rows hold every value themselves."""

        fingerprint = shape.fingerprint()
        emitted = self.emitted_schemas.get(shape.log_name)
        if emitted is not None and emitted[0] == fingerprint:
            return []
        previous = emitted[1] if emitted is not None else None
        filled = filled_values(self.catalog, shape, previous) if stream else None
        record = self.builder.schema(shape, lsn, previous, sequence, filled)
        self.emitted_schemas[shape.log_name] = (fingerprint, record.value or b"")
        if self.on_new_shape is not None:
            self.on_new_shape(shape)
        return [record]

    def _admitted(
        self, admitted: dict[int, bool], shape: TableShape, commit_lsn: int, sequence: int
    ) -> list[ProducerRecord] | None:
        """None when ``shape``'s events of this transaction are held back; else the records to write
        before its first event (``admitted``: per table, whether this transaction writes its events)."""
        allowed = admitted.get(shape.relid)
        if allowed is not None:
            return [] if allowed else None
        head = self._first_use(shape, commit_lsn, sequence)
        admitted[shape.relid] = head is not None
        return head

    def _decoded(self, message: object, admitted: dict[int, bool], context: TxContext) -> Iterator[ProducerRecord]:
        """The records of one decoded message of the transaction ``context`` describes; a Relation or
        Type message updates the caches instead."""
        builder = self.builder
        if isinstance(message, Insert) and message.relid in self._routed:
            if not self._replaying:
                yield self._routed_event(self._routed[message.relid], text_values(message.new), context)
        elif isinstance(message, (Insert, Update, Delete)):
            shape = self.relations.get(message.relid)
            head = self._admitted(admitted, shape, context.lsn, context.sequence) if shape is not None else None
            if shape is None or head is None:
                return
            yield from head
            if isinstance(message, Insert):
                yield from builder.insert(shape, message.new, context)
            elif isinstance(message, Update):
                yield from builder.update(shape, message.old_kind, message.old, message.new, context)
            else:
                yield from builder.delete(shape, message.old_kind, message.old, context)
        elif isinstance(message, Truncate):
            for relid in message.relids:
                shape = self.relations.get(relid)
                if shape is not None and (self.gate is None or self.gate.admits(shape, context.lsn)):
                    yield from builder.truncate(shape, context)
        elif isinstance(message, Relation):
            if (message.namespace, message.name) in self.outbox_tables:
                self._route(message)
            elif self.include(message.namespace, message.name):
                self.relations[message.relid] = self.shape_from_relation(message)
                admitted.pop(message.relid, None)
            else:
                self.relations.pop(message.relid, None)
        elif isinstance(message, TypeInfo):
            self.type_names[message.oid] = message.name
        elif isinstance(message, LogicalMessage):
            if message.prefix == MESSAGE_PREFIX:  # masks change here, in a replay of a held transaction too
                self._masks_changed(message.content, admitted)
            elif self.outbox is not None and self.outbox.claims(message.prefix):
                if not self._replaying:
                    yield self._outbox_event(self.outbox, message.prefix, message.content, message.lsn, context)
            elif self.on_message is not None and not self._replaying:
                yield from self.on_message(message, context.ts_ms)

    def _outbox_event(
        self, outbox: Outbox, topic: str, content: bytes, message_lsn: int, context: TxContext, unsure: str | None = None
    ) -> ProducerRecord:
        """The record of one outbox message (its prefix ``topic``, ``content`` and LSN) of the transaction
        ``context`` describes: the event, or its dead letter (said in one warning line with the LSN;
        ``unsure``: why it is a dead letter, said once per transaction by the caller). It takes the next
        sequence of the transaction, so ``(lsn, sequence)`` orders it among the transaction's row changes."""
        result = outbox.message_event(
            topic, content, message_lsn, context.lsn, context.messages, context.sequence, context.ts_ms, unsure
        )
        context.messages += 1
        context.sequence += 1
        if isinstance(result, Rejected) and unsure is None:
            log.warning(
                "outbox message %r at LSN %s (transaction committed at %s) is not published: %s; it is written to %s",
                topic,
                Lsn(message_lsn),
                Lsn(context.lsn),
                result.reason,
                outbox.dead_letters,
            )
        return self._written(result)

    def _written(self, result: ProducerRecord | Rejected) -> ProducerRecord:
        """The record to write for ``result`` (its dead letter when rejected), its topic made."""
        record = result.record if isinstance(result, Rejected) else result
        self.ensure_events_topic(record.topic)
        return record

    def _route(self, relation: Relation) -> None:
        """An outbox table's Relation message: where the parts of its rows are from now on."""
        self.relations.pop(relation.relid, None)
        bound = self.outbox_tables[(relation.namespace, relation.name)].bind(relation)
        if isinstance(bound, str):  # its inserts would be lost: stop, the slot keeps them until it is fixed
            raise ConfigError(
                f"outbox table {relation.namespace}.{relation.name} cannot be routed: {bound}; name the columns that hold "
                f'each part in [outbox."{relation.namespace}.{relation.name}"] of the views file (`cdc setup --check-only` '
                "checks it)"
            )
        self._routed[relation.relid] = bound

    def _routed_event(self, routed: RoutedTable, raw: list[bytes | None], context: TxContext) -> ProducerRecord:
        """The event of a row inserted into an outbox table (:mod:`cdc.capture.outbox_table`; ``raw``: its
        columns), or its dead letter (said in one warning line); it takes the transaction's next sequence."""
        outbox = self.outbox
        assert outbox is not None, "outbox tables are routed by the outbox rules"
        result = routed.event(outbox, raw, context.lsn, context.lsn, context.sequence, context.ts_ms)
        context.sequence += 1
        if isinstance(result, Rejected):
            log.warning(
                "a row inserted into outbox table %s (transaction committed at %s) is not published: %s; it is written to %s",
                routed.name,
                Lsn(context.lsn),
                result.reason,
                outbox.dead_letters,
            )
        return self._written(result)

    def _masks_changed(self, content: bytes, admitted: dict[int, bool]) -> None:
        """The stream reached a change of the publication's masks (:mod:`event_format.masks`): every later
        event is masked the new way. Each table whose masks changed gets a new shape, and so a schema
        record before its next event; its re-read follows, as for any change of a table's rule."""
        if not self.catalog.masks_message(content):
            return
        for relid, shape in list(self.relations.items()):
            masked = shape.with_masks(self.catalog.stream_masks(shape.schema, shape.table))
            if masked is not shape:
                self.relations[relid] = masked
                admitted.pop(relid, None)

    def _first_use(self, shape: TableShape, commit_lsn: int, sequence: int = 0) -> list[ProducerRecord] | None:
        """None when the table's events of this transaction are held back, else the records to write first."""
        if self.gate is not None and not self.gate.admits(shape, commit_lsn):
            return None
        return self.schema_records(shape, commit_lsn, sequence, stream=True)

    def key_changes(self, txs: list[Transaction], *, partial: bool = False) -> set[tuple[str, bytes]]:
        """``(topic, old key)`` of every update in ``txs`` that changes a row's key and leaves TOAST
        values unchanged (see :mod:`cdc.capture.key_changes`); with ``partial``, also ``(topic, key)`` of every
        update that keeps its key and leaves TOAST values unchanged (a log that cannot fold partial rows
        gets whole ones). Empty when no transaction holds such an update.

        A first pass over the group without side effects on what is written: only Relation, Type and
        Update messages are decoded, the relation cache is followed on a copy.
        """
        if not partial and not any(tx.key_changes for tx in txs):
            return set()
        relations = dict(self.relations)
        wanted: set[tuple[str, bytes]] = set()
        for tx in txs:
            decoder = Decoder()
            decoder.in_stream = tx.streamed
            for lsn, payload in tx.changes.positioned():
                if payload[0] not in b"RYU":
                    continue
                if tx.streamed and tx.aborted_subxids and _XID.unpack_from(payload, 1)[0] in tx.aborted_subxids:
                    continue
                message = decoder.decode(payload, lsn)
                if isinstance(message, Relation):
                    if self.include(message.namespace, message.name):
                        relations[message.relid] = self.shape_from_relation(message)
                    else:
                        relations.pop(message.relid, None)
                elif isinstance(message, TypeInfo):
                    self.type_names[message.oid] = message.name
                elif (
                    isinstance(message, Update)
                    and UNCHANGED in message.new
                    and message.old_kind != "O"
                    and (partial or (message.old_kind == "K" and message.old is not None))
                ):
                    # (a whole old row, 'O', holds every unchanged value itself: nothing to read back)
                    shape = relations.get(message.relid)
                    old_key = read_back_key(shape, message, partial) if shape is not None else None
                    if shape is not None and old_key is not None:
                        wanted.add((shape.topic, old_key))
        return wanted

    def records(self, tx: Transaction) -> Iterator[ProducerRecord]:
        """Every record of ``tx`` in change order; schema records precede the events using them.

        Inserts take the fast path (:meth:`EventBuilder.insert_payload`, straight from the payload
        bytes); every other message, and an insert that path declines, goes through the decoder.
        """
        decoder = Decoder()
        decoder.in_stream = tx.streamed
        context = TxContext(tx.commit_lsn, tx.xid, tx.commit_ts_ms)
        builder = self.builder
        relations = self.relations
        aborted = tx.aborted_subxids if tx.streamed else None
        admitted: dict[int, bool] = {}  # per table: whether its events of this transaction are written
        # per admitted table: (shape, insert encoder, envelope template, topic) of the insert fast path
        fast: dict[int, tuple[TableShape, InsertEncoder, bytes, str]] = {}
        relid_at = 5 if tx.streamed else 1  # a streamed transaction's data messages lead with their xid
        unpack_u32 = _U32.unpack_from
        commit_ts = tx.commit_ts_ms
        now_ms = time.time_ns() // 1_000_000
        countdown = _CLOCK_EVERY
        outbox = None if self._replaying else self.outbox  # a replay for Relation messages writes no event
        # outbox messages' fast path: 'M', [xid], flags, Int64 LSN, prefix NUL, Int32 length, content
        outbox_prefix, prefix_at = (outbox.prefix_bytes if outbox is not None else b""), relid_at + 9
        topics: dict[bytes, str] = {}
        warned = False  # of outbox messages that may belong to a rolled-back subtransaction
        for lsn, payload in tx.changes.positioned():
            if aborted and _XID.unpack_from(payload, 1)[0] in aborted and payload[0] in b"IUDTM":
                continue
            if payload[0] == 0x49 and len(payload) > relid_at + 6 and payload[relid_at + 4] == 0x4E:  # Insert, new tuple
                relid = unpack_u32(payload, relid_at)[0]
                shape = relations.get(relid)
                if shape is None:
                    routed = self._routed.get(relid)  # an outbox table's row: an event of its own
                    raw = raw_values(payload, relid_at + 5) if routed is not None and outbox is not None else None
                    if routed is not None and raw is not None:
                        yield self._routed_event(routed, raw, context)
                    elif routed is not None:  # (a replay writes no event; the decoder names a malformed tuple)
                        yield from self._decoded(decoder.decode(payload, lsn), admitted, context)
                    continue
                entry = fast.get(relid)
                if entry is None or entry[0] is not shape:
                    head = self._admitted(admitted, shape, tx.commit_lsn, context.sequence)
                    if head is None:
                        continue
                    yield from head
                    entry = (shape, shape.codec.insert_encoder(), builder.insert_template(shape, context), shape.topic)
                    fast[relid] = entry
                countdown -= 1
                if not countdown:
                    now_ms, countdown = time.time_ns() // 1_000_000, _CLOCK_EVERY
                try:
                    encoded = entry[1](payload, relid_at + 5, entry[2], context.sequence, now_ms)
                except (IndexError, ValueError, struct.error):
                    encoded = None  # malformed: the decoder below raises the DecodeError that names it
                if encoded is not None:
                    context.sequence += 1
                    yield new_record((entry[3], encoded[0], encoded[1], commit_ts, ()))
                    continue
            if (
                outbox_prefix
                and payload[0] == 0x4D
                and payload.startswith(outbox_prefix, prefix_at)
                and payload[relid_at] & 1
                and (end := payload.find(b"\0", prefix_at)) > 0
                and len(payload) >= end + 5
                and len(payload) == end + 5 + _I32.unpack_from(payload, end + 1)[0]
            ):  # a whole transactional outbox message: its parts without the decoder
                raw_topic = payload[prefix_at:end]
                topic = topics.get(raw_topic) or topics.setdefault(raw_topic, raw_topic.decode("utf-8", "replace"))
                parts = (topic, payload[end + 5 :], _LSN.unpack_from(payload, relid_at + 1)[0])
            else:
                message = decoder.decode(payload, lsn)
                if outbox is None or not isinstance(message, LogicalMessage) or not outbox.claims(message.prefix):
                    yield from self._decoded(message, admitted, context)
                    continue
                parts = (message.prefix, message.content, message.lsn)
            if outbox is not None:  # (always: the message is an outbox message)
                unsure = bool(aborted) and lsn < tx.last_abort
                if unsure and not warned:
                    warned = True
                    log.warning(
                        "the transaction committed at %s was streamed before its commit and rolled back a subtransaction "
                        "(at %s); pgoutput does not say which subtransaction a logical message belongs to, so its outbox "
                        "messages emitted before that rollback are written to %s, not published; keep transactions that "
                        "emit outbox events under logical_decoding_work_mem, or without ROLLBACK TO SAVEPOINT",
                        Lsn(tx.commit_lsn),
                        Lsn(tx.last_abort),
                        outbox.dead_letters,
                    )
                yield self._outbox_event(outbox, *parts, context, UNSURE if unsure else None)
