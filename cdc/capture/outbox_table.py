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

from dataclasses import dataclass

from cdc.capture.outbox import ID_HEADER, Outbox, Rejected
from cdc.capture.pgoutput.messages import Relation, Tuple
from event_format import LSN_HEADER, SEQUENCE_HEADER
from log_store import ProducerRecord

#: PostgreSQL's ``bytea`` type OID: a payload of this type is written as its bytes, not as JSON.
BYTEA = 17
#: The header holding a routed event's type.
TYPE_HEADER = "type"


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

    def event(
        self, outbox: Outbox, new: Tuple, insert_lsn: int, commit_lsn: int, sequence: int, ts_ms: int
    ) -> ProducerRecord | Rejected:
        """The event of the inserted row ``new`` (at ``sequence`` in the transaction committed at
        ``commit_lsn`` and ``ts_ms``), or its dead letter."""
        # a column's text form as pgoutput sent it; anything else (SQL NULL) is None
        ident, aggregate, key, kind, payload = (
            new[self.id_at],
            new[self.aggregatetype_at],
            new[self.aggregateid_at],
            new[self.type_at],
            new[self.payload_at],
        )
        headers = (
            (ID_HEADER, ident.encode() if type(ident) is str else b""),
            (TYPE_HEADER, kind.encode() if type(kind) is str else b""),
            (LSN_HEADER, b"%d" % commit_lsn),
            (SEQUENCE_HEADER, b"%d" % sequence),
        )
        content: bytes | None = None
        if type(payload) is str:
            content = _bytea(payload) if self.bytea else payload.encode()
        return outbox.route(
            outbox.message_prefix + aggregate if type(aggregate) is str else outbox.message_prefix,
            content,
            headers,
            insert_lsn,
            commit_lsn,
            ts_ms,
            key=key.encode() if type(key) is str else None,
            keyed=True,
            json=not self.bytea,
        )


def _bytea(text: str) -> bytes:
    """The bytes of a ``bytea`` value's text form (``\\x`` and hex digits, the server's default output)."""
    return bytes.fromhex(text[2:]) if text.startswith("\\x") else text.encode()
