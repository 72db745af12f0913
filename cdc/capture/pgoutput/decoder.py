"""Sans-IO pgoutput decoder: bytes of one XLogData payload in, one message value out.

One documented handler per message type, chosen by the first byte. The decoder keeps a single piece of
state: whether it is inside a stream block (protocol 2, between Stream Start and Stream Stop), because
only there do data messages carry a leading transaction id. It does no I/O and never blocks, so it is
tested on recorded or hand-built bytes.

Restart rule: after a reconnect the server resends, for the first transaction it streams, its Begin and
every Relation message it needs, so a fresh decoder and an empty relation cache are always correct.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from cdc.capture.errors import DecodeError
from cdc.capture.pgoutput.messages import (
    UNCHANGED,
    Begin,
    Column,
    Commit,
    Delete,
    Insert,
    LogicalMessage,
    Message,
    Origin,
    Relation,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
    Tuple,
    TypeInfo,
    Update,
)

_I16 = struct.Struct("!h")
_I32 = struct.Struct("!i")
_U32 = struct.Struct("!I")
_U64 = struct.Struct("!Q")
_BEGIN = struct.Struct("!QqI")
_COMMIT = struct.Struct("!bQQq")
_STREAM_COMMIT = struct.Struct("!IbQQq")
_REPLICA_IDENTITY = {"d": "default", "n": "nothing", "f": "full", "i": "index"}


class Decoder:
    """Turns pgoutput payloads into :mod:`cdc.capture.pgoutput.messages` values.

    Feed payloads in the order the server sent them; the stream-block state depends on that order.
    """

    def __init__(self) -> None:
        self.in_stream = False
        self._handlers: dict[int, Callable[[memoryview], Message]] = {
            ord("B"): self._begin,
            ord("C"): self._commit,
            ord("O"): self._origin,
            ord("R"): self._relation,
            ord("Y"): self._type,
            ord("I"): self._insert,
            ord("U"): self._update,
            ord("D"): self._delete,
            ord("T"): self._truncate,
            ord("M"): self._message,
            ord("S"): self._stream_start,
            ord("E"): self._stream_stop,
            ord("c"): self._stream_commit,
            ord("A"): self._stream_abort,
        }

    def decode(self, payload: bytes, lsn: int = 0) -> Message:
        """Decode one message; ``lsn`` (its WAL position) only serves the error message."""
        if not payload:
            raise DecodeError(f"empty pgoutput message at LSN {lsn:X}")
        handler = self._handlers.get(payload[0])
        if handler is None:
            raise DecodeError(
                f"unknown pgoutput message type {chr(payload[0])!r} at LSN {lsn:X}; "
                "the server speaks a newer protocol than proto_version asked for"
            )
        try:
            return handler(memoryview(payload))
        except (struct.error, IndexError, UnicodeDecodeError) as exc:
            raise DecodeError(f"truncated or malformed pgoutput message {chr(payload[0])!r} at LSN {lsn:X}: {exc}") from None

    # -- helpers -------------------------------------------------------------------------------------

    def _xid(self, buf: memoryview) -> tuple[int | None, int]:
        """Leading xid of a data message inside a stream block; returns (xid, next offset)."""
        if self.in_stream:
            return _U32.unpack_from(buf, 1)[0], 5
        return None, 1

    @staticmethod
    def _string(buf: memoryview, pos: int) -> tuple[str, int]:
        end = bytes(buf[pos:]).index(0) + pos
        return str(buf[pos:end], "utf-8"), end + 1

    @staticmethod
    def _tuple(buf: memoryview, pos: int) -> tuple[Tuple, int]:
        """TupleData: Int16 count, then per column 'n' (null), 'u' (unchanged TOAST), 't'/'b' + Int32 len."""
        count = _I16.unpack_from(buf, pos)[0]
        pos += 2
        values: list[str | None | object] = []
        append = values.append
        unpack_len = _I32.unpack_from
        for _ in range(count):
            kind = buf[pos]
            pos += 1
            if kind == 0x74:  # 't'
                length = unpack_len(buf, pos)[0]
                pos += 4
                append(str(buf[pos : pos + length], "utf-8"))
                pos += length
            elif kind == 0x6E:  # 'n'
                append(None)
            elif kind == 0x75:  # 'u'
                append(UNCHANGED)
            elif kind == 0x62:  # 'b' (binary mode is never requested)
                raise DecodeError("binary tuple data received although binary mode was not requested")
            else:
                raise DecodeError(f"unknown tuple column kind {chr(kind)!r}")
        return tuple(values), pos  # type: ignore[arg-type]

    # -- one handler per message type ----------------------------------------------------------------

    def _begin(self, buf: memoryview) -> Begin:
        """'B': Int64 final (commit) LSN, Int64 commit time (µs since 2000), Int32 xid."""
        final_lsn, ts, xid = _BEGIN.unpack_from(buf, 1)
        return Begin(final_lsn, ts, xid)

    def _commit(self, buf: memoryview) -> Commit:
        """'C': Int8 flags, Int64 commit LSN, Int64 end LSN, Int64 commit time."""
        flags, commit_lsn, end_lsn, ts = _COMMIT.unpack_from(buf, 1)
        return Commit(flags, commit_lsn, end_lsn, ts)

    def _origin(self, buf: memoryview) -> Origin:
        """'O': Int64 origin LSN, String origin name. Capture skips it."""
        lsn = _U64.unpack_from(buf, 1)[0]
        name, _ = self._string(buf, 9)
        return Origin(lsn, name)

    def _relation(self, buf: memoryview) -> Relation:
        """'R': [xid], Int32 relid, String namespace, String name, Int8 replica identity, Int16 ncols,
        per column Int8 flags (1 = part of the key), String name, Int32 type OID, Int32 typmod."""
        xid, pos = self._xid(buf)
        relid = _U32.unpack_from(buf, pos)[0]
        namespace, pos = self._string(buf, pos + 4)
        name, pos = self._string(buf, pos)
        identity = chr(buf[pos])
        count = _I16.unpack_from(buf, pos + 1)[0]
        pos += 3
        columns = []
        for _ in range(count):
            flags = buf[pos]
            column_name, pos = self._string(buf, pos + 1)
            type_oid = _U32.unpack_from(buf, pos)[0]
            typmod = _I32.unpack_from(buf, pos + 4)[0]
            pos += 8
            columns.append(Column(column_name, type_oid, typmod, bool(flags & 1)))
        return Relation(xid, relid, namespace, name, _REPLICA_IDENTITY.get(identity, identity), tuple(columns))

    def _type(self, buf: memoryview) -> TypeInfo:
        """'Y': [xid], Int32 type OID, String namespace, String name."""
        xid, pos = self._xid(buf)
        oid = _U32.unpack_from(buf, pos)[0]
        namespace, pos = self._string(buf, pos + 4)
        name, _ = self._string(buf, pos)
        return TypeInfo(xid, oid, namespace, name)

    def _insert(self, buf: memoryview) -> Insert:
        """'I': [xid], Int32 relid, 'N', TupleData of the new row."""
        xid, pos = self._xid(buf)
        relid = _U32.unpack_from(buf, pos)[0]
        if buf[pos + 4] != 0x4E:
            raise DecodeError("insert without a new tuple")
        new, _ = self._tuple(buf, pos + 5)
        return Insert(xid, relid, new)

    def _update(self, buf: memoryview) -> Update:
        """'U': [xid], Int32 relid, optional 'K' (old key) or 'O' (old row) + TupleData, 'N' + TupleData."""
        xid, pos = self._xid(buf)
        relid = _U32.unpack_from(buf, pos)[0]
        pos += 4
        old_kind: str | None = None
        old: Tuple | None = None
        if buf[pos] in (0x4B, 0x4F):
            old_kind = chr(buf[pos])
            old, pos = self._tuple(buf, pos + 1)
        if buf[pos] != 0x4E:
            raise DecodeError("update without a new tuple")
        new, _ = self._tuple(buf, pos + 1)
        return Update(xid, relid, old_kind, old, new)

    def _delete(self, buf: memoryview) -> Delete:
        """'D': [xid], Int32 relid, 'K' (old key) or 'O' (old row), TupleData."""
        xid, pos = self._xid(buf)
        relid = _U32.unpack_from(buf, pos)[0]
        old_kind = chr(buf[pos + 4])
        old, _ = self._tuple(buf, pos + 5)
        return Delete(xid, relid, old_kind, old)

    def _truncate(self, buf: memoryview) -> Truncate:
        """'T': [xid], Int32 relation count, Int8 options (1 cascade, 2 restart identity), Int32 relids."""
        xid, pos = self._xid(buf)
        count = _U32.unpack_from(buf, pos)[0]
        options = buf[pos + 4]
        relids = struct.unpack_from(f"!{count}I", buf, pos + 5)
        return Truncate(xid, options, tuple(relids))

    def _message(self, buf: memoryview) -> LogicalMessage:
        """'M': [xid], Int8 flags (1 transactional), Int64 LSN, String prefix, Int32 length, bytes."""
        xid, pos = self._xid(buf)
        flags = buf[pos]
        lsn = _U64.unpack_from(buf, pos + 1)[0]
        prefix, pos = self._string(buf, pos + 9)
        length = _I32.unpack_from(buf, pos)[0]
        return LogicalMessage(xid, bool(flags & 1), lsn, prefix, bytes(buf[pos + 4 : pos + 4 + length]))

    def _stream_start(self, buf: memoryview) -> StreamStart:
        """'S': Int32 xid, Int8 first segment; data messages carry an xid until Stream Stop."""
        xid = _U32.unpack_from(buf, 1)[0]
        first = buf[5] == 1
        self.in_stream = True
        return StreamStart(xid, first)

    def _stream_stop(self, buf: memoryview) -> StreamStop:
        """'E': end of the current stream block."""
        self.in_stream = False
        return StreamStop()

    def _stream_commit(self, buf: memoryview) -> StreamCommit:
        """'c': Int32 xid, Int8 flags, Int64 commit LSN, Int64 end LSN, Int64 commit time."""
        xid, flags, commit_lsn, end_lsn, ts = _STREAM_COMMIT.unpack_from(buf, 1)
        return StreamCommit(xid, flags, commit_lsn, end_lsn, ts)

    def _stream_abort(self, buf: memoryview) -> StreamAbort:
        """'A': Int32 xid, Int32 subtransaction xid (equal to xid when the whole transaction aborts)."""
        xid, subxid = struct.unpack_from("!II", buf, 1)
        return StreamAbort(xid, subxid)
