"""Pure encode/decode of the streaming replication CopyData frames (XLogData, keepalive, status update)."""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass

from cdc.capture.errors import DecodeError
from cdc.capture.lsn import Lsn

#: Microseconds between the Unix epoch and PostgreSQL's epoch (2000-01-01 UTC).
PG_EPOCH_OFFSET_US = 946_684_800_000_000

_XLOG_HEADER = struct.Struct("!QQq")
_KEEPALIVE = struct.Struct("!Qq?")
_STATUS = struct.Struct("!cQQQq?")


@dataclass(frozen=True, slots=True)
class XLogData:
    """One ``w`` frame: a pgoutput message that starts at ``data_start`` in the WAL."""

    data_start: Lsn
    wal_end: Lsn
    send_time_us: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class Keepalive:
    """One ``k`` frame: the server's WAL end, and whether it wants a status update now."""

    wal_end: Lsn
    send_time_us: int
    reply_requested: bool


Frame = XLogData | Keepalive


def decode_frame(data: bytes | memoryview) -> Frame:
    """Decode one CopyData payload from the server; any other first byte is a :class:`DecodeError`."""
    if not data:
        raise DecodeError("empty CopyData frame from the replication stream")
    kind = data[0]
    if kind == 0x77:  # 'w'
        start, end, sent = _XLOG_HEADER.unpack_from(data, 1)
        return XLogData(Lsn(start), Lsn(end), sent, bytes(data[1 + _XLOG_HEADER.size :]))
    if kind == 0x6B:  # 'k'
        end, sent, reply = _KEEPALIVE.unpack_from(data, 1)
        return Keepalive(Lsn(end), sent, reply)
    raise DecodeError(f"unknown replication frame type {chr(kind)!r} ({len(data)} bytes)")


def now_pg_us() -> int:
    """The current time in microseconds since PostgreSQL's epoch."""
    return time.time_ns() // 1000 - PG_EPOCH_OFFSET_US


def encode_status(written: Lsn, flushed: Lsn, applied: Lsn, *, reply: bool = False, now_us: int | None = None) -> bytes:
    """A standby status update (``r``).

    ``flushed`` is what the server may discard WAL up to and where a restarted slot resumes: pass only
    a position whose every event is durable downstream.
    """
    return _STATUS.pack(b"r", written, flushed, applied, now_pg_us() if now_us is None else now_us, reply)


def encode_xlogdata(data_start: int, wal_end: int, payload: bytes, send_time_us: int = 0) -> bytes:
    """A ``w`` frame as the server sends it (used to build test streams)."""
    return b"w" + _XLOG_HEADER.pack(data_start, wal_end, send_time_us) + payload


def encode_keepalive(wal_end: int, reply_requested: bool, send_time_us: int = 0) -> bytes:
    """A ``k`` frame as the server sends it (used to build test streams)."""
    return b"k" + _KEEPALIVE.pack(wal_end, send_time_us, reply_requested)
