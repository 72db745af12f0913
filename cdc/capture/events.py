"""Change events as log records: the Debezium-compatible envelope, the canonical key, tombstones.

Format: docs/event-format.md. Guarantees of this module:

* the key is the key columns as canonical JSON (sorted keys, compact), so one row always lands on one
  partition; a table without key columns gives a null key;
* ``source.lsn`` is the commit LSN and ``source.sequence`` numbers the transaction's events 0, 1, 2...,
  so ``(lsn, sequence)`` orders every event of the database consistently with commit order;
* a delete is followed by a tombstone carrying the delete's ``lsn`` and ``sequence`` as headers; a
  truncate is written once to every partition of the topic;
* an update whose new row lacks an unchanged TOAST value never carries a placeholder: the value is
  taken from the old row when the server sent it (replica identity FULL), otherwise the column is
  left out of ``after`` and named in the ``unchanged`` header, and compaction folds it onto the key's
  previous value (log_store ``fold_after`` (:mod:`event_format`)); when the update changed the key, the new key has no
  previous value, so the value comes from the old key's row (:mod:`cdc.capture.key_changes`) or capture stops
  with :class:`~cdc.capture.errors.MissingValueError`;
* event bytes are assembled from per-column JSON fragments (:mod:`cdc.capture.row_codec`), byte for byte what
  ``orjson.dumps`` writes for the envelope as a dict.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from cdc.capture.arrow_fragments import join, literal
from cdc.capture.coverage import sql_name
from cdc.capture.errors import MissingValueError
from cdc.capture.pgoutput.messages import UNCHANGED, Tuple
from cdc.capture.row_codec import NULL, RowCodec
from cdc.capture.tables import TableShape
from event_format import LSN_HEADER, SEQUENCE_HEADER, UNCHANGED_HEADER, truncate_key
from log_store import ProducerColumns, ProducerRecord, partition_arrow, partition_for_key

#: ``new_record((topic, key, value, timestamp_ms, headers))``: a ProducerRecord without the keyword machinery.
new_record = partial(tuple.__new__, ProducerRecord)
_SNAPSHOT_TRUE = b',"snapshot":"true","sequence":'
_SNAPSHOT_LAST = b',"snapshot":"last","sequence":'
#: ``(shape, old key, column names)`` -> those columns' JSON values in the old key's latest row.
#: ``(shape, key, column names, same_key)`` -> the JSON values of those columns in the key's row as the log holds it
PreviousValues = Callable[[TableShape, bytes, list[str], bool], dict[str, bytes]]


@dataclass(slots=True)
class TxContext:
    """The transaction the events belong to: commit LSN, xid, commit time, the next sequence and outbox index."""

    lsn: int
    xid: int
    ts_ms: int
    snapshot: str = "false"
    sequence: int = 0
    #: how many outbox messages of the transaction came so far (:mod:`cdc.capture.outbox`)
    messages: int = 0


def _fragments(codec: RowCodec, values: Tuple, old: Tuple | None) -> tuple[list[bytes | None], list[int]]:
    """Per-column JSON fragments of one tuple (``None`` for a column left out) and the unchanged columns' indexes.

    An unchanged TOAST value is taken from ``old`` when the server sent the whole old row.
    """
    fragments: list[bytes | None] = []
    unchanged: list[int] = []
    fragment = codec.fragment
    for index, value in enumerate(values[: codec.count]):
        if value is UNCHANGED:
            previous = old[index] if old is not None and index < len(old) else UNCHANGED
            if previous is UNCHANGED:
                unchanged.append(index)
                fragments.append(None)
            else:
                fragments.append(fragment(index, previous))  # type: ignore[arg-type]
        else:
            fragments.append(fragment(index, value))  # type: ignore[arg-type]
    fragments.extend([None] * (codec.count - len(fragments)))
    return fragments, unchanged


def _old_row(codec: RowCodec, old_kind: str | None, old: Tuple) -> tuple[bytes, bytes | None]:
    """The ``before`` JSON and the key of an old tuple; with ``old_kind`` ``K`` (the server sent the
    key columns only) ``before`` holds just the key columns."""
    fragments, _ = _fragments(codec, old, None)
    if old_kind == "K":
        fragments = [(f if f is not None else NULL) if i in codec.keys else None for i, f in enumerate(fragments)]
    return codec.obj(fragments), codec.key(fragments)


def with_unchanged_key(shape: TableShape, old: Tuple | None, new: Tuple) -> Tuple:
    """``new`` with each key column the update left unchanged (TOAST) taken from the old tuple.

    pgoutput marks a key column stored out of line as unchanged when an update does not touch it, and
    then sends the old key ('K', or the whole old row 'O'), detoasted: the key is the old tuple's. The
    event's key must never be built from the marker (it would read as null, and a phantom row would be
    created under a null key). Without an old value to take, capture stops with
    :class:`~cdc.capture.errors.MissingValueError` naming the fix, before anything of the group is appended.
    """
    keys = shape.codec.keys
    if not any(index < len(new) and new[index] is UNCHANGED for index in keys):
        return new
    filled = list(new)
    for index in keys:
        if index < len(filled) and filled[index] is UNCHANGED:
            value = old[index] if old is not None and index < len(old) else UNCHANGED
            if value is UNCHANGED:
                table = sql_name((shape.schema, shape.table))
                raise MissingValueError(
                    f"an update of {table} left its key column {shape.codec.names[index]} unchanged "
                    "(stored out of line, TOAST) and the server sent no old value of it, so the row's key cannot "
                    f"be known; run ALTER TABLE {table} REPLICA IDENTITY FULL (or make the replica "
                    "identity cover the primary key) so the server sends the old key, then run cdc capture again"
                )
            filled[index] = value
    return tuple(filled)


def missing_message(shape: TableShape, old_key: bytes, names: list[str], why: str, same_key: bool = False) -> str:
    """The :class:`~cdc.capture.errors.MissingValueError` text: what is missing, why, and how to fix it.

    ``same_key``: the update kept its key, and the log cannot fold a partial row (Kafka)."""
    if same_key:
        what = (
            f"an update of {shape.qualified} of the key {old_key.decode(errors='replace')} left "
            f"{', '.join(names)} unchanged (TOAST), but {why}, and the log (Kafka) cannot fold a partial row "
            "onto the key's earlier one"
        )
    else:
        what = (
            f"an update of {shape.qualified} changed the key {old_key.decode(errors='replace')} and left "
            f"{', '.join(names)} unchanged (TOAST), but {why}, so the new key's row would lack that value"
        )
    return (
        f"{what}; run ALTER TABLE {shape.qualified} REPLICA IDENTITY FULL so the server sends the old row, then "
        "recreate the capture (cdc setup) to snapshot the table again"
    )


@dataclass(frozen=True, slots=True)
class ReadEncoder:
    """Snapshot reads of one table as blocks of columns: pure, so blocks may be encoded on several threads.

    A block's rows get the sequences ``first_sequence + first ...`` (``first``: the rows read before it),
    so the sequences are those of encoding every read one after the other, whatever thread encodes
    which block.
    """

    topic: str
    head: bytes
    first_sequence: int
    ts_ms: int
    partitions: int

    def __call__(self, first: int, count: int, keys: pa.Array | None, after: Sequence[pa.Array | pa.Scalar]) -> ProducerColumns:
        """``count`` rows given as an Arrow array of key JSON and the pieces of their ``after`` JSON
        (:func:`~cdc.capture.arrow_fragments.object_pieces`), as one block of columns.

        The envelopes are joined around the ``after`` pieces in one pass, with the fields, order and
        source of the streamed events, so a row reads the same whether snapshot or stream carried it."""
        start = self.first_sequence + first
        numbers = np.arange(start, start + count, dtype=np.int64)
        if keys is not None and self.partitions > 1 and not keys.null_count:
            # rows in partition order (stable): the log then places them without moving their bytes,
            # and the pieces are moved here, before they are joined into the much longer envelopes
            order = np.argsort(partition_arrow(keys, self.partitions), kind="stable")
            numbers = numbers[order]
            taken = pa.array(order)
            keys = keys.take(taken)
            after = [piece.take(taken) if isinstance(piece, pa.Array) else piece for piece in after]
        sequences = pc.cast(pc.cast(pa.array(numbers), pa.large_string()), pa.large_binary())
        values = join(
            [
                literal(b'{"before":null,"after":'),
                *after,
                literal(b',"op":"r","source":' + self.head),
                sequences,
                literal(b'},"ts_ms":' + str(time.time_ns() // 1_000_000).encode() + b"}"),
            ],
            count,
        )
        return ProducerColumns(self.topic, keys, values, self.ts_ms)


class EventBuilder:
    """Builds the records of one source database for topics with ``partitions`` partitions each.

    ``partitions_of`` gives a topic's own partition count when it differs from ``partitions`` (a topic
    keeps the count it was created with): truncate markers must reach each of its partitions.
    """

    def __init__(self, *, prefix: str, database: str, partitions: int, partitions_of: Callable[[str], int] | None = None) -> None:
        self.prefix = prefix
        self.database = database
        self.partitions = partitions
        self._partitions_of = partitions_of
        #: Where a key-changing update finds the old row's unchanged TOAST values (set per group by capture).
        self.previous_values: PreviousValues | None = None
        #: Write updates that leave TOAST values unchanged as whole rows, their values taken from
        #: :attr:`previous_values` (the key's row in the log), for a log whose compaction cannot fold
        #: partial rows (Kafka); the tables that got such a row are kept in :attr:`rows_read_back`.
        self.whole_rows = False
        self.rows_read_back: set[str] = set()
        self._head_ident: tuple[int, int, int, str] | None = None
        self._heads: dict[int, tuple[TableShape, bytes]] = {}
        self._insert_templates: dict[int, tuple[TableShape, bytes]] = {}

    @contextmanager
    def previous_values_from(self, values: PreviousValues) -> Iterator[None]:
        """Take unchanged TOAST values from ``values`` for the records built inside the block (lazily
        built records must be consumed inside it too)."""
        self.previous_values = values
        try:
            yield
        finally:
            self.previous_values = None

    def _value(self, shape: TableShape, tx: TxContext, op: str, before: Any, after: Any) -> bytes:
        envelope = {
            "before": before,
            "after": after,
            "op": op,
            "source": {**self._source(shape, tx), "sequence": tx.sequence},
            "ts_ms": time.time_ns() // 1_000_000,
        }
        tx.sequence += 1
        return orjson.dumps(envelope)

    def read_encoder(self, shape: TableShape, tx: TxContext) -> ReadEncoder:
        """The encoder of ``shape``'s snapshot reads (``op=r``) in ``tx``; their sequences count on from
        ``tx.sequence``, which the caller advances by the rows it encoded."""
        return ReadEncoder(shape.topic, self._head(shape, tx), tx.sequence, tx.ts_ms, self.partitions_of(shape.topic))

    def partitions_of(self, topic: str) -> int:
        """The partition count of ``topic``."""
        return self._partitions_of(topic) if self._partitions_of is not None else self.partitions

    def _source(self, shape: TableShape, tx: TxContext) -> dict[str, Any]:
        """The envelope's ``source`` of ``shape`` in ``tx``, but for its ``sequence`` (which comes last)."""
        return {
            "connector": "postgresql",
            "name": self.prefix,
            "db": self.database,
            "schema": shape.schema,
            "table": shape.table,
            "lsn": tx.lsn,
            "txId": tx.xid,
            "ts_ms": tx.ts_ms,
            "snapshot": tx.snapshot,
        }

    def _head(self, shape: TableShape, tx: TxContext) -> bytes:
        """``{"connector":...,"snapshot":"false","sequence":`` of ``shape`` in ``tx`` (cached per transaction)."""
        ident = (tx.lsn, tx.xid, tx.ts_ms, tx.snapshot)
        if ident != self._head_ident:
            self._head_ident = ident
            self._heads.clear()
            self._insert_templates.clear()
        cached = self._heads.get(id(shape))
        if cached is not None and cached[0] is shape:
            return cached[1]
        head = orjson.dumps(self._source(shape, tx))[:-1] + b',"sequence":'
        self._heads[id(shape)] = (shape, head)
        return head

    def _envelope(self, shape: TableShape, tx: TxContext, op: bytes, before: bytes, after: bytes) -> bytes:
        """The envelope around ``before``/``after`` JSON, byte for byte what :meth:`_value` writes for dicts."""
        sequence = tx.sequence
        tx.sequence += 1
        return (
            b'{"before":'
            + before
            + b',"after":'
            + after
            + b',"op":"'
            + op
            + b'","source":'
            + self._head(shape, tx)
            + b'%d},"ts_ms":%d}' % (sequence, time.time_ns() // 1_000_000)
        )

    def insert_template(self, shape: TableShape, tx: TxContext) -> bytes:
        """``%``-template of an insert of ``shape`` in ``tx``: column fragments, then sequence and ``ts_ms``."""
        head = self._head(shape, tx)
        cached = self._insert_templates.get(id(shape))
        if cached is not None and cached[0] is shape:
            return cached[1]
        template = (
            b'{"before":null,"after":'
            + shape.codec.after_template
            + b',"op":"c","source":'
            + head.replace(b"%", b"%%")
            + b'%d},"ts_ms":%d}'
        )
        self._insert_templates[id(shape)] = (shape, template)
        return template

    def insert_payload(self, shape: TableShape, payload: bytes, pos: int, tx: TxContext, now_ms: int) -> ProducerRecord | None:
        """The ``op=c`` record of an Insert whose TupleData starts at ``pos`` of ``payload``, straight from the bytes.

        ``None`` when the row needs the general path (:meth:`insert` on the decoded message); ``now_ms``
        is the top-level ``ts_ms``. The streaming replay inlines this (:mod:`cdc.capture.change_replayer`).
        """
        encoded = shape.codec.insert_encoder()(payload, pos, self.insert_template(shape, tx), tx.sequence, now_ms)
        if encoded is None:
            return None
        tx.sequence += 1
        return new_record((shape.topic, encoded[0], encoded[1], tx.ts_ms, ()))

    def insert(self, shape: TableShape, new: Tuple, tx: TxContext) -> list[ProducerRecord]:
        codec = shape.codec
        fragments, _ = _fragments(codec, new, None)
        after = codec.obj(fragments)
        return [ProducerRecord(shape.topic, codec.key(fragments), self._envelope(shape, tx, b"c", b"null", after), tx.ts_ms)]

    def update(
        self, shape: TableShape, old_kind: str | None, old: Tuple | None, new: Tuple, tx: TxContext
    ) -> list[ProducerRecord]:
        """``op=u``; when the key changed, a delete + tombstone of the old key, then a create.

        A key change that leaves TOAST values unchanged (the server sends only the old key, ``K``) gets
        those values from :attr:`previous_values` (see :mod:`cdc.capture.key_changes`): the create of the new
        key is a full row, since compaction folds a partial row only onto the *same* key's previous
        value and the new key has none. Without a way to recover them it raises
        :class:`~cdc.capture.errors.MissingValueError` rather than write a row that lacks a value.
        """
        codec = shape.codec
        new = with_unchanged_key(shape, old, new)
        fragments, unchanged = _fragments(codec, new, old if old_kind == "O" else None)
        key = codec.key(fragments)
        before = b"null"
        if old is not None:
            before, old_key = _old_row(codec, old_kind, old)
            if key is not None and old_key != key:
                if unchanged:
                    fragments = self._recovered(shape, old_key, fragments, unchanged)  # type: ignore[arg-type]
                    unchanged = []
                records = self._delete(shape, old_key, before, tx)
                records.append(
                    ProducerRecord(shape.topic, key, self._envelope(shape, tx, b"c", b"null", codec.obj(fragments)), tx.ts_ms)
                )
                return records
        if unchanged and self.whole_rows and key is not None:
            fragments = self._recovered(shape, key, fragments, unchanged, same_key=True)
            unchanged = []
            self.rows_read_back.add(shape.qualified)
        headers = _unchanged_headers([codec.names[i] for i in unchanged])
        envelope = self._envelope(shape, tx, b"u", before, codec.obj(fragments))
        return [ProducerRecord(shape.topic, key, envelope, tx.ts_ms, headers)]

    def _recovered(
        self, shape: TableShape, old_key: bytes, fragments: list[bytes | None], unchanged: list[int], same_key: bool = False
    ) -> list[bytes | None]:
        """``fragments`` with the unchanged columns filled from the old key's row (:attr:`previous_values`)."""
        names = [shape.codec.names[i] for i in unchanged]
        if self.previous_values is None:
            raise MissingValueError(missing_message(shape, old_key, names, "no earlier record of the row can be read", same_key))
        values = self.previous_values(shape, old_key, names, same_key)
        filled = list(fragments)
        for index, name in zip(unchanged, names, strict=True):
            filled[index] = values[name]
        return filled

    def delete(self, shape: TableShape, old_kind: str, old: Tuple, tx: TxContext) -> list[ProducerRecord]:
        before, key = _old_row(shape.codec, old_kind, old)
        return self._delete(shape, key, before, tx)

    def _delete(self, shape: TableShape, key: bytes | None, before: bytes, tx: TxContext) -> list[ProducerRecord]:
        """The ``op=d`` record of the old row ``before`` (JSON), then the key's tombstone."""
        position = tombstone_headers(tx.lsn, tx.sequence)
        records = [ProducerRecord(shape.topic, key, self._envelope(shape, tx, b"d", before, b"null"), tx.ts_ms)]
        if key is not None:
            records.append(ProducerRecord(shape.topic, key, None, tx.ts_ms, position))
        return records

    def truncate(self, shape: TableShape, tx: TxContext) -> list[ProducerRecord]:
        """One ``op=t`` record with a null key on every partition of the table's topic."""
        value = self._value(shape, tx, "t", None, None)
        partitions = self.partitions_of(shape.topic)
        return [truncate_marker(shape.topic, value, tx.ts_ms, p, partitions) for p in range(partitions)]

    def schema(
        self,
        shape: TableShape,
        lsn: int,
        previous: bytes | None = None,
        sequence: int = 0,
        filled: Mapping[str, object] | None = None,
    ) -> ProducerRecord:
        """The table's column list for ``<prefix>.__schemas``, in force from ``(lsn, sequence)``
        (``previous``: the record it follows; ``filled``: values of added columns' older rows, see
        :mod:`cdc.capture.added_column_fills`)."""
        return ProducerRecord(
            self.schema_topic,
            shape.schema_key(),
            shape.schema_value(lsn, previous, sequence, filled),
            time.time_ns() // 1_000_000,
        )

    @property
    def schema_topic(self) -> str:
        return f"{self.prefix}.__schemas"

    @property
    def ledger_topic(self) -> str:
        """The topic naming the tables whose snapshot the log holds (:mod:`cdc.capture.table_snapshots`)."""
        return f"{self.prefix}.__snapshots"


def truncate_marker(topic: str, value: bytes, ts_ms: int, partition: int, partitions: int) -> ProducerRecord:
    """The truncate record for one partition.

    With a log whose records take an explicit partition the key is null, as the event format says.
    Otherwise (a log that places every record by its key) the key is ``{"__truncate__":n}`` with the
    smallest ``n`` that Kafka's partitioner places on ``partition``; consumers recognise the marker by
    ``op == "t"`` either way.
    """
    if "partition" in ProducerRecord._fields:
        return ProducerRecord(topic, None, value, ts_ms, (), partition)  # type: ignore[call-arg]
    n = 0
    while True:
        key = truncate_key(n)
        if partition_for_key(key, partitions) == partition:
            return ProducerRecord(topic, key, value, ts_ms)
        n += 1


def tombstone_headers(lsn: int, sequence: int) -> tuple[tuple[str, bytes], ...]:
    """The headers of a tombstone: the ``(lsn, sequence)`` of the delete it follows.

    Compaction keeps a key's tombstone and drops the delete event before it, so a consumer that reads
    the key for the first time after compaction sees only the tombstone; these headers let it apply the
    deletion at its place in commit order (docs/event-format.md).
    """
    return ((LSN_HEADER, b"%d" % lsn), (SEQUENCE_HEADER, b"%d" % sequence))


def _unchanged_headers(unchanged: list[str]) -> tuple[tuple[str, bytes], ...]:
    return ((UNCHANGED_HEADER, orjson.dumps(unchanged)),) if unchanged else ()


def mark_last_read(record: ProducerRecord) -> ProducerRecord:
    """The same snapshot read with ``source.snapshot = "last"`` (the source object is the value's last)."""
    value = record.value or b""
    before, found, after = value.rpartition(_SNAPSHOT_TRUE)
    if not found:
        return record
    return record._replace(value=before + _SNAPSHOT_LAST + after)
