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

This module runs past 500 lines because it is the layout's one definition: the encoder, and the three
decoders (to records, to lists of columns, to buffer views) the writer, the compactor and the readers
use, next to the format they implement.
"""

from __future__ import annotations

import struct
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from functools import lru_cache, partial
from itertools import accumulate, compress, repeat
from operator import add, itemgetter, lt, sub
from typing import NamedTuple, cast

import numpy as np
from crc32c import crc32c

from log_store.record import Headers, ProducerRecord, Record

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

_TOPIC, _KEY, _VALUE, _TIMESTAMP, _HEADERS = map(itemgetter, range(5))
_R_OFFSET, _R_KEY, _R_VALUE, _R_TIMESTAMP, _R_HEADERS = map(itemgetter, range(2, 7))
#: Builds a :class:`Record` from a tuple of its fields in C (no Python-level ``__new__`` per record).
_new_record = partial(tuple.__new__, Record)


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


@lru_cache(maxsize=32)
def _consecutive(count: int) -> bytes:
    """The offset-delta column ``0 .. count - 1`` of a freshly appended batch."""
    return _int32s(count).pack(*range(count))


@lru_cache(maxsize=32)
def _zeros(count: int) -> bytes:
    """An all-zero int32 column (records without headers)."""
    return bytes(4 * count)


def _header_piece(
    base_offset: int,
    pieces: Sequence[bytes | memoryview],
    records_bytes: int,
    last_offset_delta: int,
    count: int,
    append_time_ms: int,
    max_ts: int,
    attributes: int,
) -> bytes:
    """The batch header; its CRC covers the header tail and every piece, in order."""
    tail = HEADER_TAIL.pack(
        HEADER_SIZE + records_bytes, base_offset, MAGIC, attributes, last_offset_delta, count, append_time_ms, max_ts
    )
    crc = crc32c(tail)
    for piece in pieces:
        crc = crc32c(piece, crc)
    return CRC.pack(crc) + tail


#: Stands for the headers of records none of which has any.
_NO_HEADERS: Sequence[Headers] = ()


def batch_cuts(running: Sequence[int] | np.ndarray, budget: int) -> list[int]:
    """Record indexes where batches of about ``budget`` bytes start, and the record count at the end;
    ``running``: the records' encoded sizes summed up to each record (a list or a numpy array). A batch
    holds at least one record."""
    cuts = [0]
    while cuts[-1] < len(running):
        taken = int(running[cuts[-1] - 1]) if cuts[-1] else 0
        cuts.append(max(bisect_right(running, taken + budget), cuts[-1] + 1))
    return cuts


class Columns:
    """A run of producer records taken apart column by column, ready for batch-wise encoding.

    Built once per partition and group from columns the caller already has (``from_columns``) or from
    records (one C-level ``map`` per field), so that encoding costs no Python bytecode per record: each
    fixed-width column of a batch is one ``struct`` pack and each byte column a few ``bytes.join``
    calls (pieces of about :data:`PIECE_BYTES`).
    """

    __slots__ = (
        "count",
        "keys",
        "key_lengths",
        "key_bytes",
        "null_keys",
        "values",
        "value_lengths",
        "value_bytes",
        "timestamps",
        "blocks",
        "block_lengths",
        "payload_bytes",
    )

    def __init__(self, records: Sequence[ProducerRecord]) -> None:
        headers = list(map(_HEADERS, records)) if any(map(_HEADERS, records)) else _NO_HEADERS
        self._fill(list(map(_KEY, records)), list(map(_VALUE, records)), list(map(_TIMESTAMP, records)), headers)

    @classmethod
    def from_fields(cls, fields: Sequence[Sequence[object]]) -> Columns:
        """Columns of records already transposed by the caller (``list(zip(*records))``)."""
        return cls.from_columns(
            cast("Sequence[bytes | None]", fields[1]),
            cast("Sequence[bytes | None]", fields[2]),
            cast("Sequence[int]", fields[3]),
            cast("Sequence[Headers]", fields[4]),
        )

    @classmethod
    def from_columns(
        cls,
        keys: Sequence[bytes | None],
        values: Sequence[bytes | None],
        timestamps: Sequence[int],
        headers: Sequence[Headers],
    ) -> Columns:
        """Columns from the records' keys, values, timestamps and headers (equal lengths)."""
        columns = cls.__new__(cls)
        columns._fill(keys, values, timestamps, headers)
        return columns

    def _fill(
        self,
        keys: Sequence[bytes | None],
        values: Sequence[bytes | None],
        timestamps: Sequence[int],
        headers: Sequence[Headers],
    ) -> None:
        self.count = len(keys)
        self.key_lengths, self.keys, self.key_bytes = _lengths(keys)
        self.null_keys = self.keys is not keys and -1 in self.key_lengths
        self.value_lengths, self.values, self.value_bytes = _lengths(values)
        self.timestamps = timestamps
        if headers is not _NO_HEADERS and any(headers):
            self.blocks: list[bytes] | None = [encode_headers(h) if h else b"" for h in headers]
            self.block_lengths: list[int] | None = list(map(len, self.blocks))
            blocks_bytes = sum(self.block_lengths)
        else:
            self.blocks = None
            self.block_lengths = None
            blocks_bytes = 0
        self.payload_bytes = RECORD_SIZE * self.count + self.key_bytes + self.value_bytes + blocks_bytes

    def _block_lengths(self, start: int, stop: int) -> Iterable[int]:
        if self.block_lengths is None:
            return repeat(0, stop - start)
        return self.block_lengths[start:stop]

    def sizes(self) -> list[int]:
        """Encoded bytes of each record (only needed to split a group into several batches)."""
        return list(
            map(
                add,
                map(add, map(len, self.keys), map(len, self.values)),
                map(add, self._block_lengths(0, self.count), repeat(RECORD_SIZE, self.count)),
            )
        )

    def cuts(self, budget: int) -> list[int]:
        """Record indexes where batches of about ``budget`` bytes start, and the count at the end."""
        if self.payload_bytes <= budget:
            return [0, self.count]
        return batch_cuts(list(accumulate(self.sizes())), budget)

    def encode_pieces(
        self,
        base_offset: int,
        start: int,
        stop: int,
        append_time_ms: int,
        deltas: Sequence[int] | None = None,
        last_offset_delta: int | None = None,
        attributes: int = 0,
    ) -> tuple[list[bytes], int]:
        """One batch of records ``[start, stop)`` as a list of buffers to write back to back (the
        header first), and its total length in bytes.

        The records take consecutive offsets from ``base_offset`` unless ``deltas`` gives each one's
        offset - ``base_offset`` (strictly increasing; the compactor keeps original offsets), and the
        batch spans ``last_offset_delta + 1`` offset slots (default: up to its last record).
        """
        count = stop - start
        whole = start == 0 and stop == self.count
        keys = self.keys if whole else self.keys[start:stop]
        values = self.values if whole else self.values[start:stop]
        timestamps = self.timestamps if whole else self.timestamps[start:stop]
        key_lengths = self.key_lengths if whole else self.key_lengths[start:stop]
        value_lengths = self.value_lengths if whole else self.value_lengths[start:stop]
        int32s = _int32s(count)
        if deltas is None:
            delta_column = _consecutive(count)
            last = count - 1
        else:
            delta_column = int32s.pack(*deltas)
            last = deltas[-1] if count else 0
        if last_offset_delta is not None:
            last = last_offset_delta
        pieces = [delta_column, _int64s(count).pack(*timestamps), int32s.pack(*key_lengths), int32s.pack(*value_lengths)]
        if self.blocks is None or self.block_lengths is None:
            pieces.append(_zeros(count))
            blocks = b""
        else:
            pieces.append(int32s.pack(*self.block_lengths[start:stop]))
            blocks = b"".join(self.blocks[start:stop])
        key_total = self.key_bytes if whole else _total(key_lengths)
        value_total = self.value_bytes if whole else _total(value_lengths)
        key_pieces, value_pieces = _joined(keys, key_total), _joined(values, value_total)
        if sum(map(len, key_pieces)) != key_total or sum(map(len, value_pieces)) != value_total:
            # a buffer whose items are not single bytes (say a memoryview of an int array): its len()
            # is not its byte count, so the lengths stored would not describe the bytes stored
            raise TypeError("a key or value is a buffer of multi-byte items; pass bytes")
        pieces += key_pieces
        pieces += value_pieces
        if blocks:
            pieces.append(blocks)
        records_bytes = sum(map(len, pieces))
        max_ts = max(timestamps) if count else -1
        head = _header_piece(base_offset, pieces, records_bytes, last, count, append_time_ms, max_ts, attributes)
        return [head, *pieces], HEADER_SIZE + records_bytes

    def encode(self, base_offset: int, start: int, stop: int, append_time_ms: int) -> bytes:
        """One batch of records ``[start, stop)`` at consecutive offsets from ``base_offset``."""
        return b"".join(self.encode_pieces(base_offset, start, stop, append_time_ms)[0])


