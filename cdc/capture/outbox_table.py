"""Outbox tables: inserts into a declared table routed as events, the way Debezium's Outbox Event Router does.

A table declared in the views file (``[outbox."public.outbox"]``, :class:`derived_views.definitions.OutboxTable`)
with Debezium's columns (names configurable)::

    CREATE TABLE outbox (id uuid PRIMARY KEY, aggregatetype text NOT NULL, aggregateid text NOT NULL,
                         type text NOT NULL, payload jsonb);

is routed, not copied: each row inserted becomes one event in topic
``<CDC_TOPIC_PREFIX>.<CDC_OUTBOX_PREFIX>.<aggregatetype>``, its key the aggregate id (as text), its value the
payload (as its JSON text; a ``bytea`` payload as its bytes), its headers ``id`` (the row's id, as text)
and ``type``, then ``lsn`` and ``sequence`` (its position among the transaction's events). That is the
record Debezium's router produces, so consumers written for it work unchanged. Updates, deletes and
truncates of the table are not events (an application may delete its rows right after inserting them),
and the table gets no topic, snapshot or view of its own (capture leaves it out of the captured tables).

Guarantees are those of row changes and of :mod:`cdc.capture.outbox`: an event is written once, in its
transaction's group, at its commit's position, only if the transaction (and the subtransaction that
inserted the row, which its insert message names) committed. Bad input (a null aggregate type, id or
payload, a payload not JSON, an aggregate type no topic name can hold) goes to the dead letters with one
warning line naming the LSN.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from cdc.capture.outbox import ID_HEADER, Outbox, Rejected
from cdc.capture.pgoutput.messages import Relation, Tuple
from event_format import LSN_HEADER, SEQUENCE_HEADER
from log_store import ProducerRecord

#: PostgreSQL's ``bytea`` type OID: a payload of this type is written as its bytes, not as JSON.
BYTEA = 17
#: The header holding a routed event's type.
TYPE_HEADER = "type"
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


@dataclass(frozen=True)
class OutboxColumns:
    """The column names of an outbox table's parts (Debezium's by default)."""

    id: str = "id"
    aggregatetype: str = "aggregatetype"
    aggregateid: str = "aggregateid"
    type: str = "type"
    payload: str = "payload"

    def bind(self, relation: Relation) -> RoutedTable | str:
        """Where each part is in ``relation``'s rows, or why the table cannot be routed."""
        names = [column.name for column in relation.columns]
        wanted = (self.id, self.aggregatetype, self.aggregateid, self.type, self.payload)
        missing = [name for name in wanted if name not in names]
        if missing:
            return f"it has no column {', '.join(missing)} (its columns: {', '.join(names)})"
        ident, aggregatetype, aggregateid, kind, payload = (names.index(name) for name in wanted)
        bytea = relation.columns[payload].type_oid == BYTEA
        return RoutedTable(f"{relation.namespace}.{relation.name}", ident, aggregatetype, aggregateid, kind, payload, bytea)


@dataclass(frozen=True)
class RoutedTable:
    """An outbox table's shape in the stream: the place of each part in its rows."""

    name: str
    id_at: int
    aggregatetype_at: int
    aggregateid_at: int
    type_at: int
    payload_at: int
    bytea: bool
    #: topic names by aggregate type (its bytes), made once each
    _topics: dict[bytes, str] = field(default_factory=dict, compare=False, repr=False)

    def event(
        self, outbox: Outbox, raw: list[bytes | None], insert_lsn: int, commit_lsn: int, sequence: int, ts_ms: int
    ) -> ProducerRecord | Rejected:
        """The event of an inserted row (at ``sequence`` in the transaction committed at ``commit_lsn`` and
        ``ts_ms``), or its dead letter; ``raw``: the bytes of its columns' text forms as pgoutput sent them,
        ``None`` for SQL NULL (:func:`raw_values`, :func:`text_values`)."""
        ident, aggregate, key, kind, payload = (
            raw[self.id_at],
            raw[self.aggregatetype_at],
            raw[self.aggregateid_at],
            raw[self.type_at],
            raw[self.payload_at],
        )
        headers = (
            (ID_HEADER, ident if ident is not None else b""),
            (TYPE_HEADER, kind if kind is not None else b""),
            (LSN_HEADER, b"%d" % commit_lsn),
            (SEQUENCE_HEADER, b"%d" % sequence),
        )
        content = payload if payload is None or not self.bytea else _bytea(payload.decode())
        topic = outbox.message_prefix
        if aggregate is not None:
            topic = self._topics.get(aggregate) or self._topics.setdefault(aggregate, topic + aggregate.decode())
        return outbox.route(topic, content, headers, insert_lsn, commit_lsn, ts_ms, key=key, keyed=True, json=not self.bytea)


def text_values(new: Tuple) -> list[bytes | None]:
    """The columns of a decoded tuple as :func:`raw_values` gives them."""
    return [value.encode() if type(value) is str else None for value in new]


def raw_values(frame: bytes, at: int) -> list[bytes | None] | None:
    """The columns of the TupleData at ``at`` of an Insert's pgoutput ``frame``, as the bytes of their text
    forms (``None``: SQL NULL), read straight from the frame: an outbox row's event needs only these bytes,
    never the Python strings the decoder makes (:meth:`RoutedTable.event`). ``None`` when the tuple holds
    anything else (the decoder then reads it, and names what is wrong)."""
    values: list[bytes | None] = []
    append = values.append
    try:
        count = _I16.unpack_from(frame, at)[0]
        pos = at + 2
        for _ in range(count):
            kind = frame[pos]
            if kind == 0x74:  # 't'
                length = _I32.unpack_from(frame, pos + 1)[0]
                pos += 5 + length
                append(frame[pos - length : pos])
            elif kind == 0x6E:  # 'n'
                pos += 1
                append(None)
            else:
                return None
    except (IndexError, struct.error):
        return None
    return values if pos == len(frame) else None


def _bytea(text: str) -> bytes:
    """The bytes of a ``bytea`` value's text form (``\\x`` and hex digits, the server's default output)."""
    return bytes.fromhex(text[2:]) if text.startswith("\\x") else text.encode()
