"""Placement: Kafka's murmur2, toPositive and modulo, and round-robin for keyless records."""

from __future__ import annotations

import os
import random

import pytest

from log_store.partitioner import (
    Partitioner,
    murmur2,
    partition_for_key,
    partitions_for_keys,
    to_positive,
)

# Kafka's UtilsTest#testMurmur2 vectors (org.apache.kafka.common.utils.Utils.murmur2), plus the ones
# other Kafka-compatible clients check against Kafka's implementation.
KAFKA_MURMUR2 = {
    "21": -973932308,
    "foobar": -790332482,
    "a-little-bit-long-string": -985981536,
    "a-little-bit-longer-string": -1486304829,
    "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    "abc": 479470107,
    "1": -1993445489,
    "12": 126087238,
    "123": -267702483,
    "1234": -1614185708,
    "12345": -1188365604,
}


@pytest.mark.parametrize(("text", "expected"), sorted(KAFKA_MURMUR2.items()))
def test_murmur2_matches_kafka(text: str, expected: int) -> None:
    assert murmur2(text.encode()) == expected


def test_placement_is_to_positive_modulo() -> None:
    # toPositive clears the sign bit; it is not abs(): -973932308 & 0x7fffffff = 1173551340.
    assert to_positive(-973932308) == 1173551340
    assert partition_for_key(b"21", 3) == 1173551340 % 3 == 0
    assert partition_for_key(b"foobar", 12) == to_positive(-790332482) % 12 == 6
    assert partition_for_key(b"abc", 7) == 479470107 % 7
    assert partition_for_key(b"anything", 1) == 0


@pytest.mark.parametrize("partitions", [2, 3, 7, 64, 1024])
def test_batch_placement_equals_per_key(partitions: int) -> None:
    rng = random.Random(partitions)
    keys = [os.urandom(rng.randint(0, 41)) for _ in range(3000)]
    keys += [b'{"id":%d}' % i for i in range(500)]
    assert partitions_for_keys(keys, partitions) == [partition_for_key(k, partitions) for k in keys]


def test_keyless_records_round_robin_per_topic() -> None:
    partitioner = Partitioner()
    assert [partitioner.partition("a", None, 3) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert [partitioner.partition("b", None, 2) for _ in range(3)] == [0, 1, 0]
    assert partitioner.partitions("a", [None, None, b"21"], 3) == [1, 2, 0]
