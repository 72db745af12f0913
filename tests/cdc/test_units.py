"""Unit tests without a database: Lsn, framing, the pgoutput decoder on recorded bytes, values, events."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import orjson
import pytest

from cdc.catalog import PublishedTable
from cdc.errors import DecodeError
from cdc.events import EventBuilder, TxContext
from cdc.lsn import Lsn
from cdc.pgoutput import UNCHANGED, Decoder
from cdc.pgoutput.messages import (
    Begin,
    Commit,
    Delete,
    Insert,
    LogicalMessage,
    Origin,
    Relation,
    StreamAbort,
    StreamCommit,
    StreamStart,
    Truncate,
    TypeInfo,
    Update,
)
from cdc.spill import SpillBuffer
from cdc.streaming import TransactionAssembler
from cdc.table_snapshots import SnapshotLedger, TableGate
from cdc.tables import TableShape
from cdc.transport.framing import (
    Keepalive,
    XLogData,
    decode_frame,
    encode_keepalive,
    encode_status,
    encode_xlogdata,
)
from cdc.values import converter_for, parse_array, to_float, to_text, to_timestamptz

RECORDED = Path(__file__).parent / "data" / "pgoutput_v2.jsonl"


def recorded() -> list[tuple[int, bytes]]:
    rows = [json.loads(line) for line in RECORDED.read_text().splitlines() if line]
    return [(row["lsn"], bytes.fromhex(row["hex"])) for row in rows]


# -- Lsn ------------------------------------------------------------------------------------------


def test_lsn_text_forms_and_order() -> None:
    lsn = Lsn.parse("16/B374D848")
    assert int(lsn) == (0x16 << 32) | 0xB374D848
    assert str(lsn) == "16/B374D848"
    assert lsn.hex16() == "00000016B374D848"
    assert Lsn.from_hex16(lsn.hex16()) == lsn
    values = [Lsn(5), Lsn(1 << 40), Lsn(0x10), Lsn(0)]
    assert sorted(v.hex16() for v in values) == [v.hex16() for v in sorted(values)]
    with pytest.raises(ValueError):
        Lsn.parse("nope")
    with pytest.raises(ValueError):
        Lsn(-1)


# -- framing --------------------------------------------------------------------------------------


def test_frames_round_trip() -> None:
    frame = decode_frame(encode_xlogdata(10, 20, b"B...", 7))
    assert frame == XLogData(Lsn(10), Lsn(20), 7, b"B...")
    assert decode_frame(encode_keepalive(99, True, 3)) == Keepalive(Lsn(99), 3, True)
    status = encode_status(Lsn(1), Lsn(2), Lsn(3), reply=True, now_us=4)
    assert status == b"r" + struct.pack("!QQQq?", 1, 2, 3, 4, True)
    with pytest.raises(DecodeError, match="unknown replication frame"):
        decode_frame(b"zzz")


# -- decoder on recorded bytes --------------------------------------------------------------------


def test_decoder_reads_every_recorded_message() -> None:
    decoder = Decoder()
    messages = [decoder.decode(payload, lsn) for lsn, payload in recorded()]
    kinds = {type(m).__name__ for m in messages}
    assert {"Begin", "Commit", "Relation", "TypeInfo", "Insert", "Update", "Delete", "Truncate",
            "StreamStart", "StreamStop", "StreamCommit"} <= kinds
    relation = next(m for m in messages if isinstance(m, Relation) and m.name == "things")
    assert relation.namespace == "public" and relation.replica_identity == "default"
    assert [c.name for c in relation.columns if c.key] == ["id"]
    assert relation.columns[1].type_oid == 1700 and relation.columns[1].typmod == (12 << 16 | 2) + 4
    domain = [m for m in messages if isinstance(m, TypeInfo) and m.name == "int4"]
    assert domain, "a domain is announced under its base type"
    first = next(m for m in messages if isinstance(m, Insert))
    assert first.new[:5] == ("1", "19.90", "1.5", "t", "héllo")
    full_update = next(m for m in messages if isinstance(m, Update) and m.old_kind == "O")
    assert full_update.old is not None and full_update.old[0] == "1"
    streamed = [m for m in messages if isinstance(m, Insert) and m.xid is not None]
    assert len(streamed) >= 3000
    assert isinstance(messages[-1], StreamCommit)


def test_assembler_rebuilds_the_streamed_transaction() -> None:
    assembler = TransactionAssembler(memory_limit=4096)
    transactions = [tx for lsn, payload in recorded() if (tx := assembler.feed(payload, lsn)) is not None]
    assert [tx.streamed for tx in transactions][-1] is True
    big = transactions[-1]
    assert big.changes.spilled, "a large transaction is kept on disk, not in memory"
    inserts = [p for p in big.changes if p[:1] == b"I"]
    assert len(inserts) == 3001
    assert [tx.commit_lsn for tx in transactions] == sorted(tx.commit_lsn for tx in transactions)
    assert assembler.idle and assembler.open_streams == 0


def _hand(kind: bytes, *parts: bytes) -> bytes:
    return kind + b"".join(parts)


def test_decoder_hand_built_messages() -> None:
    decoder = Decoder()
    assert decoder.decode(_hand(b"O", struct.pack("!Q", 5), b"node\x00")) == Origin(5, "node")
    msg = decoder.decode(_hand(b"M", b"\x01", struct.pack("!Q", 9), b"pfx\x00", struct.pack("!i", 2), b"hi"))
    assert msg == LogicalMessage(None, True, 9, "pfx", b"hi")
    assert decoder.decode(_hand(b"S", struct.pack("!I", 7), b"\x01")) == StreamStart(7, True)
    update = decoder.decode(_hand(b"U", struct.pack("!II", 7, 42), b"N", struct.pack("!h", 2), b"u",
                                  b"t", struct.pack("!i", 1), b"x"))
    assert update == Update(7, 42, None, None, (UNCHANGED, "x"))
    delete = decoder.decode(_hand(b"D", struct.pack("!II", 7, 42), b"K", struct.pack("!h", 2), b"n",
                                  b"t", struct.pack("!i", 1), b"1"))
    assert delete == Delete(7, 42, "K", (None, "1"))
    assert decoder.decode(_hand(b"T", struct.pack("!IIb", 7, 2, 1), struct.pack("!II", 3, 4))) == Truncate(7, 1, (3, 4))
    decoder.decode(b"E")
    assert decoder.decode(_hand(b"A", struct.pack("!II", 7, 8))) == StreamAbort(7, 8)
    assert decoder.decode(_hand(b"B", struct.pack("!QqI", 1, 2, 3))) == Begin(1, 2, 3)
    assert decoder.decode(_hand(b"C", struct.pack("!bQQq", 0, 1, 2, 3))) == Commit(0, 1, 2, 3)
    with pytest.raises(DecodeError, match="unknown pgoutput message type 'Z'"):
        decoder.decode(b"Z")
    with pytest.raises(DecodeError, match="truncated or malformed"):
        decoder.decode(b"B\x00")


def test_assembler_drops_aborted_streams() -> None:
    assembler = TransactionAssembler()
    insert = _hand(b"I", struct.pack("!II", 9, 1), b"N", struct.pack("!h", 1), b"t", struct.pack("!i", 1), b"1")
    for payload in (_hand(b"S", struct.pack("!I", 9), b"\x01"), insert, b"E", _hand(b"A", struct.pack("!II", 9, 9))):
        assert assembler.feed(payload) is None
    assert assembler.open_streams == 0 and assembler.idle


# -- values ---------------------------------------------------------------------------------------


def test_values_by_type_oid() -> None:
    assert converter_for(20)("9223372036854775807") == 9223372036854775807
    assert converter_for(1700)("12345678901234567890.000000001") == "12345678901234567890.000000001"
    assert converter_for(16)("t") is True and converter_for(16)("f") is False
    assert to_float("NaN") == "NaN" and to_float("-Infinity") == "-Infinity" and to_float("1.5") == 1.5
    assert converter_for(17)("\\xdeadbeef") == "3q2+7w=="
    assert converter_for(1114)("2026-11-21 13:45:00.123456") == "2026-11-21T13:45:00.123456"
    assert to_timestamptz("2026-11-21 13:45:00.123456+02") == "2026-11-21T11:45:00.123456Z"
    assert to_timestamptz("2026-11-21 13:45:00+05:30") == "2026-11-21T08:15:00Z"
    assert to_timestamptz("infinity") == "infinity"
    assert converter_for(1082)("2026-11-21") == "2026-11-21"
    assert converter_for(1266)("13:45:00+02") == "13:45:00+02:00"
    assert converter_for(3802)('{"a": 1}') == '{"a": 1}'
    assert converter_for(1009)('{x,"y,z",NULL,"NULL","a\\"b"}') == ["x", "y,z", None, "NULL", 'a"b']
    assert converter_for(1007)("{{1,2},{3,4}}") == [[1, 2], [3, 4]]
    assert parse_array("[0:1]={1,2}", int) == [1, 2]
    assert converter_for(1186)("1 day 02:00:00") == "1 day 02:00:00"
    assert converter_for(99999, {99999: "int4"})("7") == 7  # a domain over int4
    assert converter_for(99998, {99998: "mood"})("happy") == "happy"  # an enum label
    assert converter_for(424242) is to_text


def test_spill_buffer_keeps_order_across_the_limit() -> None:
    buffer = SpillBuffer(memory_limit=10)
    items = [bytes([i]) * 5 for i in range(20)]
    for item in items:
        buffer.append(item)
    assert buffer.spilled and list(buffer) == items and list(buffer) == items
    buffer.close()


# -- events ---------------------------------------------------------------------------------------


def _shape() -> TableShape:
    return TableShape.build(1, "public", "t", "cdc.public.t", [("id", 20, -1), ("big", 25, -1), ("n", 23, -1)], ["id"])


def test_unchanged_toast_column_is_omitted_and_named() -> None:
    builder = EventBuilder(prefix="cdc", database="db", partitions=3)
    tx = TxContext(100, 5, 1000)
    (record,) = builder.update(_shape(), None, None, ("1", UNCHANGED, "2"), tx)
    value = orjson.loads(record.value or b"")
    assert value["after"] == {"id": 1, "n": 2} and "big" not in value["after"]
    assert record.headers == (("unchanged", b'["big"]'),)
    assert record.key == b'{"id":1}'
    (filled,) = builder.update(_shape(), "O", ("1", "large", "1"), ("1", UNCHANGED, "2"), tx)
    assert orjson.loads(filled.value or b"")["after"]["big"] == "large" and filled.headers == ()
    assert value["source"]["sequence"] == 0 and orjson.loads(filled.value or b"")["source"]["sequence"] == 1


def test_delete_tombstone_truncate_and_key_change() -> None:
    builder = EventBuilder(prefix="cdc", database="db", partitions=3)
    tx = TxContext(100, 5, 1000)
    delete, tombstone = builder.delete(_shape(), "K", ("1", None, None), tx)
    assert orjson.loads(delete.value or b"")["before"] == {"id": 1} and tombstone.value is None
    assert tombstone.key == delete.key == b'{"id":1}'
    source = orjson.loads(delete.value or b"")["source"]
    assert tombstone.headers == (("lsn", b"%d" % source["lsn"]), ("sequence", b"%d" % source["sequence"]))
    records = builder.update(_shape(), "K", ("1", None, None), ("2", "x", "3"), tx)
    assert [orjson.loads(r.value)["op"] if r.value else None for r in records] == ["d", None, "c"]
    truncates = builder.truncate(_shape(), tx)
    assert len(truncates) == 3 and all(orjson.loads(r.value or b"")["op"] == "t" for r in truncates)
    from log_store import partition_for_key

    placed = sorted(getattr(r, "partition", None) if r.key is None else partition_for_key(r.key, 3) for r in truncates)
    assert placed == [0, 1, 2]


def test_snapshot_reads_in_partition_order_keep_each_rows_sequence() -> None:
    import pyarrow as pa

    from cdc.arrow_fragments import literal
    from log_store import partition_for_key

    keys = [b'{"id":%d}' % i for i in range(40)]
    after = [literal(b'{"id":'), pa.array([b"%d" % i for i in range(40)], pa.large_binary()), literal(b"}")]
    tx = TxContext(100, 5, 1000, snapshot="true", sequence=7)
    builder = EventBuilder(prefix="cdc", database="db", partitions=3)
    block = builder.read_encoder(_shape(), tx)(10, 40, pa.array(keys, pa.large_binary()), after)
    got = [(key, orjson.loads(value)) for key, value in zip(block.keys.to_pylist(), block.values.to_pylist())]
    placed = [partition_for_key(key, 3) for key, _ in got]
    assert placed == sorted(placed) and len(set(placed)) == 3  # grouped by partition, in that order
    # row i keeps the sequence it has when the rows are encoded in read order: 7 + 10 (rows before) + i
    assert sorted((value["after"]["id"], value["source"]["sequence"]) for _, value in got) == [
        (i, 17 + i) for i in range(40)]
    assert all(key == b'{"id":%d}' % value["after"]["id"] for key, value in got)
    for partition in range(3):  # and read order within each partition
        ids = [value["after"]["id"] for (_, value), p in zip(got, placed) if p == partition]
        assert ids == sorted(ids)
    assert tx.sequence == 7, "the caller advances the transaction's sequence"


def test_gate_admits_a_table_only_after_its_snapshot() -> None:
    ledger = SnapshotLedger("cdc.__snapshots")
    gate = TableGate(ledger)
    shape = _shape()  # OID 1, public.t
    assert not gate.admits(shape, 500) and gate.wanted == {1: "public.t"}
    gate.wanted.clear()
    gate.holds[1] = 1000  # a snapshot at consistent point 1000 waits to be written
    assert not gate.admits(shape, 992) and gate.admits(shape, 1000) and not gate.wanted
    record = ledger.record(shape, 999, 42, 0)
    assert orjson.loads(record.key or b"") == "public.t"
    assert orjson.loads(record.value or b"") == {"schema": "public", "table": "t", "topic": "cdc.public.t",
                                                 "relid": 1, "lsn": 999, "rows": 42}
    ledger.add([shape], 999)
    gate.holds.clear()
    assert gate.admits(shape, 10)
    recreated = TableShape.build(2, "public", "t", "cdc.public.t", [("id", 20, -1)], ["id"])
    assert not gate.admits(recreated, 2000) and gate.wanted == {2: "public.t"}


def test_a_column_added_with_values_for_existing_rows_uncovers_the_table() -> None:
    """A column numbered above the snapshot's highest that holds a stored default for older rows, or that
    came with a rewrite, asks for a new snapshot; marks are per leaf relation:
    ``<oid>=<highest>/<highest published>/<highest with a stored default>/<relfilenode>/<types>``."""
    ledger = SnapshotLedger("cdc.__snapshots")

    def _marks(*leaves: tuple[object, ...]) -> str:
        """Marks of leaves ``(oid, highest, live, missing, relfilenode[, types])``; types default to int4
        columns 1..live."""
        out = []
        for oid, highest, live, missing, relfilenode, *types in leaves:
            kinds = types[0] if types else ";".join(f"{n}:23:-1" for n in range(1, int(live) + 1))  # type: ignore[call-overload]
            out.append(f"{oid}={highest}/{live}/{missing}/{relfilenode}/{kinds}")
        return ",".join(out)

    shape = _shape()  # OID 1, public.t
    seen = PublishedTable(1, "public", "t", "e:", _marks((1, 2, 2, 1, 900), (2, 3, 3, 0, 901)))  # two leaves
    record = ledger.record(shape, 999, 42, 0, seen)
    assert orjson.loads(record.value or b"")["columns"] == seen.columns
    ledger.add([shape], 999, {1: seen})

    def covers(columns: str) -> bool:
        return ledger.covers("public.t", 1, "e:", columns)

    assert covers(_marks((1, 2, 2, 1, 900), (2, 3, 3, 0, 901)))
    assert covers(_marks((1, 3, 3, 1, 900), (2, 3, 3, 0, 901)))  # ADD COLUMN without a default: existing rows hold null
    assert covers(_marks((1, 2, 2, 1, 905), (2, 3, 3, 0, 901)))  # VACUUM FULL: rewritten, but no column added
    assert covers(_marks((1, 3, 2, 1, 905), (2, 3, 3, 0, 901)))  # a column added and dropped again, then a rewrite
    assert not covers(_marks((1, 3, 3, 3, 900), (2, 3, 3, 0, 901)))  # ADD COLUMN ... DEFAULT: a stored default for older rows
    assert not covers(_marks((1, 3, 3, 1, 905), (2, 3, 3, 0, 901)))  # ... volatile, or an identity: the table was rewritten
    assert not covers(_marks((1, 2, 2, 1, 900), (2, 4, 4, 4, 901)))  # on any leaf
    assert covers(_marks((1, 2, 2, 1, 900), (2, 3, 3, 0, 901), (3, 9, 9, 9, 950)))  # a new leaf is the membership's to judge
    assert ledger.covers("public.t", 1, None, None)  # the stream's question
    # a covered table's marks move on: a column added without a default is not judged again after a rewrite
    ledger.note_columns("public.t", _marks((1, 3, 3, 1, 900), (2, 3, 3, 0, 901)))
    assert covers(_marks((1, 3, 3, 1, 905), (2, 3, 3, 0, 901)))
    # ALTER COLUMN ... TYPE rewrote the stored values (column 2 of leaf 1 is int8 now)
    assert not covers(_marks((1, 2, 2, 1, 906, "1:23:-1;2:20:-1"), (2, 3, 3, 0, 901)))
    # ... a type change that rewrites nothing keeps every value (varchar(10) to varchar(20))
    assert covers(_marks((1, 2, 2, 1, 900, "1:23:-1;2:1043:24"), (2, 3, 3, 0, 901)))
    # a column dropped and added again under its name (the hash of "n" on a new number)
    ledger.note_columns("public.t", _marks((1, 2, 2, 1, 900, "1:23:-1:aa;2:23:-1:bb"), (2, 3, 3, 0, 901)))
    assert not covers(_marks((1, 3, 3, 1, 900, "1:23:-1:aa;3:25:-1:bb"), (2, 3, 3, 0, 901)))
    assert covers(_marks((1, 3, 3, 1, 900, "1:23:-1:aa;3:25:-1:cc"), (2, 3, 3, 0, 901)))  # another name
    # marks written before they held types still judge added columns (and no type change)
    ledger.note_columns("public.t", "1=2/2/1/900,2=3/3/0/901")
    assert not covers(_marks((1, 3, 3, 3, 900), (2, 3, 3, 0, 901)))
    assert covers(_marks((1, 2, 2, 1, 906, "1:23:-1;2:20:-1"), (2, 3, 3, 0, 901)))
    ledger.add([shape], 999)  # an entry from before the log kept column marks: not judged by them
    assert covers(_marks((1, 4, 4, 4, 999), (2, 3, 3, 0, 901)))
    ledger.note_columns("public.t", _marks((1, 4, 4, 4, 999), (2, 3, 3, 0, 901)))  # ... until it is given the marks of now
    assert not covers(_marks((1, 5, 5, 5, 999), (2, 3, 3, 0, 901)))


def test_take_stores_change_frames_as_feed_does() -> None:
    """The capture loop's fast path (runs of raw frames) yields the same transactions as feeding payloads."""
    payloads = recorded()
    update_k = _hand(b"U", struct.pack("!I", 42), b"K", struct.pack("!h", 1), b"t", struct.pack("!i", 1), b"1",
                     b"N", struct.pack("!h", 1), b"t", struct.pack("!i", 1), b"2")
    begin = _hand(b"B", struct.pack("!QqI", 10**12, 0, 77))
    commit = _hand(b"C", struct.pack("!bQQq", 0, 10**12, 10**12 + 8, 0))
    payloads += [(10**12, begin), (10**12, update_k), (10**12, commit)]
    by_feed = TransactionAssembler(memory_limit=4096)
    expected = [tx for lsn, payload in payloads if (tx := by_feed.feed(payload, lsn)) is not None]
    frames: list[bytes | memoryview] = [memoryview(encode_xlogdata(lsn, lsn, payload)) for lsn, payload in payloads]
    by_take = TransactionAssembler(memory_limit=4096)
    got = []
    index = 0
    while True:
        index = by_take.take(frames, index)
        if index >= len(frames):
            break
        frame = decode_frame(frames[index])
        index += 1
        assert isinstance(frame, XLogData)
        if (tx := by_take.feed(frame.payload, frame.data_start)) is not None:
            got.append(tx)
    assert [(t.commit_lsn, t.streamed, t.key_changes, list(t.changes)) for t in got] == [
        (t.commit_lsn, t.streamed, t.key_changes, list(t.changes)) for t in expected]
    assert got[-1].key_changes and not got[0].key_changes


