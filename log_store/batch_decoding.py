"""Record batches read: the three decoders of the layout :mod:`log_store.record_batch` specifies.

A batch is decoded only after its CRC matched (:func:`~log_store.record_batch.crc_matches`), and its
column lengths must add up to exactly its length. :func:`decode_records` yields records (the readers),
:func:`decode_columns` lists of columns (the compactor), :func:`decode_record_columns` buffer views
(:class:`RecordColumns`, for readers that hand records on in bulk); each unpacks a fixed-width column with
one call.
"""

from __future__ import annotations

import struct
from bisect import bisect_left
from collections.abc import Sequence
from functools import lru_cache, partial
from itertools import compress, repeat
from operator import add, lt
from typing import NamedTuple, cast

import numpy as np

from log_store.record import Headers, Record
from log_store.record_batch import HEADER_SIZE, RECORD_SIZE, BatchHeader, _int32s, _int64s, _total, decode_headers

#: Builds a :class:`Record` from a tuple of its fields in C (no Python-level ``__new__`` per record).
_new_record = partial(tuple.__new__, Record)


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
