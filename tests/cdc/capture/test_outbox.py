"""Outbox messages without a database: the rules of :mod:`cdc.capture.outbox`, and their path through the
assembler and the replayer on hand-built pgoutput bytes."""

from __future__ import annotations

import logging
import struct

import orjson
import pytest

from cdc.capture.change_replayer import ChangeReplayer
from cdc.capture.events import EventBuilder
from cdc.capture.outbox import Outbox, Rejected
from cdc.capture.pgoutput.messages import LogicalMessage
from cdc.capture.streaming import Transaction, TransactionAssembler
from cdc.capture.transport.framing import encode_xlogdata
from tests.cdc.wire import hand_message, sample_shape

RULES = Outbox("cdc.outbox.", "order_id", "cdc.__dead_letters", lambda topic: topic == "cdc.outbox.t")


def _message(prefix: str, content: bytes, *, transactional: bool = True, lsn: int = 0x5000) -> LogicalMessage:
    return LogicalMessage(None, transactional, lsn, prefix, content)


def _wire(prefix: str, content: bytes, *, transactional: bool = True, lsn: int = 0x5000) -> bytes:
    head = bytes([int(transactional)]) + struct.pack("!Q", lsn) + prefix.encode() + b"\0"
    return hand_message(b"M", head, struct.pack("!i", len(content)), content)


def test_an_event_is_keyed_by_its_field_and_carries_a_stable_id() -> None:
    record = RULES.event(_message("cdc.outbox.orders", b'{"order_id": "A-1", "n": 1}'), 0x1A2B, 2, 5, 1000)
    assert not isinstance(record, Rejected)
    assert (record.topic, record.key, record.value, record.timestamp_ms) == (
        "cdc.outbox.orders",
        b"A-1",
        b'{"order_id": "A-1", "n": 1}',
        1000,
    )
    assert dict(record.headers) == {"id": b"0000000000001A2B-2", "lsn": b"6699", "sequence": b"5"}
    number = RULES.event(_message("cdc.outbox.orders", b'{"order_id": {"b": 1, "a": 2}}'), 1, 0, 0, 0)
    assert not isinstance(number, Rejected) and number.key == b'{"a":2,"b":1}'
    unkeyed = Outbox("cdc.outbox.", "", "cdc.__dead_letters").event(_message("cdc.outbox.orders", b"[1]"), 1, 0, 0, 0)
    assert not isinstance(unkeyed, Rejected) and unkeyed.key is None


@pytest.mark.parametrize(
    ("content", "key"),
    [
        (b'{"order_id": "A-1"}', b"A-1"),
        (b'{"order_id": "\xc3\xa9"}', "\u00e9".encode()),
        (b'{"order_id": 7}', b"7"),
        (b'{"order_id": -12345678901234}', b"-12345678901234"),
        (b'{"order_id": true}', b"true"),
        (b'{"order_id": 1.5}', b"1.5"),
        (b'{"order_id": [2, 1]}', b"[2,1]"),
        (b'{"order_id": null}', None),
        (b'{"n": 1}', None),
        (b"[1]", None),
        (b"{not json", None),
    ],
)
def test_an_events_key_is_the_same_on_a_topic_met_before(content: bytes, key: bytes | None) -> None:
    """The first event of a topic checks the topic; the later ones take a shorter path: same key, same verdict."""
    fresh, primed = (Outbox("cdc.outbox.", "order_id", "cdc.__dead_letters") for _ in range(2))
    assert not isinstance(primed.event(_message("cdc.outbox.orders", b'{"order_id": 0}'), 1, 0, 0, 0), Rejected)
    first = fresh.event(_message("cdc.outbox.orders", content), 1, 1, 1, 0)
    later = primed.event(_message("cdc.outbox.orders", content), 1, 1, 1, 0)
    assert type(first) is type(later)
    if key is None:
        assert isinstance(first, Rejected) and isinstance(later, Rejected) and first.reason == later.reason
    else:
        assert not isinstance(first, Rejected) and not isinstance(later, Rejected)
        assert first.key == later.key == key and later.value == content


