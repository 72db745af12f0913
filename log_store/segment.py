"""Segment files: ``<base_offset:020d>.log``, a file header followed by record batches.

A partition directory holds segments named by the offset of their first offset slot (zero-padded to 20
digits so that name order is offset order). Segment file layout (big-endian)::

    offset  size  field
         0     4  magic          b"CLOG"
         4     2  version        1
         6     2  flags          0
         8     8  base_offset    int64, equal to the number in the file name
        16     8  nonce          uint64, random per file instance (ties the .index to this file)
        24     4  header_crc     CRC32C of bytes [0, 24)
        28     .  record batches (see :mod:`log_store.record_batch`), back to back

Invariants:

* batches are in offset order and never overlap; the first batch's base offset is >= the file's base
  offset, and every batch's base offset is >= the previous batch's ``next_offset``;
* a segment covers the offsets ``[base, next segment's base)``; a sealed segment wholly below the
  watermark must end exactly after its last batch (any further byte is reported as corruption);
* only the last segment of a partition (the *active* one) is ever appended to; the others are *sealed*;
  compaction and retention only ever replace or delete sealed segments;
* a batch never straddles a commit watermark: a group's watermark is published (and the group
  acknowledged) only once its batches are complete and fsynced, so everything below a published
  watermark's end offset is whole on disk (the watermark record itself is fsynced concurrently with
  the batches; recovery drops a last record whose batches did not become durable, see
  :mod:`log_store.watermark`).

Creating a segment writes its file header and an empty index without fsyncing either, and fsyncs the
directory (so both names survive a crash). The header is made durable by the ``fdatasync`` of the first
group that appends to the segment, together with that group's batches; a crash before that leaves a
segment starting at the watermark's end offset whose header may be torn, which recovery removes. An
index that is empty or torn after a crash is only a missing hint (rebuilt by recovery).

What is checksummed: the file header (its own CRC) and every batch (one CRC32C each). What is not:
the ``.index`` (a hint, verified on use). After a crash the writer truncates the active segment at the
first batch at or past the watermark's end offset, or at a torn batch past it; damage below the
watermark is never repaired silently (:class:`~log_store.errors.CorruptSegmentError`).

Thread/process safety: :class:`ActiveSegment` belongs to the single writer. :class:`SegmentFile` is
read-only (``os.pread`` only), safe to share between threads, and any number of processes may read
while the writer appends, because readers only decode batches below the watermark they read first.
"""

from __future__ import annotations

import os
import secrets
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path

from crc32c import crc32c

from log_store.atomic_file import create_file, fsync_dir, start_writeback, write_all, writev_all
from log_store.batch_decoding import RecordColumns, decode_record_columns, decode_records
from log_store.errors import CorruptSegmentError
from log_store.offset_index import OffsetIndex, index_path
from log_store.record import Record
from log_store.record_batch import HEADER_SIZE, PREFIX, PREFIX_SIZE, BatchHeader, crc_matches, header_problem, parse_header

MAGIC = b"CLOG"
VERSION = 1
FILE_HEADER = struct.Struct(">4sHHqQ")
FILE_HEADER_CRC = struct.Struct(">I")
FILE_HEADER_SIZE = FILE_HEADER.size + FILE_HEADER_CRC.size  # 28
LOG_SUFFIX = ".log"
CHUNK = 1 << 20
NO_LIMIT = 1 << 62


def log_name(base_offset: int) -> str:
    """The file name of the segment whose first offset slot is ``base_offset``."""
    return f"{base_offset:020d}{LOG_SUFFIX}"


def parse_log_name(name: str) -> int | None:
    """The base offset in a segment file name, or ``None`` for any other file."""
    if len(name) != 24 or not name.endswith(LOG_SUFFIX) or not name[:20].isdigit():
        return None
    return int(name[:20])


