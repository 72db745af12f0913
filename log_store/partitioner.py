"""Key -> partition placement, identical to Kafka's default partitioner for keyed records.

``partition = (murmur2(key) & 0x7fffffff) % partitions`` where ``murmur2`` is Kafka's 32-bit MurmurHash2
(seed ``0x9747b28c``, little-endian 4-byte words, signed Java ``int`` arithmetic). Keeping the same
placement lets a topic move to Kafka without reshuffling keys. Keyless records are spread round-robin
per topic (Kafka's older default); :class:`Partitioner` holds the per-topic counters and is not
thread-safe on its own (the store calls it under its write lock).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from operator import itemgetter
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from log_store.producer_columns import arrow_offsets

_M = 0x5BD1E995
_SEED = 0x9747B28C
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2``: the signed 32-bit MurmurHash2 of ``data``."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    words = length >> 2
    if words:
        for k in struct.unpack_from(f"<{words}I", data):
            k = (k * _M) & _MASK
            k ^= k >> 24
            k = (k * _M) & _MASK
            h = ((h * _M) & _MASK) ^ k
    rest = length & 3
    if rest:
        tail = words << 2
        if rest == 3:
            h ^= data[tail + 2] << 16
        if rest >= 2:
            h ^= data[tail + 1] << 8
        h ^= data[tail]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def to_positive(number: int) -> int:
    """Kafka's ``Utils.toPositive``: clear the sign bit (not ``abs``)."""
    return number & 0x7FFFFFFF


