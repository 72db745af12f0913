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
acknowledged): the writer's recovery truncates it. A record failing its CRC with a
whole valid record after it is damage, never skipped silently (:class:`CorruptWatermarkError`).

To save a disk round trip the writer fsyncs a group's segments and its watermark record *concurrently*;
``append_group`` returns (and readers learn of the watermark) only when both are durable. So after a
crash only the *last* record can be ahead of its data: recovery then drops that one record (its group was
never acknowledged) and uses the previous one; if the previous one's data is incomplete too, that is
damage and recovery stops. For the same reason, when the file passes ``roll_bytes`` the writer replaces it
(atomically: temp file, fsync, rename, directory fsync) by a file holding the *two* latest records.

Readers do not read ``watermarks.log`` (its newest record may not be durable yet). They read
``watermark.pub``, which the writer updates only after a watermark and its data are durable::

    offset  size  field
         0     4  magic      b"CWMP"
         4     2  version    1
         6     2  flags      0
         8     4  slot_size  uint32
        12     4  reserved   0
        16     .  slot 0, then slot 1 at 16 + slot_size; each: crc u32 (CRC32C of length + payload),
                  length u32, payload (as above), zero padding to slot_size

Watermark ``seq`` is written into slot ``seq % 2`` with one ``pwrite``, so a reader (or a crash) that
catches a slot half-written still finds the previous watermark whole in the other slot; readers take the
valid slot with the highest ``seq``. When a payload outgrows the slots the file is rewritten with larger
slots (temp file, rename). The published file needs no fsync of its own: it only ever names watermarks
already durable in ``watermarks.log``, and the writer rewrites it from there when it opens.

Thread/process safety: one writer process appends and publishes; readers in any number of processes call
:meth:`WatermarkLog.latest` (one small read per call). Not thread-safe within one object; the store
serialises calls.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from crc32c import crc32c

from log_store.atomic_file import TMP_SUFFIX, create_file, fsync_dir, start_writeback, write_all
from log_store.errors import CorruptWatermarkError, LogFormatError
from log_store.record import TopicPartition

MAGIC = b"CWMK"
VERSION = 1
FILE_HEADER = struct.Struct(">4sHH")
FILE_HEADER_SIZE = FILE_HEADER.size  # 8
RECORD_HEADER = struct.Struct(">II")
RECORD_HEADER_SIZE = RECORD_HEADER.size  # 8
FILE_NAME = "watermarks.log"
PUBLISHED_NAME = "watermark.pub"
PUB_MAGIC = b"CWMP"
PUB_HEADER = struct.Struct(">4sHHII")
PUB_HEADER_SIZE = PUB_HEADER.size  # 16


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
        return orjson.dumps({"seq": self.sequence, "pos": self.position, "ts": self.timestamp_ms, "ends": ends})

    @classmethod
    def decode(cls, payload: bytes) -> Watermark:
        """Inverse of :meth:`encode`; raises ``ValueError`` on a malformed payload."""
        data = orjson.loads(payload)
        try:
            ends = {
                TopicPartition(topic, partition): int(end)
                for topic, offsets in data["ends"].items()
                for partition, end in enumerate(offsets)
            }
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
    previous: Watermark | None  # the record before the latest one
    latest_start: int  # byte position where the latest record starts
    valid_end: int  # byte position just past the last valid record
    torn_bytes: int  # bytes past valid_end that form no valid record


def _parse(data: bytes, start: int, path: Path) -> ScanResult:
    """Parse the records in ``data[start:]`` (see the module docstring for what is torn or damage)."""
    latest: Watermark | None = None
    previous: Watermark | None = None
    latest_start = pos = start
    end = len(data)
    while pos + RECORD_HEADER_SIZE <= end:
        crc, length = RECORD_HEADER.unpack_from(data, pos)
        stop = pos + RECORD_HEADER_SIZE + length
        if stop > end:
            break
        watermark = _decode_framed(data, pos, crc, stop)
        if watermark is None:
            if _valid_record_at(data, stop):
                raise CorruptWatermarkError(path, pos, "a record fails its CRC32C but later records are valid")
            break
        previous, latest, latest_start = latest, watermark, pos
        pos = stop
    return ScanResult(latest, previous, latest_start, pos, end - pos)


def _decode_framed(data: bytes, pos: int, crc: int, stop: int) -> Watermark | None:
    if crc32c(data[pos + 4 : stop]) != crc:
        return None
    try:
        return Watermark.decode(data[pos + RECORD_HEADER_SIZE : stop])
    except ValueError:
        return None


def _valid_record_at(data: bytes, pos: int) -> bool:
    if pos + RECORD_HEADER_SIZE > len(data):
        return False
    crc, length = RECORD_HEADER.unpack_from(data, pos)
    stop = pos + RECORD_HEADER_SIZE + length
    return stop <= len(data) and crc32c(data[pos + 4 : stop]) == crc


def _slot_size(record_bytes: int) -> int:
    size = 256
    while size < 2 * record_bytes:
        size *= 2
    return size


