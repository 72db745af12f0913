"""The change records of a table being read, held in a file until its read is in the log.

While a table is read beside the stream (:mod:`cdc.capture.online_read`), the records its transactions
committing at or after the read's boundary give (the very bytes the log would get: encoded, masked and
filtered as for the log) go here instead of to the log, in commit order; they are appended after the
read's last rows. A group's held records are fsynced (:meth:`HeldChanges.sync`) before the log commits
the group, so every held record of a transaction the log's watermark covers is durable: the slot is
never confirmed past a change that lives only in memory, and a capture that resumes the read after a
crash finds them all. Records of transactions past the watermark (a crash between the two fsyncs) are
cut off when the file is opened again (:meth:`HeldChanges.reopen`): the slot sends those again.

On-disk layout, one entry per record, all integers big-endian::

    i64 commit LSN | u32 topic length | i32 key length (-1: none) | i32 value length (-1: tombstone)
    | i64 timestamp ms | u16 header count | topic | key | value | (u16 name length | u32 value length | name | value)*

A torn entry at the end (a crash mid-write) is cut off too. The file lives under
``CDC_DATA_DIR/held/`` (mode 0600, like the log's files: it holds rows) and is deleted when its read
ends or starts over.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from log_store import ProducerRecord

_ENTRY = struct.Struct("!qIiiqH")
_HEADER = struct.Struct("!HI")


def _entry(lsn: int, record: ProducerRecord) -> bytes:
    topic = record.topic.encode()
    key, value = record.key, record.value
    key_len = -1 if key is None else len(key)
    value_len = -1 if value is None else len(value)
    parts = [
        _ENTRY.pack(lsn, len(topic), key_len, value_len, record.timestamp_ms, len(record.headers)),
        topic,
        key or b"",
        value or b"",
    ]
    for name, data in record.headers:
        encoded = name.encode()
        parts += [_HEADER.pack(len(encoded), len(data)), encoded, bytes(data)]
    return b"".join(parts)


def _read_exact(source: BinaryIO, size: int) -> bytes:
    data = source.read(size)
    if len(data) != size:
        raise EOFError
    return data


def _entries(source: BinaryIO) -> Iterator[tuple[int, int, ProducerRecord]]:
    """``(commit LSN, end offset, record)`` of each whole entry, in order (a torn tail ends the iteration)."""
    while True:
        try:
            lsn, topic_len, key_len, value_len, ts_ms, header_count = _ENTRY.unpack(_read_exact(source, _ENTRY.size))
            topic = _read_exact(source, topic_len).decode()
            key = _read_exact(source, key_len) if key_len >= 0 else None
            value = _read_exact(source, value_len) if value_len >= 0 else None
            headers = []
            for _ in range(header_count):
                name_len, data_len = _HEADER.unpack(_read_exact(source, _HEADER.size))
                headers.append((_read_exact(source, name_len).decode(), _read_exact(source, data_len)))
        except (EOFError, struct.error, UnicodeDecodeError):
            return
        yield lsn, source.tell(), ProducerRecord(topic, key, value, ts_ms, tuple(headers))


class HeldChanges:
    """An append-only file of held change records (see the module's docstring for the layout)."""

    def __init__(self, path: Path, *, keep_to: int | None = None) -> None:
        """A new empty file at ``path``; with ``keep_to``, the existing one (:meth:`reopen`)."""
        self.path = path
        self.count = 0
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if keep_to is None:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            self._file = os.fdopen(fd, "r+b")
        else:
            self._file = open(path, "r+b")  # noqa: SIM115 - closed by discard() or close()
            self.cut_to(keep_to)
        self._dirty = False

    def cut_to(self, position: int) -> None:
        """Cut off the records of transactions committed after ``position`` (the log's watermark: the slot
        sends those again) and any torn entry, durably."""
        self._file.flush()
        self._file.seek(0)
        end, self.count = 0, 0
        for lsn, offset, _ in _entries(self._file):
            if lsn > position:
                break
            end, self.count = offset, self.count + 1
        self._file.truncate(end)
        self._file.seek(end)
        os.fsync(self._file.fileno())
        self._dirty = False

    @classmethod
    def reopen(cls, path: Path, position: int) -> HeldChanges:
        """The file at ``path`` with the records of transactions committed after ``position`` (the log's
        watermark: the slot sends those again) and any torn entry cut off."""
        return cls(path, keep_to=position)

    def add(self, lsn: int, records: Iterable[ProducerRecord]) -> None:
        """Append ``records`` of the transaction committed at ``lsn`` (buffered: durable after :meth:`sync`)."""
        for record in records:
            self._file.write(_entry(lsn, record))
            self.count += 1
            self._dirty = True

    def sync(self) -> None:
        """Make every record added so far durable."""
        if self._dirty:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._dirty = False

    def records(self, keep: Callable[[int, bytes | None], bool] | None = None) -> Iterator[ProducerRecord]:
        """Every record added, in order; with ``keep``, only those ``keep(commit LSN, key)`` is true of."""
        self._file.flush()
        with open(self.path, "rb") as source:
            for lsn, _, record in _entries(source):
                if keep is None or keep(lsn, record.key):
                    yield record

    def close(self) -> None:
        """Close the file, leaving it for the next run to resume its read with (:meth:`reopen`)."""
        self._file.close()

    def discard(self) -> None:
        """Close and delete the file."""
        self._file.close()
        self.path.unlink(missing_ok=True)
