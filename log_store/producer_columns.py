"""Records to append given as columns: Arrow key and value arrays of one topic, encoded without a Python
object per record.

A :class:`ProducerColumns` is the write-side twin of :class:`~log_store.batch_decoding.RecordColumns`:
a producer that already holds its keys and values as Arrow arrays (a snapshot turning a table's
columns into events, say) hands them to :meth:`~log_store.store.LogStore.append_group` as they are.
They are placed on partitions exactly as the same records would be (murmur2 of each key, round-robin
for keyless records, see :mod:`log_store.partitioner`), and :class:`ArrowColumns` writes batches that
are byte for byte those :class:`~log_store.batch_encoding.Columns` writes for the same records: the
fixed-width columns come from numpy over the Arrow offsets, and the key and value bytes are the
arrays' own data buffers, handed to ``writev`` without a copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from log_store.batch_encoding import _consecutive, _header_piece, _zeros, batch_cuts
from log_store.record import ProducerRecord
from log_store.record_batch import RECORD_SIZE

_OFFSET_TYPES = {pa.binary(): np.int32, pa.string(): np.int32, pa.large_binary(): np.int64, pa.large_string(): np.int64}


@dataclass(frozen=True, slots=True)
class ProducerColumns:
    """Records of ``topic``: ``keys[i]``, ``values[i]`` (Arrow binary or string arrays of one length;
    ``keys`` ``None`` for keyless records, a null value is a tombstone), all with ``timestamp_ms`` and
    no headers.

    In :meth:`~log_store.store.LogStore.append_group` it is a chunk of its own: validated, placed
    and encoded before any of it is written.
    """

    topic: str
    keys: pa.Array | None
    values: pa.Array
    timestamp_ms: int

    def __post_init__(self) -> None:
        for name, array in (("keys", self.keys), ("values", self.values)):
            if array is None and name == "keys":
                continue
            if not isinstance(array, pa.Array) or array.type not in _OFFSET_TYPES:
                raise TypeError(
                    f"{name} must be an Arrow binary or string array, not {getattr(array, 'type', type(array).__name__)}"
                )
        if self.keys is not None and len(self.keys) != len(self.values):
            raise ValueError(f"{len(self.keys)} keys but {len(self.values)} values")
        if not isinstance(self.timestamp_ms, int) or not -(1 << 63) <= self.timestamp_ms < 1 << 63:
            raise TypeError(f"timestamp_ms must be a 64-bit int, not {self.timestamp_ms!r}")

    def __len__(self) -> int:
        return len(self.values)

    def slice(self, start: int, stop: int) -> ProducerColumns:
        """Records ``[start, stop)`` (no copy)."""
        keys = None if self.keys is None else self.keys.slice(start, stop - start)
        return ProducerColumns(self.topic, keys, self.values.slice(start, stop - start), self.timestamp_ms)

    def record(self, index: int) -> ProducerRecord:
        """Record ``index`` as a :class:`ProducerRecord`."""
        key = None if self.keys is None else _as_bytes(self.keys[index].as_py())
        return ProducerRecord(self.topic, key, _as_bytes(self.values[index].as_py()), self.timestamp_ms)

    def null_keys(self) -> bool:
        """Whether any record has no key."""
        return self.keys is None or self.keys.null_count > 0

    def value_bytes(self) -> int:
        """Bytes of all the values."""
        if not self.values.null_count:
            offsets = arrow_offsets(self.values)
            return int(offsets[-1] - offsets[0])
        return int(pc.sum(pc.binary_length(self.values)).as_py() or 0)


def split_runs(chunk: Sequence[ProducerRecord | ProducerColumns]) -> list[Sequence[ProducerRecord] | ProducerColumns]:
    """``chunk`` in order, as runs: each :class:`ProducerColumns` a run of its own, the records between
    them one run each (a block of columns between records keeps its place)."""
    if ProducerColumns not in set(map(type, chunk)):
        return [cast("Sequence[ProducerRecord]", chunk)] if chunk else []
    out: list[Sequence[ProducerRecord] | ProducerColumns] = []
    records: list[ProducerRecord] = []
    for item in chunk:
        if isinstance(item, ProducerColumns):
            if records:
                out.append(records)
                records = []
            out.append(item)
        else:
            records.append(item)
    if records:
        out.append(records)
    return out


def arrow_offsets(array: pa.Array) -> np.ndarray:
    """The ``len(array) + 1`` offsets of an Arrow binary or string array into its data buffer (a view)."""
    offsets = array.buffers()[1]
    return np.frombuffer(offsets, dtype=_OFFSET_TYPES[array.type])[array.offset : array.offset + len(array) + 1]


def _as_bytes(item: str | bytes | None) -> bytes | None:
    return item.encode() if isinstance(item, str) else item


class _Column:
    """One Arrow byte array as the log stores it: lengths (-1 for a null) and its data bytes."""

    __slots__ = ("data", "lengths", "offsets", "total")

    def __init__(self, array: pa.Array) -> None:
        nulls = np.asarray(array.is_null(), dtype=bool) if array.null_count else None
        if nulls is not None:
            # a null slot may span bytes in Arrow; the log stores none for it
            array = pc.fill_null(
                array,
                pa.scalar(b"" if pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type) else "", array.type),
            )
        self.offsets = arrow_offsets(array).astype(np.int64)
        data_buffer = array.buffers()[2]
        lengths = np.diff(self.offsets)
        self.lengths = lengths if nulls is None else np.where(nulls, -1, lengths)
        self.data = memoryview(data_buffer) if data_buffer is not None else memoryview(b"")
        self.total = int(self.offsets[-1] - self.offsets[0])

    def piece(self, start: int, stop: int) -> memoryview:
        """The bytes of records ``[start, stop)``, back to back (no copy)."""
        return self.data[int(self.offsets[start]) : int(self.offsets[stop])]


class ArrowColumns:
    """The :class:`~log_store.batch_encoding.Columns` interface over Arrow arrays (one partition's records)."""

    __slots__ = ("count", "keys", "payload_bytes", "timestamp_ms", "values")

    def __init__(self, keys: pa.Array | None, values: pa.Array, timestamp_ms: int) -> None:
        self.count = len(values)
        self.timestamp_ms = timestamp_ms
        self.values = _Column(values)
        self.keys = _Column(keys if keys is not None else pa.nulls(self.count, pa.binary()))
        self.payload_bytes = RECORD_SIZE * self.count + self.keys.total + self.values.total

    def cuts(self, budget: int) -> list[int]:
        """Record indexes where batches of about ``budget`` bytes start, and the count at the end."""
        if self.payload_bytes <= budget:
            return [0, self.count]
        return batch_cuts(np.cumsum(RECORD_SIZE + np.maximum(self.keys.lengths, 0) + np.maximum(self.values.lengths, 0)), budget)

    def encode_pieces(self, base_offset: int, start: int, stop: int, append_time_ms: int) -> tuple[list[bytes | memoryview], int]:
        """One batch of records ``[start, stop)`` at consecutive offsets: what
        :meth:`~log_store.batch_encoding.Columns.encode_pieces` gives for the same records."""
        count = stop - start
        pieces: list[bytes | memoryview] = [
            _consecutive(count),
            np.full(count, self.timestamp_ms, dtype=">i8").tobytes(),
            self.keys.lengths[start:stop].astype(">i4").tobytes(),
            self.values.lengths[start:stop].astype(">i4").tobytes(),
            _zeros(count),
            self.keys.piece(start, stop),
            self.values.piece(start, stop),
        ]
        records_bytes = sum(map(len, pieces))
        head = _header_piece(
            base_offset, pieces, records_bytes, count - 1, count, append_time_ms, self.timestamp_ms if count else -1, 0
        )
        return [head, *pieces], len(head) + records_bytes
