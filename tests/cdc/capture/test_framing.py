"""cdc.capture.transport.framing: replication protocol frames."""

from __future__ import annotations

import struct

import pytest

from cdc.capture.errors import DecodeError
from cdc.capture.lsn import Lsn
from cdc.capture.transport.framing import (
    Keepalive,
    XLogData,
    decode_frame,
    encode_keepalive,
    encode_status,
    encode_xlogdata,
)


def test_frames_round_trip() -> None:
    frame = decode_frame(encode_xlogdata(10, 20, b"B...", 7))
    assert frame == XLogData(Lsn(10), Lsn(20), 7, b"B...")
    assert decode_frame(encode_keepalive(99, True, 3)) == Keepalive(Lsn(99), 3, True)
    status = encode_status(Lsn(1), Lsn(2), Lsn(3), reply=True, now_us=4)
    assert status == b"r" + struct.pack("!QQQq?", 1, 2, 3, 4, True)
    with pytest.raises(DecodeError, match="unknown replication frame"):
        decode_frame(b"zzz")
