"""Records appended as Arrow columns are stored byte for byte as the same records appended one by one."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from log_store import LogConfig, LogStore, ProducerRecord, TopicPartition, partition_for_key
from log_store.errors import InvalidRecordError
from log_store.producer_columns import ProducerColumns
from log_store.segment import FILE_HEADER_SIZE
from tests.log_store.helpers import FakeClock, read_all

_CLOCK = FakeClock()


def _config(max_batch_bytes: int) -> LogConfig:
    return LogConfig(clock=_CLOCK, max_batch_bytes=max_batch_bytes)


def _segments(root: Path) -> dict[str, bytes]:
    """Every segment's batches (the file header holds a per-file nonce)."""
    return {str(p.relative_to(root)): p.read_bytes()[FILE_HEADER_SIZE:] for p in sorted(root.rglob("*.log"))}


def _block(
    topic: str, keys: list[bytes | None] | None, values: list[bytes | None], ts: int, large: bool = False
) -> ProducerColumns:
    kind = pa.large_binary() if large else pa.binary()
    return ProducerColumns(topic, None if keys is None else pa.array(keys, kind), pa.array(values, kind), ts)


_keys = st.lists(st.binary(max_size=12), min_size=1, max_size=60)


@settings(max_examples=40, deadline=None)
@given(
    keys=_keys,
    partitions=st.integers(1, 5),
    budget=st.sampled_from([64, 512, 1 << 20]),
    tombstones=st.lists(st.booleans(), min_size=60, max_size=60),
    large=st.booleans(),
    cut=st.integers(0, 60),
    presorted=st.booleans(),
)
def test_columns_store_the_bytes_records_store(
    tmp_path_factory: pytest.TempPathFactory,
    keys: list[bytes],
    partitions: int,
    budget: int,
    tombstones: list[bool],
    large: bool,
    cut: int,
    presorted: bool,
) -> None:
    if presorted:  # as a producer that orders its rows by partition hands them over (placed without a take)
        keys = sorted(keys, key=lambda key: partition_for_key(key, partitions))
    values: list[bytes | None] = [None if tombstones[i] else b"v" * (i % 7) + key for i, key in enumerate(keys)]
    cut = min(cut, len(keys))
    records = [ProducerRecord("t", k, v, 7) for k, v in zip(keys, values)]
    block = _block("t", list(keys), values, 7, large)
    head = ProducerRecord("t", b"first", b"1", 5)
    logs = {name: tmp_path_factory.mktemp(name) for name in ("records", "columns", "mixed")}
    for name, group in (
        ("records", [records, [head, *records]]),
        ("columns", [[block], [head, *records]]),
        ("mixed", [records, [head, block.slice(0, cut), block.slice(cut, len(keys))]]),
    ):
        with LogStore.open(logs[name], _config(budget), writer=True) as log:
            log.ensure_topic("t", partitions)
            for position, items in enumerate(group):
                log.append_group(items, str(position))
    # one block alone is stored in exactly the batches its records are stored in
    assert _segments(logs["records"]) == _segments(logs["columns"])
    # a record and a block in two runs in one chunk: the same records at the same offsets
    with LogStore.open(logs["records"]) as expected, LogStore.open(logs["mixed"]) as mixed:
        assert read_all(mixed, "t") == read_all(expected, "t")
        assert sum(mixed.end_offset(TopicPartition("t", p)) for p in range(partitions)) == 2 * len(keys) + 1


def test_keyless_columns_take_partitions_round_robin_as_records_do(tmp_path: Path) -> None:
    values = [f"v{i}".encode() for i in range(10)]
    with LogStore.open(tmp_path / "records", _config(1 << 20), writer=True) as log:
        log.ensure_topic("t", 3, compacted=False)
        log.append_group([ProducerRecord("t", None if i % 2 else b"k%d" % i, v, 1) for i, v in enumerate(values)], "a")
        expected = [(r.partition, r.key, r.value) for r in read_all(log, "t")]
    with LogStore.open(tmp_path / "columns", _config(1 << 20), writer=True) as log:
        log.ensure_topic("t", 3, compacted=False)
        keys = [None if i % 2 else b"k%d" % i for i in range(10)]
        log.append_group([_block("t", keys, list(values), 1)], "a")
        assert [(r.partition, r.key, r.value) for r in read_all(log, "t")] == expected
    assert len(expected) == 10


def test_keyless_columns_in_a_compacted_topic_are_refused_and_nothing_is_written(tmp_path: Path) -> None:
    with LogStore.open(tmp_path, _config(1 << 20), writer=True) as log:
        log.ensure_topic("t", 2)
        log.append_group([ProducerRecord("t", b"k", b"v", 1)], "a")
        with pytest.raises(InvalidRecordError):
            log.append_group([ProducerRecord("t", b"k2", b"v", 1), _block("t", None, [b"x", b"y"], 1)], "b")
        assert [(r.key, r.value) for r in read_all(log, "t")] == [(b"k", b"v")]
        assert log.latest_watermark() is not None and log.latest_watermark().position == "a"


def test_columns_must_be_arrow_byte_arrays_of_one_length() -> None:
    with pytest.raises(TypeError, match="Arrow binary or string array"):
        ProducerColumns("t", pa.array([1, 2]), pa.array([b"a", b"b"]), 1)
    with pytest.raises(ValueError, match="2 keys but 1 values"):
        ProducerColumns("t", pa.array([b"a", b"b"]), pa.array([b"a"]), 1)
    block = ProducerColumns("t", pa.array(["k", None]), pa.array(["v", None]), 3)
    assert block.record(0) == ProducerRecord("t", b"k", b"v", 3)
    assert block.record(1) == ProducerRecord("t", None, None, 3)