def list_segments(directory: Path) -> list[int]:
    """Base offsets of the segment files in ``directory``, ascending."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(base for base in map(parse_log_name, names) if base is not None)


def encode_file_header(base_offset: int, nonce: int) -> bytes:
    """The 28-byte header of a segment file."""
    head = FILE_HEADER.pack(MAGIC, VERSION, 0, base_offset, nonce)
    return head + FILE_HEADER_CRC.pack(crc32c(head))


def read_file_header(fd: int, path: Path, base_offset: int) -> int:
    """Validate a segment's header and return its nonce."""
    data = os.pread(fd, FILE_HEADER_SIZE, 0)
    if len(data) < FILE_HEADER_SIZE:
        raise CorruptSegmentError(path, 0, base_offset, f"file header is {len(data)} of 28 bytes")
    magic, version, _flags, base, nonce = FILE_HEADER.unpack_from(data, 0)
    (crc,) = FILE_HEADER_CRC.unpack_from(data, FILE_HEADER.size)
    if crc32c(data[: FILE_HEADER.size]) != crc:
        raise CorruptSegmentError(path, 0, base_offset, "file header fails its CRC32C")
    if magic != MAGIC or version != VERSION:
        raise CorruptSegmentError(path, 0, base_offset, f"not a version {VERSION} segment file")
    if base != base_offset:
        raise CorruptSegmentError(path, 0, base_offset, f"header says base offset {base}")
    return int(nonce)


class BatchWalker:
    """Walks the batches of a segment from a byte position, reading in large chunks.

    Yields ``(position, header, buf, at)`` for every whole batch whose base offset is below
    ``limit_offset``: the batch's bytes are ``buf[at : at + header.length]``. CRCs are not checked here
    (callers check the batches they use). When the walk ends, :attr:`stop` says why:

    * ``"eof"``: the file ends at a batch boundary;
    * ``"limit"``: the next batch starts at or past ``limit_offset``;
    * ``"torn"``: the file ends inside a batch (``stop_offset`` is its base offset, or ``None`` when
      fewer than 16 bytes of it exist);
    * ``"bad_header"``: the bytes at :attr:`stop_position` are not a plausible batch header
      (:attr:`problem` says why, ``stop_offset`` is what the header claims).
    """

    def __init__(self, fd: int, start: int, limit_offset: int = NO_LIMIT, min_base: int = 0, chunk: int = CHUNK) -> None:
        self._fd = fd
        self._chunk = chunk
        self.start = start
        self.limit_offset = limit_offset
        self.min_base = min_base
        self.file_size = os.fstat(fd).st_size
        self.stop = ""
        self.stop_position = start
        self.stop_offset: int | None = None
        self.problem: str | None = None
        self.next_expected = min_base  # the offset the next batch should start at or after

    def __iter__(self) -> Iterator[tuple[int, BatchHeader, bytes, int]]:
        fd, size, limit = self._fd, self.file_size, self.limit_offset
        pos = self.start
        buf = b""
        at = 0
        expected = self.min_base
        while True:
            self.stop_position = pos
            if pos >= size:
                self.stop = "eof"
                return
            if len(buf) - at < HEADER_SIZE:
                buf, at = os.pread(fd, min(self._chunk, size - pos), pos), 0
                if len(buf) < PREFIX_SIZE:
                    self.stop, self.stop_offset = "torn", None
                    return
            _crc, length, base = PREFIX.unpack_from(buf, at)
            self.stop_offset = base
            if base >= limit:
                self.stop = "limit"
                return
            if len(buf) - at < HEADER_SIZE:
                self.stop = "torn"
                return
            header = parse_header(buf, at)
            problem = header_problem(header)
            if problem is None and base < expected:
                problem = f"batch base offset {base} is below the previous batch's end {expected}"
            if problem is not None:
                self.stop, self.problem = "bad_header", problem
                return
            if pos + length > size:
                self.stop = "torn"
                return
            if at + length > len(buf):
                buf, at = os.pread(fd, max(self._chunk, length), pos), 0
                if len(buf) < length:  # the file shrank under us
                    self.stop = "torn"
                    return
            yield pos, header, buf, at
            expected = self.next_expected = header.next_offset
            pos += length
            at += length


