"""From pgoutput payloads to committed transactions, and from a committed transaction to log records.

:class:`TransactionAssembler` reads the stream in server order and returns each transaction when it
commits, with its change messages kept as raw payloads in a :class:`~cdc.spill.SpillBuffer` (memory
bounded: a million-row transaction sits on disk, not in memory). It handles both a plain transaction
(Begin ... Commit, protocol 1) and a streamed in-progress one (protocol 2: blocks of Stream Start ...
Stream Stop, then Stream Commit, or Stream Abort which discards the transaction or one subtransaction).

:class:`ChangeReplayer` turns one committed transaction into records lazily, in the order the server
sent the changes, numbering them with ``source.sequence``. It owns the relation cache. Replaying in
commit order is what keeps the cache right: the server sends every Relation message a transaction
needs inside it (also inside a streamed one), before the first change that uses it.

Guarantees: records of a transaction come out in change order; a transaction's schema record
precedes its first event that uses a new shape; nothing is emitted for an aborted transaction; no
event of a table is emitted unless its gate (:class:`~cdc.table_snapshots.TableGate`) admits the
table for the transaction, which it does only once the table's snapshot is in the log or ordered
before the transaction.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cdc.catalog import Catalog, TableInfo
from cdc.errors import DecodeError, SourceError
from cdc.events import EventBuilder, TxContext
from cdc.pgoutput.decoder import Decoder
from cdc.pgoutput.messages import (
    Begin,
    Commit,
    Delete,
    Insert,
    Relation,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
    TypeInfo,
    Update,
)
from cdc.spill import SpillBuffer
from cdc.tables import TableShape
from log_store.record import ProducerRecord

if TYPE_CHECKING:
    from cdc.table_snapshots import TableGate

_XID = struct.Struct("!I")
_DATA_TYPES = frozenset(b"RYIUDT")
_PG_EPOCH_MS = 946_684_800_000


@dataclass
class Transaction:
    """A committed transaction: commit LSN, end LSN, xid, commit time and its change payloads."""

    xid: int
    commit_lsn: int
    end_lsn: int
    commit_ts_ms: int
    changes: SpillBuffer
    streamed: bool = False
    aborted_subxids: set[int] = field(default_factory=set)

    def close(self) -> None:
        self.changes.close()


@dataclass
class _Open:
    xid: int
    changes: SpillBuffer
    final_lsn: int = 0
    commit_ts_us: int = 0
    aborted_subxids: set[int] = field(default_factory=set)


class TransactionAssembler:
    """Feeds on payloads in server order; :meth:`feed` returns a :class:`Transaction` at its commit.

    Only Begin/Commit and the stream control messages are decoded here; data and Relation messages are
    stored as bytes and decoded once, at replay.
    """

    def __init__(self, memory_limit: int = 8 << 20) -> None:
        self._decoder = Decoder()
        self._memory_limit = memory_limit
        self._current: _Open | None = None
        self._streams: dict[int, _Open] = {}
        self._stream_xid: int | None = None

    @property
    def idle(self) -> bool:
        """True between transactions (no plain transaction open, no stream block open)."""
        return self._current is None and self._stream_xid is None

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    def feed(self, payload: bytes, lsn: int = 0) -> Transaction | None:
        kind = payload[0] if payload else 0
        if kind in _DATA_TYPES:
            if self._stream_xid is not None:
                self._streams[self._stream_xid].changes.append(payload)
            elif self._current is not None:
                self._current.changes.append(payload)
            elif kind in b"RY":
                return None  # a Relation outside a transaction carries nothing to replay
            else:
                raise DecodeError(f"change message outside a transaction at LSN {lsn:X}")
            return None
        message = self._decoder.decode(payload, lsn)
        if isinstance(message, Begin):
            self._current = _Open(message.xid, SpillBuffer(self._memory_limit), message.final_lsn, message.commit_ts_us)
        elif isinstance(message, Commit):
            current, self._current = self._current, None
            if current is None:
                raise DecodeError(f"Commit without Begin at LSN {lsn:X}")
            return Transaction(current.xid, message.commit_lsn, message.end_lsn,
                               message.commit_ts_us // 1000 + _PG_EPOCH_MS, current.changes)
        elif isinstance(message, StreamStart):
            self._stream_xid = message.xid
            if message.xid not in self._streams:
                self._streams[message.xid] = _Open(message.xid, SpillBuffer(self._memory_limit))
        elif isinstance(message, StreamStop):
            self._stream_xid = None
        elif isinstance(message, StreamCommit):
            stream = self._streams.pop(message.xid, None)
            if stream is None:
                raise DecodeError(f"Stream Commit of unknown transaction {message.xid} at LSN {lsn:X}")
            return Transaction(stream.xid, message.commit_lsn, message.end_lsn,
                               message.commit_ts_us // 1000 + _PG_EPOCH_MS, stream.changes, True, stream.aborted_subxids)
        elif isinstance(message, StreamAbort):
            if message.xid == message.subxid:
                stream = self._streams.pop(message.xid, None)
                if stream is not None:
                    stream.changes.close()
            elif message.xid in self._streams:
                self._streams[message.xid].aborted_subxids.add(message.subxid)
        # Origin and logical Message are skipped: they carry no row change.
        return None

    def reset(self) -> None:
        """Forget every open transaction (after a reconnect the server resends them whole)."""
        if self._current is not None:
            self._current.changes.close()
        for stream in self._streams.values():
            stream.changes.close()
        self._current = None
        self._streams.clear()
        self._stream_xid = None
        self._decoder = Decoder()


TableFilter = Callable[[str, str], bool]


class ChangeReplayer:
    """Owns the relation cache; turns committed transactions into records for the log.

    ``emitted_schemas`` maps ``schema.table`` to the shape last written to the schema topic (loaded
    from the log at start), so a restart does not write the same schema record twice. ``gate``, when
    given, is asked once per table and transaction whether the table's events may be written; a table
    it refuses contributes nothing to the transaction's records (not even a schema record).
    """

    def __init__(
        self,
        builder: EventBuilder,
        catalog: Catalog,
        topic_for: Callable[[str, str], str],
        include: TableFilter,
        emitted_schemas: dict[str, bytes] | None = None,
        on_new_shape: Callable[[TableShape], None] | None = None,
        gate: TableGate | None = None,
    ) -> None:
        self.builder = builder
        self.catalog = catalog
        self.topic_for = topic_for
        self.include = include
        self.relations: dict[int, TableShape] = {}
        self.type_names: dict[int, str] = {}
        self.emitted_schemas: dict[str, bytes] = dict(emitted_schemas or {})
        self.on_new_shape = on_new_shape
        self.gate = gate

    def shape_from_relation(self, relation: Relation) -> TableShape:
        """The table's shape from a Relation message (keys from the catalog under replica identity FULL)."""
        columns = [(c.name, c.type_oid, c.typmod) for c in relation.columns]
        info: TableInfo | None
        try:
            info = self.catalog.table(relation.relid)
        except SourceError:
            info = None  # dropped since: keys and nullability then come from the message alone
        if relation.replica_identity == "full":
            keys = list(info.primary_key) if info else []
        else:
            keys = [c.name for c in relation.columns if c.key]
        type_names = dict(self.type_names)
        type_names.update(self.catalog.type_names)
        return TableShape.build(
            relation.relid, relation.namespace, relation.name,
            self.topic_for(relation.namespace, relation.name), columns, keys,
            not_null=info.not_null if info else frozenset(), type_names=type_names,
        )

    def _schema_records(self, shape: TableShape, lsn: int) -> list[ProducerRecord]:
        fingerprint = shape.fingerprint()
        if self.emitted_schemas.get(shape.qualified) == fingerprint:
            return []
        self.emitted_schemas[shape.qualified] = fingerprint
        if self.on_new_shape is not None:
            self.on_new_shape(shape)
        return [self.builder.schema(shape, lsn)]

    def _first_use(self, shape: TableShape, commit_lsn: int) -> list[ProducerRecord] | None:
        """None when the table's events of this transaction are held back, else the records to write first."""
        if self.gate is not None and not self.gate.admits(shape, commit_lsn):
            return None
        return self._schema_records(shape, commit_lsn)

    def records(self, tx: Transaction) -> Iterator[ProducerRecord]:
        """Every record of ``tx`` in change order; schema records precede the events using them."""
        decoder = Decoder()
        decoder.in_stream = tx.streamed
        context = TxContext(tx.commit_lsn, tx.xid, tx.commit_ts_ms)
        builder = self.builder
        relations = self.relations
        aborted = tx.aborted_subxids
        admitted: dict[int, bool] = {}  # per table: whether its events of this transaction are written
        for payload in tx.changes:
            if aborted and tx.streamed and _XID.unpack_from(payload, 1)[0] in aborted and payload[0] in b"IUDT":
                continue
            message = decoder.decode(payload)
            if isinstance(message, (Insert, Update, Delete)):
                shape = relations.get(message.relid)
                if shape is None:
                    continue
                allowed = admitted.get(message.relid)
                if allowed is None:
                    head = self._first_use(shape, tx.commit_lsn)
                    admitted[message.relid] = allowed = head is not None
                    if head:
                        yield from head
                if not allowed:
                    continue
                if isinstance(message, Insert):
                    yield from builder.insert(shape, message.new, context)
                elif isinstance(message, Update):
                    yield from builder.update(shape, message.old_kind, message.old, message.new, context)
                else:
                    yield from builder.delete(shape, message.old_kind, message.old, context)
            elif isinstance(message, Truncate):
                for relid in message.relids:
                    shape = relations.get(relid)
                    if shape is not None and (self.gate is None or self.gate.admits(shape, tx.commit_lsn)):
                        yield from builder.truncate(shape, context)
            elif isinstance(message, Relation):
                if self.include(message.namespace, message.name):
                    relations[message.relid] = self.shape_from_relation(message)
                    admitted.pop(message.relid, None)
                else:
                    relations.pop(message.relid, None)
            elif isinstance(message, TypeInfo):
                self.type_names[message.oid] = message.name
