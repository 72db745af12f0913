"""The commit watermark: ``watermarks.log``, an append-only file of checksummed watermark records.

A watermark says "every record of every append group up to this one is durable": an opaque source
``position`` (the capture side stores the commit LSN), a ``sequence`` number (+1 per group), the
writer's clock, and the end offset of every topic-partition at that point. Readers never read at or past
a partition's end offset in the watermark they use.

File layout (big-endian)::

    offset  size  field
         0     4  magic     b"CWMK"
         4     2  version   1
         6     2  flags     0
         8     .  records, back to back:
                    0  4  crc      uint32  CRC32C of bytes [4, 8 + length) of the record
                    4  4  length   uint32  payload bytes
                    8  .  payload  UTF-8 JSON {"seq": int, "pos": str, "ts": int,
                                              "ends": {topic: [end offset of partition 0, 1, ...]}}

The latest valid record is the watermark. Records are only ever appended (one ``write`` call, then
``fsync``), so a crash at any byte leaves every earlier record intact: the previous watermark stays
readable. A torn or unverifiable *last* record is a write the crash interrupted (its group was never
acknowledged): readers ignore it and the writer's recovery truncates it. A record failing its CRC with a
whole valid record after it is damage, never skipped silently (:class:`CorruptWatermarkError`).

When the file passes ``roll_bytes`` the writer replaces it, atomically (temp file, fsync, rename, directory
fsync), by a file holding only the latest record. Readers notice the new inode and rescan.

Thread/process safety: one writer process appends; readers in any number of processes call
:meth:`WatermarkLog.latest`, which costs one ``stat`` when nothing changed and otherwise reads only the
new bytes. Not thread-safe within one object; the store serialises calls.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from crc32c import crc32c

from log_store.atomic_file import TMP_SUFFIX, fsync_dir, write_all
from log_store.errors import CorruptWatermarkError, LogFormatError
from log_store.record import TopicPartition

MAGIC = b"CWMK"
VERSION = 1
FILE_HEADER = struct.Struct(">4sHH")
FILE_HEADER_SIZE = FILE_HEADER.size  # 8
RECORD_HEADER = struct.Struct(">II")
RECORD_HEADER_SIZE = RECORD_HEADER.size  # 8
FILE_NAME = "watermarks.log"


@dataclass(frozen=True)
class Watermark:
    """A durable commit point: everything below ``end_offsets`` was appended and fsynced."""

    sequence: int
    position: str
    timestamp_ms: int
    end_offsets: dict[TopicPartition, int] = field(default_factory=dict)

    def end_offset(self, tp: TopicPartition) -> int:
        """End offset of ``tp`` at this watermark (0 for a partition it does not know)."""
        return self.end_offsets.get(tp, 0)

    def encode(self) -> bytes:
        """The record payload (see the module docstring)."""
        ends: dict[str, list[int]] = {}
        for tp in sorted(self.end_offsets):
            ends.setdefault(tp.topic, []).append(self.end_offsets[tp])
        return orjson.dumps({"seq": self.sequence, "pos": self.position, "ts": self.timestamp_ms,
                             "ends": ends})

    @classmethod
    def decode(cls, payload: bytes) -> Watermark:
        """Inverse of :meth:`encode`; raises ``ValueError`` on a malformed payload."""
        data = orjson.loads(payload)
        try:
            ends = {TopicPartition(topic, partition): int(end)
                    for topic, offsets in data["ends"].items()
                    for partition, end in enumerate(offsets)}
            return cls(int(data["seq"]), str(data["pos"]), int(data["ts"]), ends)
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"watermark payload lacks a field: {exc}") from None


def encode_record(watermark: Watermark) -> bytes:
    """One framed, checksummed watermark record."""
    payload = watermark.encode()
    length = RECORD_HEADER.pack(0, len(payload))[4:]
    crc = crc32c(payload, crc32c(length))
    return struct.pack(">I", crc) + length + payload


@dataclass
class ScanResult:
    """What a scan of the watermark file found."""

    latest: Watermark | None
    valid_end: int  # byte position just past the last valid record
    torn_bytes: int  # bytes past valid_end that form no valid record


def _parse(data: bytes, start: int, path: Path, file_offset: int = 0) -> tuple[Watermark | None, int]:
    """Parse records in ``data[start:]``; returns the last valid one and where valid bytes end."""
    latest: Watermark | None = None
    pos = start
    end = len(data)
    while pos + RECORD_HEADER_SIZE <= end:
        crc, length = RECORD_HEADER.unpack_from(data, pos)
        stop = pos + RECORD_HEADER_SIZE + length
        if stop > end:
            break
        ok = crc32c(data[pos + 4 : stop]) == crc
        watermark = None
        if ok:
            try:
                watermark = Watermark.decode(data[pos + RECORD_HEADER_SIZE : stop])
            except ValueError:
                ok = False
        if not ok:
            if _valid_record_at(data, stop):
                raise CorruptWatermarkError(path, file_offset + pos,
                                            "a record fails its CRC32C but later records are valid")
            break
        latest = watermark
        pos = stop
    return latest, pos


def _valid_record_at(data: bytes, pos: int) -> bool:
    if pos + RECORD_HEADER_SIZE > len(data):
        return False
    crc, length = RECORD_HEADER.unpack_from(data, pos)
    stop = pos + RECORD_HEADER_SIZE + length
    return stop <= len(data) and crc32c(data[pos + 4 : stop]) == crc


class WatermarkLog:
    """Reader and (for the writer) appender of ``watermarks.log``."""

    def __init__(self, path: Path, roll_bytes: int = 1 << 20) -> None:
        self.path = path
        self.roll_bytes = roll_bytes
        self._inode: int | None = None
        self._scanned_to = 0
        self._latest: Watermark | None = None
        self._fd = -1
        self._size = 0

    @staticmethod
    def create(path: Path) -> None:
        """Create an empty watermark file (atomically; the directory is fsynced)."""
        tmp = path.with_name(path.name + TMP_SUFFIX)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            write_all(fd, FILE_HEADER.pack(MAGIC, VERSION, 0))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        fsync_dir(path.parent)

    def _check_header(self, data: bytes) -> None:
        if len(data) < FILE_HEADER_SIZE:
            raise CorruptWatermarkError(self.path, 0, f"file header is {len(data)} of 8 bytes")
        magic, version, _flags = FILE_HEADER.unpack_from(data, 0)
        if magic != MAGIC:
            raise CorruptWatermarkError(self.path, 0, "not a watermark file (bad magic)")
        if version != VERSION:
            raise LogFormatError(self.path, version, VERSION)

    def latest(self) -> Watermark | None:
        """The latest watermark on disk, reading only bytes appended since the previous call."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            stat = os.fstat(fd)
            if stat.st_ino != self._inode or stat.st_size < self._scanned_to:
                self._inode, self._scanned_to, self._latest = stat.st_ino, 0, None
            if stat.st_size == self._scanned_to:
                return self._latest
            if self._scanned_to == 0:
                data = os.pread(fd, stat.st_size, 0)
                self._check_header(data)
                latest, end = _parse(data, FILE_HEADER_SIZE, self.path)
            else:
                data = os.pread(fd, stat.st_size - self._scanned_to, self._scanned_to)
                latest, end = _parse(data, 0, self.path, self._scanned_to)
                end += self._scanned_to
        finally:
            os.close(fd)
        if latest is not None:
            self._latest = latest
        self._scanned_to = max(end, FILE_HEADER_SIZE)
        return self._latest

    def scan(self) -> ScanResult:
        """Read the whole file: the latest valid watermark and how many trailing bytes are torn."""
        data = self.path.read_bytes()
        self._check_header(data)
        latest, end = _parse(data, FILE_HEADER_SIZE, self.path)
        return ScanResult(latest, end, len(data) - end)

    # --- writer side -------------------------------------------------------------------------

    def open_for_append(self) -> ScanResult:
        """Recover the file (truncate a torn tail, fsync) and keep it open for appends."""
        result = self.scan()
        self._fd = os.open(self.path, os.O_WRONLY)
        if result.torn_bytes:
            os.ftruncate(self._fd, result.valid_end)
            os.fsync(self._fd)
        os.lseek(self._fd, result.valid_end, os.SEEK_SET)
        self._size = result.valid_end
        self._latest = result.latest
        return result

    def append(self, watermark: Watermark) -> None:
        """Append one record and fsync it; rolls the file first when it grew past ``roll_bytes``."""
        record = encode_record(watermark)
        if self._size + len(record) > self.roll_bytes and self._size > FILE_HEADER_SIZE:
            self._roll(record)
        else:
            write_all(self._fd, record)
            os.fsync(self._fd)
            self._size += len(record)
        self._latest = watermark

    def _roll(self, record: bytes) -> None:
        tmp = self.path.with_name(self.path.name + TMP_SUFFIX)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            write_all(fd, FILE_HEADER.pack(MAGIC, VERSION, 0) + record)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        os.replace(tmp, self.path)
        fsync_dir(self.path.parent)
        os.close(self._fd)
        self._fd = fd
        self._size = FILE_HEADER_SIZE + len(record)

    @property
    def current(self) -> Watermark | None:
        """The writer's latest watermark (no disk access)."""
        return self._latest

    def close(self) -> None:
        """Close the append descriptor (idempotent)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