def read_published(path: Path) -> Watermark | None:
    """The newest whole watermark in a ``watermark.pub`` file (``None`` when it holds none)."""
    data = path.read_bytes()
    if len(data) < PUB_HEADER_SIZE:
        raise CorruptWatermarkError(path, 0, f"file header is {len(data)} of 16 bytes")
    magic, version, _flags, slot_size, _reserved = PUB_HEADER.unpack_from(data, 0)
    if magic != PUB_MAGIC:
        raise CorruptWatermarkError(path, 0, "not a published watermark file (bad magic)")
    if version != VERSION:
        raise LogFormatError(path, version, VERSION)
    best: Watermark | None = None
    for slot in (0, 1):
        pos = PUB_HEADER_SIZE + slot * slot_size
        if pos + RECORD_HEADER_SIZE > len(data):
            continue
        crc, length = RECORD_HEADER.unpack_from(data, pos)
        stop = pos + RECORD_HEADER_SIZE + length
        if length == 0 or length > slot_size - RECORD_HEADER_SIZE or stop > len(data):
            continue
        watermark = _decode_framed(data, pos, crc, stop)
        if watermark is not None and (best is None or watermark.sequence > best.sequence):
            best = watermark
    return best


class WatermarkLog:
    """Reader and (for the writer) appender of ``watermarks.log``."""

    def __init__(self, path: Path, roll_bytes: int = 1 << 20) -> None:
        self.path = path
        self.roll_bytes = roll_bytes
        self._latest: Watermark | None = None
        self._latest_record = b""
        self._fd = -1
        self._size = 0
        self._pub_fd = -1
        self._pub_slot = 0
        self._published = path.with_name(PUBLISHED_NAME)

    @staticmethod
    def create(path: Path) -> None:
        """Create an empty watermark file (atomically; the directory is fsynced)."""
        tmp = path.with_name(path.name + TMP_SUFFIX)
        fd = create_file(tmp, os.O_WRONLY | os.O_TRUNC)
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
        """The latest *durable* watermark, as published for readers (``None`` before the first)."""
        for _ in range(3):
            try:
                watermark = read_published(self._published)
            except FileNotFoundError:
                return None
            if watermark is not None:
                return watermark  # else: no watermark yet, or both slots caught mid-write: retry
        return None

    def scan(self) -> ScanResult:
        """Read the whole file: latest and previous valid watermark, and how many bytes are torn."""
        data = self.path.read_bytes()
        self._check_header(data)
        return _parse(data, FILE_HEADER_SIZE, self.path)

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
        if result.latest is not None:
            self._latest_record = encode_record(result.latest)
        return result

    def drop_latest(self, result: ScanResult) -> None:
        """Remove the latest record (recovery found its data incomplete); fsynced."""
        os.ftruncate(self._fd, result.latest_start)
        os.fsync(self._fd)
        os.lseek(self._fd, result.latest_start, os.SEEK_SET)
        self._size = result.latest_start
        self._latest = result.previous
        self._latest_record = encode_record(result.previous) if result.previous is not None else b""

    def append(self, watermark: Watermark) -> None:
        """Append one record and make it durable (``fdatasync``); rolls the file when it is big."""
        self.write(watermark)
        self.sync()

    def write(self, watermark: Watermark) -> None:
        """Append one record without making it durable yet (:meth:`sync` does); rolls the file when it
        is big (a roll is durable at once). The writer makes the record durable before it publishes
        it or acknowledges its group."""
        record = encode_record(watermark)
        if self._size + len(record) > self.roll_bytes and self._size > FILE_HEADER_SIZE:
            self._roll(self._latest_record + record)
        else:
            write_all(self._fd, record)
            self._size += len(record)
        self._latest = watermark
        self._latest_record = record

    def sync(self) -> None:
        """Make the records written so far durable (``fdatasync``)."""
        os.fdatasync(self._fd)

    def start_writeback(self) -> None:
        """Start writing the records written so far out now (a hint; :meth:`sync` makes them
        durable)."""
        start_writeback(self._fd)

    def _roll(self, records: bytes) -> None:
        tmp = self.path.with_name(self.path.name + TMP_SUFFIX)
        fd = create_file(tmp, os.O_WRONLY | os.O_TRUNC)
        try:
            write_all(fd, FILE_HEADER.pack(MAGIC, VERSION, 0) + records)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        os.replace(tmp, self.path)
        fsync_dir(self.path.parent)
        os.close(self._fd)
        self._fd = fd
        self._size = FILE_HEADER_SIZE + len(records)

    def publish(self, watermark: Watermark | None) -> None:
        """Tell readers about ``watermark`` (which must be durable together with its data)."""
        path = self._published
        if watermark is None:
            record = b""
        elif watermark is self._latest and self._latest_record:
            record = self._latest_record  # encoded once, by write()
        else:
            record = encode_record(watermark)
        if self._pub_fd < 0 or len(record) > self._pub_slot:
            slot = _slot_size(len(record))
            padded = record.ljust(slot, b"\0")
            tmp = path.with_name(path.name + TMP_SUFFIX)
            fd = create_file(tmp, os.O_RDWR | os.O_TRUNC)
            try:
                write_all(fd, PUB_HEADER.pack(PUB_MAGIC, VERSION, 0, slot, 0) + padded + padded)
            except BaseException:
                os.close(fd)
                raise
            os.replace(tmp, path)
            if self._pub_fd >= 0:
                os.close(self._pub_fd)
            self._pub_fd, self._pub_slot = fd, slot
            return
        assert watermark is not None
        os.pwrite(self._pub_fd, record, PUB_HEADER_SIZE + (watermark.sequence % 2) * self._pub_slot)

    @property
    def current(self) -> Watermark | None:
        """The writer's latest watermark (no disk access)."""
        return self._latest

    def close(self) -> None:
        """Close the append descriptors (idempotent)."""
        for name in ("_fd", "_pub_fd"):
            fd = getattr(self, name)
            if fd >= 0:
                os.close(fd)
                setattr(self, name, -1)