@pytest.mark.parametrize(
    ("prefix", "content", "reason"),
    [
        ("cdc.outbox.orders", b"{not json", "the payload is not JSON"),
        ("cdc.outbox.orders", b'{"n": 1}', "no key field 'order_id'"),
        ("cdc.outbox.orders", b'{"order_id": null}', "no key field 'order_id'"),
        ("cdc.outbox.orders", b"[1]", "not a JSON object"),
        ("cdc.outbox.ord ers", b'{"order_id": 1}', "not a topic name Kafka can hold"),
        ("cdc.outbox." + "x" * 240, b'{"order_id": 1}', "not a topic name Kafka can hold"),
        ("cdc.outbox.", b'{"order_id": 1}', "names no topic"),
        ("cdc.outbox.t", b'{"order_id": 1}', "topic of a captured table"),
    ],
)
def test_bad_input_becomes_a_dead_letter_naming_why(prefix: str, content: bytes, reason: str) -> None:
    result = RULES.event(_message(prefix, content, lsn=0x77), 0x1000, 0, 3, 9)
    assert isinstance(result, Rejected) and reason in result.reason
    letter = result.record
    assert letter.topic == "cdc.__dead_letters" and letter.key is None
    value = orjson.loads(letter.value or b"")
    assert value["target"] == prefix and value["id"] == "0000000000001000-0" and value["message_lsn"] == "0/77"
    assert value["value"] == content.decode() and reason in value["error"]


def test_the_assembler_keeps_transactional_outbox_messages_and_refuses_the_others(caplog: pytest.LogCaptureFixture) -> None:
    begin = hand_message(b"B", struct.pack("!QqI", 0x2000, 0, 77))
    commit = hand_message(b"C", struct.pack("!bQQq", 0, 0x2000, 0x2008, 0))
    kept = _wire("cdc.outbox.orders", b'{"order_id": 1}')
    other = _wire("app.audit", b"x")
    loose = _wire("cdc.outbox.orders", b'{"order_id": 2}', transactional=False, lsn=0x1F00)
    assembler = TransactionAssembler(outbox_prefix="cdc.outbox.")
    with caplog.at_level(logging.WARNING, logger="cdc.capture"):
        assert assembler.feed(loose, 0x1F00) is None
        assert assembler.feed(begin, 0x1000) is None
        assert assembler.feed(kept, 0x1800) is None
        assert assembler.feed(other, 0x1900) is None
        tx = assembler.feed(commit, 0x2000)
    assert tx is not None and [payload for _, payload in tx.changes.positioned()] == [kept]
    (line,) = [record.getMessage() for record in caplog.records]
    assert "refused the non-transactional outbox message 'cdc.outbox.orders' at LSN 0/1F00" in line
    assert TransactionAssembler().feed(begin, 0) is None  # without the prefix, nothing is an outbox message
    # the frames' fast path takes the transactional outbox message, and leaves the others to feed
    taken = TransactionAssembler(outbox_prefix="cdc.outbox.")
    messages = [(0x1000, begin), (0x1800, kept), (0x1900, other), (0x1A00, kept), (0x1F00, loose)]
    frames: list[bytes | memoryview] = [memoryview(encode_xlogdata(lsn, lsn, payload)) for lsn, payload in messages]
    assert taken.feed(begin, 0x1000) is None and taken.take(frames, 1) == 2
    assert taken.feed(other, 0x1900) is None and taken.take(frames, 3) == 4
    with caplog.at_level(logging.WARNING, logger="cdc.capture"):
        assert taken.feed(loose, 0x1F00) is None
    fast = taken.feed(commit, 0x2000)
    assert fast is not None and list(fast.changes.positioned()) == [(0x1800, kept), (0x1A00, kept)]


def test_the_replayer_orders_events_among_row_changes() -> None:
    """Messages replayed between inserts take the transaction's next sequences, ids count outbox messages only."""

    class _Catalog:
        type_names: dict[int, str] = {}

    made: list[str] = []
    replayer = ChangeReplayer(
        EventBuilder(prefix="cdc", database="db", partitions=3),
        _Catalog(),  # type: ignore[arg-type]
        lambda schema, table: f"cdc.{schema}.{table}",
        lambda schema, table: True,
    )
    replayer.outbox, replayer.ensure_events_topic = RULES, made.append
    shape = sample_shape()
    replayer.relations[shape.relid] = shape
    replayer.emitted_schemas[shape.log_name] = (shape.fingerprint(), shape.schema_value(0))

    def insert(key: int) -> bytes:
        text = str(key).encode()
        row = struct.pack("!h", 3) + b"t" + struct.pack("!i", len(text)) + text + b"nn"
        return hand_message(b"I", struct.pack("!I", shape.relid), b"N", row)

    from cdc.capture.spill import SpillBuffer

    changes = SpillBuffer()
    for payload in (
        insert(1),
        _wire("cdc.outbox.orders", b'{"order_id": "a"}'),
        _wire("cdc.outbox.orders", b"{bad"),
        insert(2),
        _wire("cdc.outbox.orders", b'{"order_id": "b"}'),
    ):
        changes.append(payload)
    records = list(replayer.records(Transaction(1, 0x3000, 0x3008, 0, changes)))
    assert [r.topic for r in records] == [
        "cdc.public.t",
        "cdc.outbox.orders",
        "cdc.__dead_letters",
        "cdc.public.t",
        "cdc.outbox.orders",
    ]
    sequences = [
        orjson.loads(r.value or b"")["source"]["sequence"] if r.topic == "cdc.public.t" else int(dict(r.headers)["sequence"])
        for r in records
    ]
    assert sequences == [0, 1, 2, 3, 4]
    assert [dict(r.headers)["id"] for r in records if "outbox" in r.topic] == [b"0000000000003000-0", b"0000000000003000-2"]
    assert made == ["cdc.outbox.orders", "cdc.__dead_letters", "cdc.outbox.orders"]
    replayer.replay_relations(Transaction(1, 0x3000, 0x3008, 0, SpillBuffer()))  # a skipped transaction writes nothing


