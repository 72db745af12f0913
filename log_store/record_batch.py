"""Record batches: the unit the log writes, checksums and reads. One CRC32C per batch.

Batch layout (big-endian, 42-byte header then the records)::

    offset  size  field
         0     4  crc                 uint32  CRC32C (Castagnoli) of bytes [4, length) of this batch
         4     4  length              int32   total bytes of the batch, this header included
         8     8  base_offset         int64   offset of the batch's first offset slot
        16     1  magic               int8    format version, always 1
        17     1  attributes          int8    bit 0: written by the compactor; other bits 0
        18     4  last_offset_delta   int32   last offset slot - base_offset (kept when compaction
                                              removes records, so the batch still spans its slots)
        22     4  record_count        int32   records actually present (<= last_offset_delta + 1)
        26     8  append_time_ms      int64   wall-clock time the writer appended the batch
        34     8  max_timestamp_ms    int64   largest record timestamp in the batch
        42     .  records

Record layout (big-endian, 24-byte header then the bytes)::

         0     4  offset_delta        int32   record offset - base_offset (increasing in a batch)
         4     8  timestamp_ms        int64   the producer's timestamp
        12     4  key_length          int32   -1 for a null key
        16     4  value_length        int32   -1 for a null value (a tombstone)
        20     4  headers_length      int32   bytes of the header block (0 for no headers)
        24     .  key, value, header block

Header block: repeated ``name_length u16, name (UTF-8), value_length u32, value``.

The CRC covers everything but itself, so a flipped bit anywhere in a batch (its length and base offset
included) is detected; a batch is decoded only after its CRC matched. Encoding packs the record headers
with C-level ``map`` calls and joins them with the keys and values into pieces of ``PIECE_RECORDS``
records (each small enough to be served by the allocator without fresh pages), CRCs the pieces in turn
and hands them to one ``writev``; decoding walks the records with precompiled ``struct`` readers.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from itertools import repeat
from operator import add
from typing import NamedTuple, cast

from crc32c import crc32c

from log_store.record import Headers, ProducerRecord, Record

MAGIC = 1
ATTR_COMPACTED = 0x01

CRC = struct.Struct(">I")
#: Header after the CRC: length, base_offset, magic, attributes, last_offset_delta, count, append, max_ts.
HEADER_TAIL = struct.Struct(">iqbbiiqq")
HEADER = struct.Struct(">Iiqbbiiqq")
HEADER_SIZE = HEADER.size  # 42
#: The bytes needed to know a batch's length and base offset.
PREFIX = struct.Struct(">Iiq")
PREFIX_SIZE = PREFIX.size  # 16
RECORD = struct.Struct(">iqiii")
RECORD_SIZE = RECORD.size  # 24
_HNAME = struct.Struct(">H")
_HVALUE = struct.Struct(">I")


class BatchHeader(NamedTuple):
    """The decoded 42-byte header of a batch."""

    crc: int
    length: int
    base_offset: int
    magic: int
    attributes: int
    last_offset_delta: int
    record_count: int
    append_time_ms: int
    max_timestamp_ms: int

    @property
    def last_offset(self) -> int:
        """The last offset slot the batch spans."""
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        """The offset just past the batch."""
        return self.base_offset + self.last_offset_delta + 1


def encode_headers(headers: Headers) -> bytes:
    """The header block of one record."""
    parts: list[bytes] = []
    for name, value in headers:
        raw = name.encode("utf-8")
        parts += (_HNAME.pack(len(raw)), raw, _HVALUE.pack(len(value)), value)
    return b"".join(parts)


def decode_headers(block: bytes) -> Headers:
    """Inverse of :func:`encode_headers`; raises ``ValueError`` on a malformed block."""
    out: list[tuple[str, bytes]] = []
    pos, end = 0, len(block)
    while pos < end:
        (name_len,) = _HNAME.unpack_from(block, pos)
        pos += 2
        name = block[pos : pos + name_len].decode("utf-8")
        pos += name_len
        (value_len,) = _HVALUE.unpack_from(block, pos)
        pos += 4
        if pos + value_len > end:
            raise ValueError("header value runs past the header block")
        out.append((name, block[pos : pos + value_len]))
        pos += value_len
    return tuple(out)


#: Records joined into one piece of an encoded batch (see the module docstring).
PIECE_RECORDS = 256


def _finish(
    base_offset: int, records: bytes, last_offset_delta: int, count: int, append_time_ms: int,
    max_ts: int, attributes: int,
) -> bytes:
    return b"".join(_finish_pieces(base_offset, [records], len(records), last_offset_delta, count,
                                   append_time_ms, max_ts, attributes))


def _finish_pieces(
    base_offset: int, pieces: list[bytes], records_bytes: int, last_offset_delta: int, count: int,
    append_time_ms: int, max_ts: int, attributes: int,
) -> list[bytes]:
    """The batch header (CRC over the header tail and every piece, in order) followed by the pieces."""
    tail = HEADER_TAIL.pack(HEADER_SIZE + records_bytes, base_offset, MAGIC, attributes,
                            last_offset_delta, count, append_time_ms, max_ts)
    crc = crc32c(tail)
    for piece in pieces:
        crc = crc32c(piece, crc)
    return [CRC.pack(crc) + tail, *pieces]


class Columns:
    """A run of producer records taken apart column by column, ready for batch-wise encoding.

    Built once per partition and group with one C-level transpose (``zip``), so that encoding costs no
    Python bytecode per record: the record headers are packed by ``map(RECORD.pack, ...)`` and each piece
    of the batch is one ``bytes.join`` over the interleaved headers, keys, values and header blocks.
    """

    __slots__ = ("count", "keys", "key_lengths", "values", "value_lengths", "timestamps", "blocks",
                 "block_lengths", "payload_bytes")

    def __init__(self, records: Sequence[ProducerRecord]) -> None:
        self._fill(list(zip(*records)) if records else [(), (), (), (), ()])

    @classmethod
    def from_fields(cls, fields: Sequence[tuple[object, ...]]) -> Columns:
        """Columns of records already transposed by the caller (``list(zip(*records))``)."""
        columns = cls.__new__(cls)
        columns._fill(fields)
        return columns

    def _fill(self, fields: Sequence[tuple[object, ...]]) -> None:
        self.count = len(fields[0])
        keys = cast("tuple[bytes | None, ...]", fields[1])
        values = cast("tuple[bytes | None, ...]", fields[2])
        timestamps = cast("tuple[int, ...]", fields[3])
        headers = cast("tuple[Headers, ...]", fields[4])
        self.key_lengths, self.keys = _lengths(keys)
        self.value_lengths, self.values = _lengths(values)
        self.timestamps = timestamps
        if any(headers):
            self.blocks: list[bytes] | None = [encode_headers(h) if h else b"" for h in headers]
            self.block_lengths: list[int] | None = list(map(len, self.blocks))
            blocks_bytes = sum(self.block_lengths)
        else:
            self.blocks = None
            self.block_lengths = None
            blocks_bytes = 0
        self.payload_bytes = (RECORD_SIZE * self.count + sum(self.key_lengths)
                              + sum(self.value_lengths) + blocks_bytes
                              + self.key_lengths.count(-1) + self.value_lengths.count(-1))

    def _block_lengths(self, start: int, stop: int) -> Iterable[int]:
        if self.block_lengths is None:
            return repeat(0, stop - start)
        return self.block_lengths[start:stop]

    def sizes(self) -> list[int]:
        """Encoded bytes of each record (only needed to split a group into several batches)."""
        return list(map(add, map(add, map(len, self.keys), map(len, self.values)),
                        map(add, self._block_lengths(0, self.count),
                            repeat(RECORD_SIZE, self.count))))

    def encode_pieces(
        self, base_offset: int, start: int, stop: int, append_time_ms: int
    ) -> tuple[list[bytes], int]:
        """One batch of records ``[start, stop)`` at consecutive offsets from ``base_offset``, as a list
        of buffers to write back to back (the header first), and its total length in bytes."""
        count = stop - start
        heads = list(map(RECORD.pack, range(count), self.timestamps[start:stop],
                         self.key_lengths[start:stop], self.value_lengths[start:stop],
                         self._block_lengths(start, stop)))
        width = 3 if self.blocks is None else 4
        parts: list[bytes] = [b""] * (width * count)
        parts[0::width] = heads
        parts[1::width] = self.keys[start:stop]
        parts[2::width] = self.values[start:stop]
        if self.blocks is not None:
            parts[3::width] = self.blocks[start:stop]
        step = width * PIECE_RECORDS
        join = b"".join
        pieces = [join(parts[i : i + step]) for i in range(0, len(parts), step)]
        records_bytes = sum(map(len, pieces))
        out = _finish_pieces(base_offset, pieces, records_bytes, count - 1, count, append_time_ms,
                             max(self.timestamps[start:stop]), 0)
        return out, HEADER_SIZE + records_bytes

    def encode(self, base_offset: int, start: int, stop: int, append_time_ms: int) -> bytes:
        """One batch of records ``[start, stop)`` at consecutive offsets from ``base_offset``."""
        return b"".join(self.encode_pieces(base_offset, start, stop, append_time_ms)[0])


def _lengths(items: Sequence[bytes | None]) -> tuple[list[int], Sequence[bytes]]:
    """The lengths of ``items`` (-1 for ``None``) and the items with ``None`` as ``b""``."""
    try:
        return list(map(len, items)), items  # type: ignore[arg-type,return-value]
    except TypeError:  # a null key or value
        return ([-1 if item is None else len(item) for item in items],
                [b"" if item is None else item for item in items])


def encode_producer_batch(
    base_offset: int, records: Sequence[ProducerRecord], append_time_ms: int
) -> bytes:
    """One batch holding ``records`` at consecutive offsets from ``base_offset``."""
    return Columns(records).encode(base_offset, 0, len(records), append_time_ms)


def encode_records(
    base_offset: int, last_offset_delta: int, records: Iterable[Record], append_time_ms: int,
    attributes: int = ATTR_COMPACTED,
) -> bytes:
    """One batch of already-placed records (their offsets kept), spanning ``last_offset_delta``."""
    parts: list[bytes] = []
    add = parts.append
    pack = RECORD.pack
    max_ts = -1
    count = 0
    for record in records:
        key, value, headers = record.key, record.value, record.headers
        block = encode_headers(headers) if headers else b""
        ts = record.timestamp_ms
        add(pack(record.offset - base_offset, ts, -1 if key is None else len(key),
                 -1 if value is None else len(value), len(block)))
        if key:
            add(key)
        if value:
            add(value)
        if block:
            add(block)
        if ts > max_ts:
            max_ts = ts
        count += 1
    return _finish(base_offset, b"".join(parts), last_offset_delta, count, append_time_ms, max_ts,
                   attributes)


def parse_header(buf: bytes | memoryview, pos: int) -> BatchHeader:
    """The header at ``pos`` (caller checks there are :data:`HEADER_SIZE` bytes)."""
    return BatchHeader._make(HEADER.unpack_from(buf, pos))


def header_problem(header: BatchHeader) -> str | None:
    """Why a header cannot be a batch header, or ``None`` when it is plausible."""
    if header.magic != MAGIC:
        return f"unknown batch magic {header.magic} (expected {MAGIC})"
    if header.length < HEADER_SIZE:
        return f"batch length {header.length} is shorter than its {HEADER_SIZE}-byte header"
    if header.last_offset_delta < 0 or header.record_count < 0:
        return f"negative offset delta {header.last_offset_delta} or count {header.record_count}"
    if header.record_count > header.last_offset_delta + 1:
        return f"{header.record_count} records cannot fit {header.last_offset_delta + 1} offsets"
    return None


def crc_matches(buf: bytes | memoryview, pos: int, header: BatchHeader) -> bool:
    """Whether the batch at ``pos`` (fully inside ``buf``) has the CRC its header states."""
    return crc32c(memoryview(buf)[pos + 4 : pos + header.length]) == header.crc


def decode_records(
    buf: bytes, pos: int, header: BatchHeader, topic: str, partition: int,
    min_offset: int = 0, max_offset: int = 1 << 62,
) -> list[Record]:
    """The records of the (CRC-checked) batch at ``pos`` with ``min_offset <= offset < max_offset``.

    Raises ``ValueError`` when the records do not fit the batch (only possible after a CRC collision
    or a writer bug); callers turn it into a corruption error naming the file.
    """
    out: list[Record] = []
    add = out.append
    unpack = RECORD.unpack_from
    base = header.base_offset
    p = pos + HEADER_SIZE
    end = pos + header.length
    for _ in range(header.record_count):
        delta, ts, klen, vlen, hlen = unpack(buf, p)
        p += RECORD_SIZE
        if klen >= 0:
            key: bytes | None = buf[p : p + klen]
            p += klen
        else:
            key = None
        if vlen >= 0:
            value: bytes | None = buf[p : p + vlen]
            p += vlen
        else:
            value = None
        if hlen:
            headers = decode_headers(buf[p : p + hlen])
            p += hlen
        else:
            headers = ()
        offset = base + delta
        if min_offset <= offset < max_offset:
            add(Record(topic, partition, offset, key, value, ts, headers))
    if p != end:
        raise ValueError(f"records end at byte {p - pos} of a {header.length}-byte batch")
    return out