def test_a_truncated_insert_is_a_decode_error_on_the_fast_path_too() -> None:
    from cdc.events import EventBuilder
    from cdc.streaming import ChangeReplayer, Transaction

    class _Catalog:
        type_names: dict[int, str] = {}

    replayer = ChangeReplayer(EventBuilder(prefix="cdc", database="db", partitions=3), _Catalog(),  # type: ignore[arg-type]
                              lambda schema, table: f"cdc.{schema}.{table}", lambda schema, table: True)
    shape = _shape()
    replayer.relations[shape.relid] = shape
    replayer.emitted_schemas[shape.qualified] = (shape.fingerprint(), shape.schema_value(0))
    whole = _hand(b"I", struct.pack("!I", shape.relid), b"N", struct.pack("!h", 3), b"t", struct.pack("!i", 1), b"1",
                  b"n", b"t", struct.pack("!i", 2), b"42")
    changes = SpillBuffer()
    changes.append(whole)
    (record,) = replayer.records(Transaction(1, 100, 108, 0, changes))
    assert record.key == b'{"id":1}' and orjson.loads(record.value or b"")["after"] == {"id": 1, "big": None, "n": 42}
    broken = SpillBuffer()
    broken.append(whole[:-3])
    with pytest.raises(DecodeError, match="truncated or malformed pgoutput message 'I'"):
        list(replayer.records(Transaction(1, 100, 108, 0, broken)))
