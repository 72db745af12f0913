"""Record batches written: producer records taken apart column by column and encoded as the layout of
:mod:`log_store.record_batch` says, in pieces that are CRCed in turn and handed to one ``writev``.

:class:`Columns` holds a run of records ready for batch-wise encoding (:func:`batch_cuts` says where its
batches of about a byte budget start); :func:`encode_records` re-encodes records that keep their offsets
(the compactor's).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence
from functools import lru_cache
from itertools import accumulate, repeat
from operator import add, itemgetter, sub
from typing import cast

import numpy as np
from crc32c import crc32c

from log_store.record import Headers, ProducerRecord, Record
from log_store.record_batch import (
    ATTR_COMPACTED,
    CRC,
    HEADER_SIZE,
    HEADER_TAIL,
    MAGIC,
    RECORD_SIZE,
    _int32s,
    _int64s,
    _total,
    encode_headers,
)

_TOPIC, _KEY, _VALUE, _TIMESTAMP, _HEADERS = map(itemgetter, range(5))
_R_OFFSET, _R_KEY, _R_VALUE, _R_TIMESTAMP, _R_HEADERS = map(itemgetter, range(2, 7))


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
