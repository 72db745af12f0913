"""The change records of a table being read, held in a file until its read is in the log.

While a table is read beside the stream (:mod:`cdc.capture.online_read`), the records its transactions
committing at or after the read's boundary B give (the very bytes the log would get: encoded, masked
and filtered as for the log) go here instead of to the log, in commit order; they are appended after
the read's last rows. The file is fsynced (:meth:`HeldChanges.sync`) before the slot is confirmed past
the group that gave them, so nothing confirmed lives only in memory.

On-disk layout, one entry per record, all integers big-endian::

    u32 topic length | i32 key length (-1: none) | i32 value length (-1: tombstone) | i64 timestamp ms
    | u16 header count | topic | key | value | (u16 name length | u32 value length | name | value)*

The file lives under ``CDC_DATA_DIR/held/`` (mode 0600, like the log's files: it holds rows) and is
deleted when its read ends, is abandoned, or capture stops.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path

from log_store import ProducerRecord

_ENTRY = struct.Struct("!IiiqH")
_HEADER = struct.Struct("!HI")


def _entry(record: ProducerRecord) -> bytes:
    topic = record.topic.encode()
    key, value = record.key, record.value
    parts = [
        _ENTRY.pack(
            len(topic),
            -1 if key is None else len(key),
            -1 if value is None else len(value),
            record.timestamp_ms,
            len(record.headers),
        ),
        topic,
        key or b"",
        value or b"",
    ]
    for name, data in record.headers:
        encoded = name.encode()
        parts += [_HEADER.pack(len(encoded), len(data)), encoded, bytes(data)]
    return b"".join(parts)


class HeldChanges:
    """An append-only file of held change records (see the module's docstring for the layout)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        self._file = os.fdopen(fd, "w+b")
        self.count = 0
        self._dirty = False

    def add(self, records: Iterable[ProducerRecord]) -> None:
        """Append ``records`` (buffered: durable after :meth:`sync`)."""
        for record in records:
            self._file.write(_entry(record))
            self.count += 1
            self._dirty = True

    def sync(self) -> None:
        """Make every record added so far durable."""
        if self._dirty:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._dirty = False

    def records(self) -> Iterator[ProducerRecord]:
        """Every record added, in order."""
        self._file.flush()
        with open(self.path, "rb") as source:
            while head := source.read(_ENTRY.size):
                topic_len, key_len, value_len, ts_ms, header_count = _ENTRY.unpack(head)
                topic = source.read(topic_len).decode()
                key = source.read(key_len) if key_len >= 0 else None
                value = source.read(value_len) if value_len >= 0 else None
                headers = []
                for _ in range(header_count):
                    name_len, data_len = _HEADER.unpack(source.read(_HEADER.size))
                    headers.append((source.read(name_len).decode(), source.read(data_len)))
                yield ProducerRecord(topic, key, value, ts_ms, tuple(headers))

    def discard(self) -> None:
        """Close and delete the file."""
        self._file.close()
        self.path.unlink(missing_ok=True)
