"""Key -> partition placement, identical to Kafka's default partitioner for keyed records.

``partition = (murmur2(key) & 0x7fffffff) % partitions`` where ``murmur2`` is Kafka's 32-bit MurmurHash2
(seed ``0x9747b28c``, little-endian 4-byte words, signed Java ``int`` arithmetic). Keeping the same
placement lets a topic move to Kafka without reshuffling keys. Keyless records are spread round-robin
per topic (Kafka's older default); :class:`Partitioner` holds the per-topic counters and is not
thread-safe on its own (the store calls it under its write lock).
"""

from __future__ import annotations

import struct

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