def test_an_outbox_tables_columns_are_found_by_name_and_a_bytea_payload_is_its_bytes() -> None:
    from cdc.capture.outbox_table import OutboxColumns, RoutedTable, text_values
    from cdc.capture.pgoutput.messages import Column, Relation

    def relation(*columns: tuple[str, int]) -> Relation:
        return Relation(None, 5, "public", "outbox", "d", tuple(Column(n, oid, -1, n == "id") for n, oid in columns))

    debezium = [("payload", 17), ("type", 25), ("aggregateid", 25), ("aggregatetype", 25), ("id", 2950)]
    routed = OutboxColumns().bind(relation(*debezium))
    assert routed == RoutedTable("public.outbox", 4, 3, 2, 1, 0, True)
    record = routed.event(RULES, text_values(("\\x00ff", "Paid", "a-1", "Order", "u-1")), 0x10, 0x20, 3, 7)
    assert not isinstance(record, Rejected)
    assert (record.topic, record.key, record.value) == ("cdc.outbox.Order", b"a-1", b"\x00\xff")
    assert dict(record.headers) == {"id": b"u-1", "type": b"Paid", "lsn": b"32", "sequence": b"3"}
    assert "has no column aggregatetype" in str(OutboxColumns().bind(relation(("id", 23), ("payload", 114))))
    bad = OutboxColumns(payload="body").bind(relation(*debezium[1:], ("body", 3802)))
    assert isinstance(bad, RoutedTable) and not bad.bytea
    rejected = bad.event(RULES, text_values(("Paid", None, "Order", "u-2", "not json")), 0x10, 0x20, 0, 7)
    assert isinstance(rejected, Rejected) and "aggregate id is null" in rejected.reason
    plain = RoutedTable("public.outbox", 0, 1, 2, 3, 4, False)  # a NULL part: a dead letter, or an empty header
    no_type = plain.event(RULES, text_values(("u-3", None, "a-1", "Paid", "{}")), 0x10, 0x20, 0, 7)
    assert isinstance(no_type, Rejected) and "names no topic" in no_type.reason
    no_payload = plain.event(RULES, text_values(("u-4", "Order", "a-1", "Paid", None)), 0x10, 0x20, 0, 7)
    assert isinstance(no_payload, Rejected) and no_payload.reason == "the payload is null"
    untyped = plain.event(RULES, text_values(("u-5", "Order", "a-1", None, '{"x": 1}')), 0x10, 0x20, 1, 7)
    assert not isinstance(untyped, Rejected) and (untyped.key, untyped.value) == (b"a-1", b'{"x": 1}')
    assert dict(untyped.headers) == {"id": b"u-5", "type": b"", "lsn": b"32", "sequence": b"1"}


def test_an_outbox_rows_columns_read_from_the_frame_equal_the_decoded_ones() -> None:
    """The outbox table's direct path (:func:`raw_values`) reads what the decoder reads, and declines a tuple
    it does not hold whole (the decoder then names what is wrong)."""
    import struct

    from cdc.capture.outbox_table import raw_values, text_values
    from cdc.capture.pgoutput.decoder import Decoder
    from cdc.capture.pgoutput.messages import Insert

    def text(value: str) -> bytes:
        raw = value.encode()
        return b"t" + struct.pack(">i", len(raw)) + raw

    columns = [text("u-1"), b"n", text("Ordér"), text(""), text('{"a": [1, 2]}')]
    frame = b"I" + struct.pack(">I", 7) + b"N" + struct.pack(">h", len(columns)) + b"".join(columns)
    decoded = Decoder().decode(frame, 0x10)
    assert isinstance(decoded, Insert)
    assert raw_values(frame, 6) == text_values(decoded.new) == [b"u-1", None, "Ordér".encode(), b"", b'{"a": [1, 2]}']
    assert raw_values(frame[:-1], 6) is None  # cut short
    assert raw_values(frame.replace(b"n", b"u", 1), 6) is None  # an unchanged TOAST value: not an insert's
