"""Record batches: the unit the log writes, checksums and reads. One CRC32C per batch.

Batch layout (big-endian, 42-byte header then the records)::

    offset  size  field
         0     4  crc                 uint32  CRC32C (Castagnoli) of bytes [4, length) of this batch
         4     4  length              int32   total bytes of the batch, this header included
         8     8  base_offset         int64   offset of the batch's first offset slot
        16     1  magic               int8    record layout: 2 (columns, below; the only one)
        17     1  attributes          int8    bit 0: written by the compactor; other bits 0
        18     4  last_offset_delta   int32   last offset slot - base_offset (kept when compaction
                                              removes records, so the batch still spans its slots)
        22     4  record_count        int32   records actually present (<= last_offset_delta + 1)
        26     8  append_time_ms      int64   wall-clock time the writer appended the batch
        34     8  max_timestamp_ms    int64   largest record timestamp in the batch
        42     .  records

Records, magic 2 (columns): for ``n = record_count`` records, five fixed-width columns, then three
variable-width ones, each in record order::

        4n  offset_delta    int32 each  record offset - base_offset (strictly increasing in a batch)
        8n  timestamp_ms    int64 each  the producer's timestamp
        4n  key_length      int32 each  -1 for a null key
        4n  value_length    int32 each  -1 for a null value (a tombstone)
        4n  headers_length  int32 each  bytes of the record's header block (0 for no headers)
         .  keys            the keys back to back (a null key takes no bytes)
         .  values          the values back to back (a null value takes no bytes)
         .  header blocks   the header blocks back to back

Header block: repeated ``name_length u16, name (UTF-8), value_length u32, value``.

The CRC covers everything but itself, so a flipped bit anywhere in a batch (its length and base offset
included) is detected; a batch is decoded only after its CRC matched, and its column lengths must add
up to exactly its length. The column layout exists for speed: encoding is a handful of C-level calls
per batch whatever its record count (each fixed-width column is one ``struct`` pack, each byte column
one ``bytes.join``), the pieces are CRCed in turn and handed to one ``writev`` without being joined;
decoding unpacks each fixed-width column with one ``struct`` call.

This module defines the layout (its constants, the header, the header block); the encoder is
:mod:`log_store.batch_encoding`, the three decoders (to records, to lists of columns, to buffer views) the
writer, the compactor and the readers use are :mod:`log_store.batch_decoding`.
"""

from __future__ import annotations

import struct
from functools import lru_cache
from typing import NamedTuple

from crc32c import crc32c

from log_store.record import Headers

#: The record layout (columns).
MAGIC = 2
MAGICS = (MAGIC,)
ATTR_COMPACTED = 0x01

CRC = struct.Struct(">I")
#: Header after the CRC: length, base_offset, magic, attributes, last_offset_delta, count, append, max_ts.
HEADER_TAIL = struct.Struct(">iqbbiiqq")
HEADER = struct.Struct(">Iiqbbiiqq")
HEADER_SIZE = HEADER.size  # 42
#: The bytes needed to know a batch's length and base offset.
PREFIX = struct.Struct(">Iiq")
PREFIX_SIZE = PREFIX.size  # 16
#: Fixed bytes per record: the five fixed-width fields.
RECORD_SIZE = 24
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


#: The encoded length and bytes of the header names met so far (a record's names repeat from record to record).
_NAME_BLOCKS: dict[str, bytes] = {}
_NAME_BLOCKS_MAX = 4096


def encode_headers(headers: Headers) -> bytes:
    """The header block of one record."""
    parts: list[bytes] = []
    pack_length = _HVALUE.pack
    for name, value in headers:
        block = _NAME_BLOCKS.get(name)
        if block is None:
            raw = name.encode("utf-8")
            block = _HNAME.pack(len(raw)) + raw
            if len(_NAME_BLOCKS) < _NAME_BLOCKS_MAX:
                _NAME_BLOCKS[name] = block
        parts += (block, pack_length(len(value)), value)
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


@lru_cache(maxsize=128)
def _int32s(count: int) -> struct.Struct:
    """A big-endian column of ``count`` int32s."""
    return struct.Struct(f">{count}i")


@lru_cache(maxsize=128)
def _int64s(count: int) -> struct.Struct:
    """A big-endian column of ``count`` int64s."""
    return struct.Struct(f">{count}q")


def _total(lengths: list[int]) -> int:
    """Bytes of a byte column with these lengths (-1, a null, takes none)."""
    return sum(lengths) + lengths.count(-1)


def parse_header(buf: bytes | memoryview, pos: int) -> BatchHeader:
    """The header at ``pos`` (caller checks there are :data:`HEADER_SIZE` bytes)."""
    return BatchHeader._make(HEADER.unpack_from(buf, pos))


def header_problem(header: BatchHeader) -> str | None:
    """Why a header cannot be a batch header, or ``None`` when it is plausible."""
    if header.magic not in MAGICS:
        return f"unknown batch magic {header.magic} (expected one of {MAGICS})"
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