def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner gives ``key`` among ``partitions``."""
    if partitions == 1:
        return 0
    return to_positive(murmur2(key)) % partitions


_VECTOR_MIN = 64


def partitions_for_keys(keys: Sequence[bytes], partitions: int) -> list[int]:
    """``partition_for_key`` of every key, computed batch-wise (numpy) for runs of 64 keys or more."""
    if partitions == 1:
        return [0] * len(keys)
    if len(keys) < _VECTOR_MIN:
        return [to_positive(murmur2(key)) % partitions for key in keys]
    return cast("list[int]", partition_array(keys, partitions).tolist())


def partition_array(keys: Sequence[bytes], partitions: int) -> Any:
    """``partition_for_key`` of every key as a numpy ``int64`` array.

    Keys of one length are hashed together (one vectorised murmur2 over the keys laid end to end); the
    common case of a run whose keys all have the same length takes no per-key Python code at all.
    """
    count = len(keys)
    distinct = set(map(len, keys))
    if len(distinct) == 1:
        out = _murmur2_same_length(b"".join(keys), count, distinct.pop())
    else:
        out = np.empty(count, dtype=np.int64)
        if count:
            lengths = np.fromiter(map(len, keys), dtype=np.int64, count=count)
            for length in sorted(distinct):
                positions = np.flatnonzero(lengths == length)
                picked = itemgetter(*positions.tolist())(keys) if len(positions) > 1 else (keys[int(positions[0])],)
                out[positions] = _murmur2_same_length(b"".join(picked), len(positions), length)
    out &= 0x7FFFFFFF
    out %= partitions
    return out


def partition_arrow(keys: pa.Array, partitions: int) -> Any:
    """``partition_for_key`` of every key of an Arrow binary or string array (no nulls), as numpy ``int64``."""
    out = positive_hashes_arrow(keys)
    out %= partitions
    return out


def positive_hashes_arrow(keys: pa.Array) -> Any:
    """``to_positive(murmur2(key))`` of every key of an Arrow binary or string array (no nulls), as numpy
    ``int64``.

    Keys of one length are gathered with ``take`` (their bytes then lie end to end) and hashed together.
    """
    count = len(keys)
    lengths = np.asarray(pc.binary_length(keys), dtype=np.int64)
    out = np.empty(count, dtype=np.int64)
    for length in np.flatnonzero(np.bincount(lengths)).tolist() if count else ():
        positions = np.flatnonzero(lengths == length)
        same = keys if len(positions) == count else keys.take(pa.array(positions))
        data = same.buffers()[2]
        first = int(arrow_offsets(same)[0])
        raw = bytes(memoryview(data)[first : first + length * len(positions)]) if data is not None else b""
        out[positions] = _murmur2_same_length(raw, len(positions), length)
    out &= 0x7FFFFFFF
    return out


def _murmur2_same_length(data: bytes, count: int, length: int) -> Any:
    """Unsigned murmur2 of ``count`` keys of ``length`` bytes laid end to end in ``data``."""
    m = np.uint32(_M)
    rows = np.frombuffer(data, dtype=np.uint8).reshape(count, length) if length else None
    h = np.full(count, (_SEED ^ length) & _MASK, dtype=np.uint32)
    words = length >> 2
    if words:
        assert rows is not None
        # every word of every key mixed at once (as Kafka mixes each k), then folded into h in order
        mixed = np.ascontiguousarray(rows[:, : words * 4]).view("<u4") * m
        mixed ^= mixed >> np.uint32(24)
        mixed *= m
        mixed = mixed.T.copy()  # one contiguous row per word position
        for k in mixed:
            h *= m
            h ^= k
    rest = length & 3
    if rest:
        assert rows is not None
        tail = words << 2
        if rest == 3:
            h ^= rows[:, tail + 2].astype(np.uint32) << np.uint32(16)
        if rest >= 2:
            h ^= rows[:, tail + 1].astype(np.uint32) << np.uint32(8)
        h ^= rows[:, tail].astype(np.uint32)
        h *= m
    h ^= h >> np.uint32(13)
    h *= m
    h ^= h >> np.uint32(15)
    return h.astype(np.int64)


class Partitioner:
    """Chooses partitions: murmur2 for keyed records, a per-topic round-robin for keyless ones."""

    def __init__(self) -> None:
        self._next: dict[str, int] = {}

    def partition(self, topic: str, key: bytes | None, partitions: int) -> int:
        """The partition of one record of ``topic`` with ``key``."""
        if key is not None:
            return partition_for_key(key, partitions)
        turn = self._next.get(topic, 0)
        self._next[topic] = turn + 1
        return turn % partitions

    def partitions(self, topic: str, keys: Sequence[bytes | None], partitions: int) -> list[int]:
        """The partitions of a run of records of ``topic`` (keyless ones round-robin, in order)."""
        if partitions == 1:
            return [0] * len(keys)
        if None not in keys:
            return partitions_for_keys(keys, partitions)  # type: ignore[arg-type]
        return [self.partition(topic, key, partitions) for key in keys]

    def columns_array(self, topic: str, keys: pa.Array | None, count: int, partitions: int) -> Any:
        """The partitions of ``count`` records of ``topic`` with Arrow ``keys`` (``None``: keyless), as
        numpy ``int64``: murmur2 for keys, round-robin in order for keyless records, as :meth:`partitions`."""
        out = np.zeros(count, dtype=np.int64)
        keyless = np.ones(count, dtype=bool) if keys is None else np.asarray(keys.is_null(), dtype=bool)
        if keys is not None and keys.null_count < count:
            keyed = np.flatnonzero(~keyless)
            present = keys if len(keyed) == count else keys.take(pa.array(keyed))
            out[keyed] = partition_arrow(present, partitions) if partitions > 1 else 0
        turns = int(keyless.sum())
        if turns:
            start = self._next.get(topic, 0)
            self._next[topic] = start + turns
            out[keyless] = (start + np.arange(turns, dtype=np.int64)) % partitions
        return out

    def keyed_array(self, keys: Sequence[bytes], partitions: int) -> Any:
        """The partitions of a run of keyed records as a numpy ``int64`` array.

        Raises ``TypeError`` when a key is ``None`` (or not bytes-like): the caller then checks for
        keyless records, which take :meth:`partitions` (round-robin), so that a run of keyed records
        is never searched for ``None`` first.
        """
        if len(keys) >= _VECTOR_MIN:
            return partition_array(keys, partitions)
        return np.asarray([to_positive(murmur2(key)) % partitions for key in keys], dtype=np.int64)