#: Bytes a byte column is joined into at a time (see :func:`_joined`).
PIECE_BYTES = 32 << 10


def _joined(items: Sequence[bytes], total: int) -> list[bytes]:
    """``items`` joined into pieces of about :data:`PIECE_BYTES` (by their average length).

    Pieces this small are served from the allocator's free lists, where one large ``join`` would map
    fresh pages (and fault them in) for every batch; the pieces go to ``writev`` as they are.
    """
    count = len(items)
    if total <= PIECE_BYTES or count <= 1:
        return [b"".join(items)]
    step = max(1, PIECE_BYTES * count // total)
    return [b"".join(items[i : i + step]) for i in range(0, count, step)]


def _total(lengths: list[int]) -> int:
    """Bytes of a byte column with these lengths (-1, a null, takes none)."""
    return sum(lengths) + lengths.count(-1)


def _lengths(items: Sequence[bytes | None]) -> tuple[list[int], Sequence[bytes], int]:
    """The lengths of ``items`` (-1 for ``None``), the items with ``None`` as ``b""``, and their bytes."""
    try:
        lengths = list(map(len, items))  # type: ignore[arg-type]
        return lengths, items, sum(lengths)  # type: ignore[return-value]
    except TypeError:  # a null key or value
        lengths = [-1 if item is None else len(item) for item in items]
        return lengths, [b"" if item is None else item for item in items], _total(lengths)


def encode_records(
    base_offset: int,
    last_offset_delta: int,
    records: Iterable[Record],
    append_time_ms: int,
    attributes: int = ATTR_COMPACTED,
) -> bytes:
    """One batch of already-placed records (their offsets kept), spanning ``last_offset_delta``."""
    rows = records if isinstance(records, list) else list(records)
    columns = Columns.from_columns(
        list(map(_R_KEY, rows)), list(map(_R_VALUE, rows)), list(map(_R_TIMESTAMP, rows)), list(map(_R_HEADERS, rows))
    )
    deltas = list(map(sub, map(_R_OFFSET, rows), repeat(base_offset)))
    pieces, _length = columns.encode_pieces(base_offset, 0, len(rows), append_time_ms, deltas, last_offset_delta, attributes)
    return b"".join(pieces)


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


def decode_records(
    buf: bytes,
    pos: int,
    header: BatchHeader,
    topic: str,
    partition: int,
    min_offset: int = 0,
    max_offset: int = 1 << 62,
) -> list[Record]:
    """The records of the (CRC-checked) batch at ``pos`` with ``min_offset <= offset < max_offset``.

    Raises ``ValueError`` when the records do not fit the batch (only possible after a CRC collision
    or a writer bug); callers turn it into a corruption error naming the file.
    """
    return _decode_columns(buf, pos, header, topic, partition, min_offset, max_offset)


@lru_cache(maxsize=16)
def _uniform(length: int, count: int) -> struct.Struct:
    """A run of ``count`` byte strings of ``length`` bytes each."""
    return struct.Struct(f"{length}s" * count)


def _slices(buf: bytes, lengths: Sequence[int], first: int, lo: int, hi: int) -> list[bytes | None]:
    """Items ``lo .. hi - 1`` of a byte column starting at ``first`` (``None`` for length -1).

    One ``struct`` unpack of the whole run (a format of one ``<n>s`` per item), not a slice per item.
    """
    if lo >= hi:
        return []
    wanted = lengths[lo:hi]
    has_null = -1 in lengths
    clipped = list(map(max, wanted, repeat(0))) if has_null else wanted
    start = first
    if lo:
        start += _total(list(lengths[:lo]))
    shortest = min(clipped)
    if shortest == max(clipped):
        items: list[bytes | None] = list(_uniform(shortest, hi - lo).unpack_from(buf, start))
    else:
        # a one-off Struct: struct's own cache would keep up to 100 of these long formats alive
        items = list(struct.Struct("s".join(map(str, clipped)) + "s").unpack_from(buf, start))
    if has_null:
        for i in compress(range(hi - lo), map(lt, wanted, repeat(0))):
            items[i] = None
    return items


class DecodedColumns(NamedTuple):
    """The records of one batch column by column (``values`` is ``None`` when not asked for)."""

    offsets: list[int]
    keys: list[bytes | None]
    values: list[bytes | None] | None
    timestamps: Sequence[int]
    headers: Sequence[Headers]


def _column_region(pos: int, header: BatchHeader) -> tuple[int, int, int, int]:
    """``(record count, base offset, start of the columns, end of the batch)`` of the column-layout batch
    at ``pos``; ``ValueError`` when its fixed-width columns cannot fit in it."""
    count = header.record_count
    p = pos + HEADER_SIZE
    end = pos + header.length
    if p + RECORD_SIZE * count > end:
        raise ValueError(f"{count} records need {RECORD_SIZE * count} bytes of columns; the batch has {end - p}")
    return count, header.base_offset, p, end


def decode_columns(
    buf: bytes,
    pos: int,
    header: BatchHeader,
    min_offset: int = 0,
    max_offset: int = 1 << 62,
    *,
    values: bool = True,
) -> DecodedColumns:
    """:func:`decode_records` as columns, without building a :class:`Record` per record; with
    ``values=False`` the values are not even copied out (the compactor's first pass needs only keys,
    offsets and headers). Same checks and errors as :func:`decode_records`."""
    count, base, p, end = _column_region(pos, header)
    int32s = _int32s(count)
    deltas = int32s.unpack_from(buf, p)
    timestamps = _int64s(count).unpack_from(buf, p + 4 * count)
    key_lengths = int32s.unpack_from(buf, p + 12 * count)
    value_lengths = int32s.unpack_from(buf, p + 16 * count)
    block_lengths = int32s.unpack_from(buf, p + 20 * count)
    p += RECORD_SIZE * count
    if count:
        if deltas[0] < 0 or deltas[-1] > header.last_offset_delta or not all(map(lt, deltas, deltas[1:])):
            raise ValueError("offset deltas are not increasing inside the batch's span")
        if min(key_lengths) < -1 or min(value_lengths) < -1 or min(block_lengths) < 0:
            raise ValueError("negative key, value or header length")
    keys_bytes = sum(key_lengths) + key_lengths.count(-1)
    values_bytes = sum(value_lengths) + value_lengths.count(-1)
    if p + keys_bytes + values_bytes + sum(block_lengths) != end:
        raise ValueError(
            f"records end at byte {p + keys_bytes + values_bytes + sum(block_lengths)} - {pos} of a {header.length}-byte batch"
        )
    lo = bisect_left(deltas, min_offset - base)
    hi = bisect_left(deltas, max_offset - base)
    if lo >= hi:
        return DecodedColumns([], [], [] if values else None, (), ())
    headers: Sequence[Headers]
    if any(block_lengths[lo:hi]):
        blocks = _slices(buf, block_lengths, p + keys_bytes + values_bytes, lo, hi)
        headers = [decode_headers(block) if block else () for block in cast("list[bytes]", blocks)]
    else:
        headers = ((),) * (hi - lo)
    return DecodedColumns(
        list(map(add, deltas[lo:hi], repeat(base))),
        _slices(buf, key_lengths, p, lo, hi),
        _slices(buf, value_lengths, p + keys_bytes, lo, hi) if values else None,
        timestamps[lo:hi],
        headers,
    )


class RecordColumns(NamedTuple):
    """The records of one batch as flat columns, for readers that hand them on in bulk (to Arrow, say)
    without an object per record.

    ``key_lengths``/``value_lengths`` are -1 for a null key or value; ``keys``/``values`` hold the
    non-null items back to back (views of the read buffer, in record order). ``headers`` is ``None``
    when no record has any.
    """

    offsets: np.ndarray
    timestamps: np.ndarray
    key_lengths: np.ndarray
    keys: memoryview
    value_lengths: np.ndarray
    values: memoryview
    headers: Sequence[Headers] | None

    def __len__(self) -> int:
        return len(self.offsets)


_BE32, _BE64 = np.dtype(">i4"), np.dtype(">i8")


def _starts(lengths: np.ndarray) -> np.ndarray:
    """Where each item of a byte column starts (a null takes no bytes), plus the column's end."""
    starts = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(np.maximum(lengths, 0), out=starts[1:])
    return starts


def decode_record_columns(
    buf: bytes,
    pos: int,
    header: BatchHeader,
    min_offset: int = 0,
    max_offset: int = 1 << 62,
) -> RecordColumns:
    """:func:`decode_records` as :class:`RecordColumns`: numpy views of the fixed-width columns and
    buffer views of the keys and values, with no Python object per record. Same checks and errors as :func:`decode_records`."""
    count, base, p, end = _column_region(pos, header)
    deltas = np.frombuffer(buf, _BE32, count, p)
    timestamps = np.frombuffer(buf, _BE64, count, p + 4 * count)
    key_lengths = np.frombuffer(buf, _BE32, count, p + 12 * count)
    value_lengths = np.frombuffer(buf, _BE32, count, p + 16 * count)
    block_lengths = np.frombuffer(buf, _BE32, count, p + 20 * count)
    p += RECORD_SIZE * count
    if count:
        if deltas[0] < 0 or deltas[-1] > header.last_offset_delta or not bool(np.all(deltas[1:] > deltas[:-1])):
            raise ValueError("offset deltas are not increasing inside the batch's span")
        if key_lengths.min() < -1 or value_lengths.min() < -1 or block_lengths.min() < 0:
            raise ValueError("negative key, value or header length")
    key_starts, value_starts, block_starts = _starts(key_lengths), _starts(value_lengths), _starts(block_lengths)
    keys_at, values_at = p, p + int(key_starts[-1])
    blocks_at = values_at + int(value_starts[-1])
    if blocks_at + int(block_starts[-1]) != end:
        raise ValueError(f"records end at byte {blocks_at + int(block_starts[-1]) - pos} of a {header.length}-byte batch")
    lo = int(np.searchsorted(deltas, min_offset - base, "left"))
    hi = int(np.searchsorted(deltas, max_offset - base, "left"))
    hi = max(lo, hi)
    view = memoryview(buf)
    headers: Sequence[Headers] | None = None
    if block_lengths[lo:hi].any():
        headers = [
            decode_headers(bytes(view[blocks_at + int(block_starts[i]) : blocks_at + int(block_starts[i + 1])]))
            if block_lengths[i]
            else ()
            for i in range(lo, hi)
        ]
    return RecordColumns(
        deltas[lo:hi].astype(np.int64) + base,
        timestamps[lo:hi].astype(np.int64),
        key_lengths[lo:hi].astype(np.int32),
        view[keys_at + int(key_starts[lo]) : keys_at + int(key_starts[hi])],
        value_lengths[lo:hi].astype(np.int32),
        view[values_at + int(value_starts[lo]) : values_at + int(value_starts[hi])],
        headers,
    )


def _decode_columns(
    buf: bytes,
    pos: int,
    header: BatchHeader,
    topic: str,
    partition: int,
    min_offset: int,
    max_offset: int,
) -> list[Record]:
    offsets, keys, values, timestamps, headers = decode_columns(buf, pos, header, min_offset, max_offset)
    return list(
        map(
            _new_record,
            zip(repeat(topic), repeat(partition), offsets, keys, cast("list[bytes | None]", values), timestamps, headers),
        )
    )