class SegmentFile:
    """Read side of one segment file instance (the open descriptor pins it across replacements)."""

    def __init__(self, path: Path, base_offset: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.fd = os.open(path, os.O_RDONLY)
        try:
            stat = os.fstat(self.fd)
            self.inode = stat.st_ino
            self.nonce = read_file_header(self.fd, path, base_offset)
        except BaseException:
            os.close(self.fd)
            raise
        self._index: OffsetIndex | None = None
        self._index_key: tuple[int, int] | None = None

    def close(self) -> None:
        """Close the descriptor (idempotent)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def size(self) -> int:
        """Current size of the file in bytes."""
        return os.fstat(self.fd).st_size

    def _current_index(self) -> OffsetIndex | None:
        path = index_path(self.path)
        try:
            stat = os.stat(path)
        except FileNotFoundError:
            return None
        key = (stat.st_ino, stat.st_size)
        if key != self._index_key:
            self._index = OffsetIndex.load(path, self.nonce)
            self._index_key = key
        return self._index

    def locate(self, offset: int) -> int:
        """Byte position of a batch boundary at or before the batch holding ``offset``."""
        index = self._current_index()
        if index is None:
            return FILE_HEADER_SIZE
        entry = index.lookup(offset - self.base_offset)
        if entry is None:
            return FILE_HEADER_SIZE
        relative, position = entry
        head = os.pread(self.fd, PREFIX_SIZE, position)
        if len(head) == PREFIX_SIZE and PREFIX.unpack(head)[2] == self.base_offset + relative:
            return position
        self._index = None  # a stale or damaged hint: scan instead
        return FILE_HEADER_SIZE

    def corrupt(self, position: int, offset: int, detail: str) -> CorruptSegmentError:
        """The error for damage found at ``position`` of this file."""
        return CorruptSegmentError(self.path, position, offset, detail)

    def check_stop(self, walker: BatchWalker, sealed: bool) -> None:
        """Raise when a walk below the watermark ended on damage instead of a clean end.

        ``sealed`` means the walk's limit is the successor segment's base offset, below the watermark:
        the file must then end exactly after its last batch.
        """
        if sealed and walker.stop == "limit":
            raise self.corrupt(
                walker.stop_position,
                walker.next_expected,
                f"{walker.file_size - walker.stop_position} byte(s) after the last batch of a sealed segment",
            )
        if walker.stop == "bad_header":
            raise self.corrupt(walker.stop_position, walker.next_expected, walker.problem or "bad batch header")
        if walker.stop == "torn" and (sealed or walker.stop_offset is not None):
            offset = walker.stop_offset if walker.stop_offset is not None else self.base_offset
            raise self.corrupt(walker.stop_position, offset, f"the file ends inside a batch ({walker.file_size} bytes)")

    def read(self, topic: str, partition: int, offset: int, limit: int, max_records: int, *, sealed: bool) -> list[Record]:
        """Records with ``offset <= o < limit`` from this file, at most about ``max_records``.

        Every batch decoded is CRC-checked first; batches entirely before ``offset`` are skipped
        unchecked. Whole batches are decoded, so the result may exceed ``max_records`` by less than
        one batch (the caller trims).
        """
        out: list[Record] = []
        for position, header, buf, at in self._checked(offset, limit, sealed):
            try:
                out += decode_records(buf, at, header, topic, partition, offset, limit)
            except (ValueError, UnicodeDecodeError, struct.error) as exc:
                raise self.corrupt(position, header.base_offset, f"records do not parse: {exc}") from exc
            if len(out) >= max_records:
                return out
        return out

    def read_columns(self, offset: int, limit: int, max_records: int, max_bytes: int, *, sealed: bool) -> list[RecordColumns]:
        """:meth:`read` as one :class:`RecordColumns` per batch (empty ones left out), stopping after the
        batch that reaches ``max_records`` records or ``max_bytes`` of keys and values; same checks."""
        out: list[RecordColumns] = []
        count = size = 0
        for position, header, buf, at in self._checked(offset, limit, sealed):
            try:
                columns = decode_record_columns(buf, at, header, offset, limit)
            except (ValueError, UnicodeDecodeError, struct.error) as exc:
                raise self.corrupt(position, header.base_offset, f"records do not parse: {exc}") from exc
            if len(columns):
                out.append(columns)
                count += len(columns)
                size += len(columns.keys) + len(columns.values)
            if count >= max_records or size >= max_bytes:
                return out
        return out

    def _checked(self, offset: int, limit: int, sealed: bool) -> Iterator[tuple[int, BatchHeader, bytes, int]]:
        """The CRC-checked batches holding offsets in ``[offset, limit)``; a walk that ends on damage
        below the watermark raises (:meth:`check_stop`) once the batches before it were taken."""
        walker = BatchWalker(self.fd, self.locate(offset), limit, self.base_offset)
        for position, header, buf, at in walker:
            if header.next_offset <= offset:
                continue
            if not crc_matches(buf, at, header):
                raise self.corrupt(position, header.base_offset, "batch fails its CRC32C check")
            yield position, header, buf, at
        self.check_stop(walker, sealed)

    def batches(self, limit: int = NO_LIMIT, *, sealed: bool = True) -> Iterator[tuple[int, BatchHeader, bytes, int]]:
        """Every CRC-checked batch below ``limit`` from the start of the file."""
        walker = BatchWalker(self.fd, FILE_HEADER_SIZE, limit, self.base_offset)
        for position, header, buf, at in walker:
            if not crc_matches(buf, at, header):
                raise self.corrupt(position, header.base_offset, "batch fails its CRC32C check")
            yield position, header, buf, at
        self.check_stop(walker, sealed)

    def headers(self, start: int = FILE_HEADER_SIZE, limit: int = NO_LIMIT) -> Iterator[tuple[int, BatchHeader]]:
        """Batch headers (not CRC-checked) from byte ``start``, for cheap walks."""
        walker = BatchWalker(self.fd, start, limit, self.base_offset)
        for position, header, _buf, _at in walker:
            yield position, header

    def last_index_position(self) -> int:
        """The position of the last indexed batch (or the first batch), to find the tail quickly."""
        index = self._current_index()
        entry = index.last() if index is not None else None
        if entry is None:
            return FILE_HEADER_SIZE
        return self.locate(self.base_offset + entry[0])


class ActiveSegment:
    """The writer's segment: appends batches, maintains the sparse index file alongside.

    Not thread-safe; only the writer process (under its lock) holds one per partition.
    """

    def __init__(
        self,
        path: Path,
        base_offset: int,
        nonce: int,
        size: int,
        index: OffsetIndex,
        first_append_ms: int | None,
        index_interval_bytes: int,
    ) -> None:
        self.path = path
        self.base_offset = base_offset
        self.nonce = nonce
        self.size = size
        self.index = index
        self.first_append_ms = first_append_ms
        self.index_interval_bytes = index_interval_bytes
        self.bytes_since_index = 0
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        self.index_fd = os.open(index_path(path), os.O_WRONLY | os.O_APPEND)

    @classmethod
    def create(cls, directory: Path, base_offset: int, index_interval_bytes: int) -> ActiveSegment:
        """Create an empty segment: header and empty index written, the directory fsynced (the header
        becomes durable with the first group appended to it, see the module docstring)."""
        path = directory / log_name(base_offset)
        nonce = secrets.randbits(64)
        index = OffsetIndex()
        for target, data in ((index_path(path), index.to_bytes(nonce)), (path, encode_file_header(base_offset, nonce))):
            fd = create_file(target, os.O_WRONLY | os.O_TRUNC)
            try:
                write_all(fd, data)
            finally:
                os.close(fd)
        fsync_dir(directory)
        return cls(path, base_offset, nonce, FILE_HEADER_SIZE, index, None, index_interval_bytes)

    @property
    def empty(self) -> bool:
        """Whether no batch was written yet."""
        return self.size <= FILE_HEADER_SIZE

    def append(self, pieces: Sequence[bytes | memoryview], length: int, base_offset: int, append_time_ms: int) -> None:
        """Write one encoded batch, given as ``pieces`` of ``length`` bytes in all (one ``writev``
        call), adding an index entry when due."""
        if self.bytes_since_index >= self.index_interval_bytes:
            write_all(self.index_fd, self.index.append(base_offset - self.base_offset, self.size))
            self.bytes_since_index = 0
        writev_all(self.fd, pieces, length)
        self.size += length
        self.bytes_since_index += length
        if self.first_append_ms is None:
            self.first_append_ms = append_time_ms

    def sync(self) -> None:
        """Make the appended data durable (``fdatasync``: the size change is flushed with it)."""
        os.fdatasync(self.fd)

    def start_writeback(self) -> None:
        """Start writing the appended data out now (a hint; :meth:`sync` makes it durable)."""
        start_writeback(self.fd)

    def seal(self) -> None:
        """Make data and index durable before a successor segment is created."""
        os.fsync(self.fd)
        os.fsync(self.index_fd)

    def close(self) -> None:
        """Close both descriptors (idempotent)."""
        for name in ("fd", "index_fd"):
            fd = getattr(self, name)
            if fd >= 0:
                os.close(fd)
                setattr(self, name, -1)
