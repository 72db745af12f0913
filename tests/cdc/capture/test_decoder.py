"""cdc.capture.pgoutput: the decoder on recorded and hand-built messages."""

from __future__ import annotations

import struct

import pytest

from cdc.capture.errors import DecodeError
from cdc.capture.pgoutput import UNCHANGED, Decoder
from cdc.capture.pgoutput.messages import (
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
from tests.cdc.wire import hand_message, recorded


def test_decoder_reads_every_recorded_message() -> None:
    decoder = Decoder()
    messages = [decoder.decode(payload, lsn) for lsn, payload in recorded()]
    kinds = {type(m).__name__ for m in messages}
    assert {
        "Begin",
        "Commit",
        "Relation",
        "TypeInfo",
        "Insert",
        "Update",
        "Delete",
        "Truncate",
        "StreamStart",
        "StreamStop",
        "StreamCommit",
    } <= kinds
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


def test_decoder_hand_built_messages() -> None:
    decoder = Decoder()
    assert decoder.decode(hand_message(b"O", struct.pack("!Q", 5), b"node\x00")) == Origin(5, "node")
    msg = decoder.decode(hand_message(b"M", b"\x01", struct.pack("!Q", 9), b"pfx\x00", struct.pack("!i", 2), b"hi"))
    assert msg == LogicalMessage(None, True, 9, "pfx", b"hi")
    assert decoder.decode(hand_message(b"S", struct.pack("!I", 7), b"\x01")) == StreamStart(7, True)
    update = decoder.decode(
        hand_message(b"U", struct.pack("!II", 7, 42), b"N", struct.pack("!h", 2), b"u", b"t", struct.pack("!i", 1), b"x")
    )
    assert update == Update(7, 42, None, None, (UNCHANGED, "x"))
    delete = decoder.decode(
        hand_message(b"D", struct.pack("!II", 7, 42), b"K", struct.pack("!h", 2), b"n", b"t", struct.pack("!i", 1), b"1")
    )
    assert delete == Delete(7, 42, "K", (None, "1"))
    assert decoder.decode(hand_message(b"T", struct.pack("!IIb", 7, 2, 1), struct.pack("!II", 3, 4))) == Truncate(7, 1, (3, 4))
    decoder.decode(b"E")
    assert decoder.decode(hand_message(b"A", struct.pack("!II", 7, 8))) == StreamAbort(7, 8)
    assert decoder.decode(hand_message(b"B", struct.pack("!QqI", 1, 2, 3))) == Begin(1, 2, 3)
    assert decoder.decode(hand_message(b"C", struct.pack("!bQQq", 0, 1, 2, 3))) == Commit(0, 1, 2, 3)
    with pytest.raises(DecodeError, match="unknown pgoutput message type 'Z'"):
        decoder.decode(b"Z")
    with pytest.raises(DecodeError, match="truncated or malformed"):
        decoder.decode(b"B\x00")
