"""cdc.capture.streaming and cdc.capture.change_replayer: transactions assembled from pgoutput messages, then replayed."""

from __future__ import annotations

import struct

import orjson
import pytest

from cdc.capture.errors import DecodeError
from cdc.capture.events import EventBuilder
from cdc.capture.spill import SpillBuffer
from cdc.capture.streaming import TransactionAssembler
from cdc.capture.transport.framing import (
    XLogData,
    decode_frame,
    encode_xlogdata,
)
from tests.cdc.wire import hand_message, recorded, sample_shape


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


def test_assembler_drops_aborted_streams() -> None:
    assembler = TransactionAssembler()
    insert = hand_message(b"I", struct.pack("!II", 9, 1), b"N", struct.pack("!h", 1), b"t", struct.pack("!i", 1), b"1")
    start, abort = hand_message(b"S", struct.pack("!I", 9), b"\x01"), hand_message(b"A", struct.pack("!II", 9, 9))
    for lsn, payload in enumerate((start, insert, b"E", abort), 0x100):
        assert assembler.feed(payload, lsn) is None
    assert assembler.open_streams == 0 and assembler.idle


def test_take_stores_change_frames_as_feed_does() -> None:
    """The capture loop's fast path (runs of raw frames) yields the same transactions as feeding payloads."""
    payloads = recorded()
    update_k = hand_message(
        b"U",
        struct.pack("!I", 42),
        b"K",
        struct.pack("!h", 1),
        b"t",
        struct.pack("!i", 1),
        b"1",
        b"N",
        struct.pack("!h", 1),
        b"t",
        struct.pack("!i", 1),
        b"2",
    )
    begin = hand_message(b"B", struct.pack("!QqI", 10**12, 0, 77))
    commit = hand_message(b"C", struct.pack("!bQQq", 0, 10**12, 10**12 + 8, 0))
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
        (t.commit_lsn, t.streamed, t.key_changes, list(t.changes)) for t in expected
    ]
    assert got[-1].key_changes and not got[0].key_changes


def test_a_truncated_insert_is_a_decode_error_on_the_fast_path_too() -> None:
    from cdc.capture.change_replayer import ChangeReplayer
    from cdc.capture.streaming import Transaction

    class _Catalog:
        type_names: dict[int, str] = {}

    replayer = ChangeReplayer(
        EventBuilder(prefix="cdc", database="db", partitions=3),
        _Catalog(),  # type: ignore[arg-type]
        lambda schema, table: f"cdc.{schema}.{table}",
        lambda schema, table: True,
    )
    shape = sample_shape()
    replayer.relations[shape.relid] = shape
    replayer.emitted_schemas[shape.qualified] = (shape.fingerprint(), shape.schema_value(0))
    whole = hand_message(
        b"I",
        struct.pack("!I", shape.relid),
        b"N",
        struct.pack("!h", 3),
        b"t",
        struct.pack("!i", 1),
        b"1",
        b"n",
        b"t",
        struct.pack("!i", 2),
        b"42",
    )
    changes = SpillBuffer()
    changes.append(whole)
    (record,) = replayer.records(Transaction(1, 100, 108, 0, changes))
    assert record.key == b'{"id":1}' and orjson.loads(record.value or b"")["after"] == {"id": 1, "big": None, "n": 42}
    broken = SpillBuffer()
    broken.append(whole[:-3], 0x16B3748)
    with pytest.raises(DecodeError, match="truncated or malformed pgoutput message 'I' at LSN 16B3748"):
        list(replayer.records(Transaction(1, 100, 108, 0, broken)))


def test_a_malformed_change_is_reported_at_its_own_lsn() -> None:
    """A change stored by :meth:`feed` or by the frames' fast path (:meth:`take`), then decoded at
    replay, is reported at the LSN it came at: not 0, not its transaction's commit."""
    from cdc.capture.change_replayer import ChangeReplayer

    class _Catalog:
        type_names: dict[int, str] = {}

    shape = sample_shape()
    begin = hand_message(b"B", struct.pack("!QqI", 0x2000, 0, 77))
    update = hand_message(b"U", struct.pack("!I", shape.relid), b"N", struct.pack("!h", 3), b"t")  # cut short
    commit = hand_message(b"C", struct.pack("!bQQq", 0, 0x2000, 0x2008, 0))
    messages = [(0x1000, begin), (0x1A2B, update), (0x2000, commit)]
    fed = TransactionAssembler()
    (by_feed,) = [tx for lsn, payload in messages if (tx := fed.feed(payload, lsn)) is not None]
    taken = TransactionAssembler()
    frames: list[bytes | memoryview] = [memoryview(encode_xlogdata(lsn, lsn, payload)) for lsn, payload in messages]
    assert taken.feed(begin, 0x1000) is None and taken.take(frames, 1) == 2
    by_take = taken.feed(commit, 0x2000)
    assert by_take is not None
    for tx in (by_feed, by_take):
        assert list(tx.changes.positioned()) == [(0x1A2B, update)]
        replayer = ChangeReplayer(
            EventBuilder(prefix="cdc", database="db", partitions=3),
            _Catalog(),  # type: ignore[arg-type]
            lambda schema, table: f"cdc.{schema}.{table}",
            lambda schema, table: True,
        )
        replayer.relations[shape.relid] = shape
        with pytest.raises(DecodeError, match="truncated or malformed pgoutput message 'U' at LSN 1A2B:"):
            list(replayer.records(tx))
