"""From pgoutput payloads to committed transactions.

:class:`TransactionAssembler` reads the stream in server order and returns each transaction when it
commits, with its change messages kept as raw payloads in a :class:`~cdc.capture.spill.SpillBuffer` (memory
bounded: a million-row transaction sits on disk, not in memory). It handles both a plain transaction
(Begin ... Commit, protocol 1) and a streamed in-progress one (protocol 2: blocks of Stream Start ...
Stream Stop, then Stream Commit, or Stream Abort which discards the transaction or one subtransaction).
:class:`~cdc.capture.change_replayer.ChangeReplayer` turns each committed transaction into log records.

Outbox messages (:mod:`cdc.capture.outbox`) travel the same way: the assembler keeps a transactional
outbox message with its transaction (and refuses a non-transactional one).

Guarantees: a transaction is returned only at its commit, with its changes in the order the server sent
them; nothing of an aborted transaction is returned.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cdc.capture.errors import DecodeError
from cdc.capture.lsn import Lsn
from cdc.capture.pgoutput.decoder import Decoder
from cdc.capture.pgoutput.messages import (
    Begin,
    Commit,
    LogicalMessage,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
)
from cdc.capture.reads.snapshot_requests import PREFIX as REQUEST_PREFIX
from cdc.capture.spill import SpillBuffer
from cdc.capture.transport.framing import PG_EPOCH_OFFSET_US
from event_format.masks import MESSAGE_PREFIX

if TYPE_CHECKING:
    pass

log = logging.getLogger("cdc.capture")

_DATA_TYPES = frozenset(b"RYIUDT")
#: The prefixes of the logical messages capture acts on (the others are skipped at once).
_CAPTURE_PREFIXES = frozenset({MESSAGE_PREFIX, REQUEST_PREFIX})
#: where an XLogData frame's payload starts: 'w', Int64 data start, Int64 WAL end, Int64 send time
_PAYLOAD_AT = 25
#: an XLogData frame's data start (the LSN of the message it carries), after the 'w'
_DATA_START = struct.Struct("!Q")
_PG_EPOCH_MS = PG_EPOCH_OFFSET_US // 1000


@dataclass
class Transaction:
    """A committed transaction: commit LSN, end LSN, xid, commit time and its change payloads."""

    xid: int
    commit_lsn: int
    end_lsn: int
    commit_ts_ms: int
    changes: SpillBuffer
    streamed: bool = False
    aborted_subxids: set[int] = field(default_factory=set)
    #: holds an update that sent the old key ('K'): it may change a row's key (see :mod:`cdc.capture.key_changes`)
    key_changes: bool = False
    #: where its last aborted subtransaction's abort is (streamed only; see
    #: :meth:`cdc.capture.change_replayer.ChangeReplayer.records`)
    last_abort: int = 0

    @property
    def change_count(self) -> int:
        """How many change messages the transaction holds."""
        return self.changes.count

    def close(self) -> None:
        self.changes.close()


@dataclass
class _Open:
    xid: int
    changes: SpillBuffer
    final_lsn: int = 0
    commit_ts_us: int = 0
    aborted_subxids: set[int] = field(default_factory=set)
    key_changes: bool = False
    last_abort: int = 0

    def committed(self, commit: Commit | StreamCommit, *, streamed: bool) -> Transaction:
        """The transaction, closed by ``commit`` (only a streamed one can hold aborted subtransactions)."""
        return Transaction(
            self.xid,
            commit.commit_lsn,
            commit.end_lsn,
            commit.commit_ts_us // 1000 + _PG_EPOCH_MS,
            self.changes,
            streamed,
            self.aborted_subxids,
            self.key_changes,
            self.last_abort,
        )


class TransactionAssembler:
    """Feeds on payloads in server order; :meth:`feed` returns a :class:`Transaction` at its commit.

    Only Begin/Commit and the stream control messages are decoded here; data and Relation messages are
    stored as bytes and decoded once, at replay.
    """

    def __init__(self, memory_limit: int = 8 << 20, outbox_prefix: str = "") -> None:
        self._decoder = Decoder()
        self._memory_limit = memory_limit
        #: how outbox messages' prefixes begin (:mod:`cdc.capture.outbox`; empty: no outbox)
        self._outbox_prefix = outbox_prefix
        self._outbox_bytes = outbox_prefix.encode()
        self._current: _Open | None = None
        self._streams: dict[int, _Open] = {}
        self._stream_xid: int | None = None

    @property
    def idle(self) -> bool:
        """True between transactions (no plain transaction open, no stream block open)."""
        return self._current is None and self._stream_xid is None

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    def take(self, frames: list[bytes | memoryview], start: int = 0) -> int:
        """The fast path of :meth:`feed` for raw CopyData frames: stores the run of XLogData frames from
        ``start`` on that carry changes (or transactional outbox messages) of the open transaction, and
        returns the index of the first frame it did not take (``len(frames)`` when it took them all). The
        caller decodes that frame and hands it to :meth:`feed`, then calls this again after it.
        """
        target = self._current if self._stream_xid is None else self._streams.get(self._stream_xid)
        if target is None:
            return start
        old_at = 5 if self._stream_xid is None else 9  # where an update's old-tuple kind byte sits
        payloads: list[bytes] = []
        lsns: list[int] = []
        append = payloads.append
        data_start = _DATA_START.unpack_from
        end = len(frames)
        index = start
        # a transactional outbox message: 'M', [xid], flags (1), Int64 LSN, then the prefix (see feed)
        flags_at = _PAYLOAD_AT + old_at - 4
        outbox, outbox_at = self._outbox_bytes, flags_at + 9
        outbox_end = outbox_at + len(outbox)
        while index < end:
            frame = frames[index]
            if frame[0] != 0x77 or len(frame) <= _PAYLOAD_AT:
                break
            if frame[_PAYLOAD_AT] not in _DATA_TYPES and not (
                outbox
                and frame[_PAYLOAD_AT] == 0x4D
                and len(frame) > outbox_end
                and frame[flags_at] & 1
                and frame[outbox_at:outbox_end] == outbox
            ):
                break
            payload = bytes(frame[_PAYLOAD_AT:])
            append(payload)
            lsns.append(data_start(frame, 1)[0])
            if payload[0] == 0x55 and len(payload) > old_at and payload[old_at] == 0x4B:
                target.key_changes = True
            index += 1
        if payloads:
            target.changes.extend(payloads, lsns)
        return index

    def feed(self, payload: bytes, lsn: int) -> Transaction | None:
        """Take one message that came at ``lsn`` (its XLogData data start): a change is stored with its
        LSN, so that a decode error at replay names where it is; returns the transaction it commits."""
        kind = payload[0] if payload else 0
        if kind == 0x4D:  # 'M': a logical message; capture's own transactional ones and outbox events are
            # kept with their transaction, to be replayed in order with its changes (new masks, requests
            # to capture, events to publish)
            message = self._decoder.decode(payload, lsn)
            if not isinstance(message, LogicalMessage):
                return None
            outbox = bool(self._outbox_prefix) and message.prefix.startswith(self._outbox_prefix)
            target = self._streams.get(self._stream_xid) if self._stream_xid is not None else self._current
            if not message.transactional:
                if outbox:  # it would publish an event of a transaction that may still roll back
                    log.warning(
                        "refused the non-transactional outbox message %r at LSN %s: nothing is written; emit it with "
                        "pg_logical_emit_message(true, ...) inside the transaction it belongs to",
                        message.prefix,
                        Lsn(message.lsn),
                    )
            elif (outbox or message.prefix in _CAPTURE_PREFIXES) and target is not None:
                target.changes.append(payload, lsn)
            return None
        if kind in _DATA_TYPES:
            if self._stream_xid is not None:
                stream = self._streams[self._stream_xid]
                stream.changes.append(payload, lsn)
                stream.key_changes |= kind == 0x55 and len(payload) > 9 and payload[9] == 0x4B
            elif self._current is not None:
                self._current.changes.append(payload, lsn)
                self._current.key_changes |= kind == 0x55 and len(payload) > 5 and payload[5] == 0x4B
            elif kind in b"RY":
                return None  # a Relation outside a transaction carries nothing to replay
            else:
                raise DecodeError(f"change message outside a transaction at LSN {lsn:X}")
            return None
        message = self._decoder.decode(payload, lsn)
        if isinstance(message, Begin):
            self._current = _Open(message.xid, SpillBuffer(self._memory_limit), message.final_lsn, message.commit_ts_us)
        elif isinstance(message, Commit):
            current, self._current = self._current, None
            if current is None:
                raise DecodeError(f"Commit without Begin at LSN {lsn:X}")
            return current.committed(message, streamed=False)
        elif isinstance(message, StreamStart):
            self._stream_xid = message.xid
            if message.xid not in self._streams:
                self._streams[message.xid] = _Open(message.xid, SpillBuffer(self._memory_limit))
        elif isinstance(message, StreamStop):
            self._stream_xid = None
        elif isinstance(message, StreamCommit):
            ended = self._streams.pop(message.xid, None)
            if ended is None:
                raise DecodeError(f"Stream Commit of unknown transaction {message.xid} at LSN {lsn:X}")
            return ended.committed(message, streamed=True)
        elif isinstance(message, StreamAbort):
            if message.xid == message.subxid:
                aborted = self._streams.pop(message.xid, None)
                if aborted is not None:
                    aborted.changes.close()
            elif message.xid in self._streams:
                stream = self._streams[message.xid]
                stream.aborted_subxids.add(message.subxid)
                stream.last_abort = max(stream.last_abort, lsn)  # the abort record's: the subtransaction is before it
        # Origin and logical Message are skipped: they carry no row change.
        return None

    def reset(self) -> None:
        """Forget every open transaction (after a reconnect the server resends them whole)."""
        if self._current is not None:
            self._current.changes.close()
        for stream in self._streams.values():
            stream.changes.close()
        self._current = None
        self._streams.clear()
        self._stream_xid = None
        self._decoder = Decoder()
