"""Where a group's records go and how they are encoded, before any of them is written.

:class:`ChunkEncoder` places each record of a chunk on a partition (Kafka's murmur2 partitioner over
the key, round-robin for a keyless record of a topic that is not compacted, :mod:`log_store.partitioner`)
and encodes every partition's share into record batches. Every way the records themselves can be wrong
(an unknown topic, a missing key in a compacted topic, a field of the wrong type) raises
:class:`~log_store.errors.InvalidRecordError` here, so that :meth:`LogStore.append_group` writes nothing
of a chunk that holds a bad record.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Any, cast

import numpy as np
import pyarrow as pa

from log_store.batch_encoding import Columns
from log_store.errors import InvalidRecordError, UnknownTopicError
from log_store.partition import EncodedBatch, Partition
from log_store.partitioner import Partitioner
from log_store.producer_columns import ArrowColumns, ProducerColumns, split_runs
from log_store.record import ProducerRecord, TopicPartition
from log_store.topic import TopicConfig

_TOPIC, _KEY = itemgetter(0), itemgetter(1)


@dataclass
class ChunkEncoder:
    """Places and encodes chunks for the log at ``root``, whose ``topics`` and ``partitions`` it shares
    (the store's own dictionaries, kept up to date by the store)."""

    root: Path
    topics: dict[str, TopicConfig]
    partitions: dict[TopicPartition, Partition]
    partitioner: Partitioner = field(default_factory=Partitioner)

    def encode_chunk(
        self, chunk: Sequence[ProducerRecord | ProducerColumns], now_ms: int
    ) -> list[tuple[Partition, list[EncodedBatch]]]:
        """:meth:`encode_records` of a chunk, where each :class:`ProducerColumns` is a run of its own.

        A partition touched by several runs gets their batches in the runs' order (each run encoded
        at the offsets the runs before it leave), and nothing is written before every run encoded.
        """
        if ProducerColumns not in set(map(type, chunk)):
            return self.encode_records(cast("Sequence[ProducerRecord]", chunk), now_ms)
        out: list[tuple[Partition, list[EncodedBatch]]] = []
        ahead: dict[TopicPartition, int] = {}  # records encoded for a partition by earlier runs
        for run in split_runs(chunk):
            encoded = (
                self._encode_columns(run, now_ms, ahead)
                if isinstance(run, ProducerColumns)
                else self.encode_records(run, now_ms, ahead)
            )
            for partition, batches in encoded:
                ahead[partition.tp] = ahead.get(partition.tp, 0) + sum(batch.records for batch in batches)
            out += encoded
        return out

    def _encode_columns(
        self, block: ProducerColumns, now_ms: int, ahead: Mapping[TopicPartition, int]
    ) -> list[tuple[Partition, list[EncodedBatch]]]:
        """:meth:`encode_records` of a :class:`ProducerColumns`, after ``ahead`` records per partition."""
        groups = self.place_columns(block)
        try:
            return [
                (self.partitions[tp], self.partitions[tp].encode(columns, now_ms, ahead.get(tp, 0)))
                for tp, columns in groups.items()
            ]
        except (TypeError, ValueError, OverflowError, struct.error) as exc:
            raise InvalidRecordError(
                block.topic, f"a record cannot be encoded ({exc})", "give keys and values as Arrow binary arrays"
            ) from exc

    def place_columns(self, block: ProducerColumns) -> dict[TopicPartition, ArrowColumns]:
        """:meth:`place` of a :class:`ProducerColumns`: partitions chosen from the Arrow keys."""
        config = self.topics.get(block.topic)
        if config is None:
            raise UnknownTopicError(self.root, block.topic)
        if config.compacted and block.null_keys():
            raise _keyless(block.topic)
        groups: dict[TopicPartition, ArrowColumns] = {}
        if not len(block):
            return groups
        if config.partitions == 1:
            groups[TopicPartition(block.topic, 0)] = ArrowColumns(block.keys, block.values, block.timestamp_ms)
            return groups
        placed = self.partitioner.columns_array(block.topic, block.keys, len(block), config.partitions)
        counts = np.bincount(placed, minlength=config.partitions).tolist()
        if max(counts) == len(block):
            groups[TopicPartition(block.topic, counts.index(len(block)))] = ArrowColumns(
                block.keys, block.values, block.timestamp_ms
            )
            return groups
        keys, values = block.keys, block.values
        if np.any(placed[1:] < placed[:-1]):  # rows a producer already put in partition order stay where they are
            order = pa.array(np.argsort(placed, kind="stable"))
            keys = None if keys is None else keys.take(order)
            values = values.take(order)
        start = 0
        for partition, size in enumerate(counts):
            if size:
                groups[TopicPartition(block.topic, partition)] = ArrowColumns(
                    None if keys is None else keys.slice(start, size), values.slice(start, size), block.timestamp_ms
                )
                start += size
        return groups

    def encode_records(
        self, records: Sequence[ProducerRecord], now_ms: int, ahead: Mapping[TopicPartition, int] | None = None
    ) -> list[tuple[Partition, list[EncodedBatch]]]:
        """Place and encode one chunk for every partition it touches (after ``ahead`` records encoded
        for it and not written yet), writing nothing.

        Every way the records themselves can be wrong (an unknown topic, a missing key in a compacted
        topic, a field of the wrong type) raises here, before any of the chunk is written: a type
        that the encoding refuses (``TypeError``, ``struct.error``...) becomes an
        :class:`InvalidRecordError` naming the field.
        """
        try:
            groups = self.place(records)
            return [
                (self.partitions[tp], self.partitions[tp].encode(columns, now_ms, ahead.get(tp, 0) if ahead else 0))
                for tp, columns in groups.items()
            ]
        except (TypeError, ValueError, AttributeError, OverflowError, struct.error) as exc:
            raise _invalid_record(records, exc) from exc

    def place(self, records: Sequence[ProducerRecord]) -> dict[TopicPartition, Columns]:
        """Group records by partition, checking topics and keys before anything is written.

        Works on runs of records of one topic taken apart into columns with C-level ``map`` calls
        (``map(itemgetter(i), run)``: unlike ``zip(*run)`` it allocates no per-record iterator, so a
        group does not set off the garbage collector). Field types are not checked record by record:
        encoding refuses what it cannot store (see :meth:`encode_records`), and keys and values may be any
        bytes-like objects. Records of a multi-partition topic are grouped by partition with numpy
        over the partition numbers and one ``itemgetter`` per partition: no per-record Python code.
        """
        groups: dict[TopicPartition, Columns] = {}
        if not records:
            return groups
        topic_names = set(map(_TOPIC, records))
        runs: list[tuple[str, Sequence[ProducerRecord]]] = []
        if len(topic_names) == 1:
            runs.append((next(iter(topic_names)), records))
        else:
            by_topic: dict[str, list[ProducerRecord]] = {}
            for record in records:
                by_topic.setdefault(record[0], []).append(record)
            runs += by_topic.items()
        for topic, run in runs:
            config = self.topics.get(topic)
            if config is None:
                raise UnknownTopicError(self.root, topic)
            if config.partitions == 1:
                columns = Columns(run)
                if columns.null_keys and config.compacted:
                    raise _keyless(topic)
                groups[TopicPartition(topic, 0)] = columns
                continue
            keys: list[bytes | None] = list(map(_KEY, run))
            try:
                placed = self.partitioner.keyed_array(cast("list[bytes]", keys), config.partitions)
            except TypeError:
                if None not in keys:
                    raise  # a key that is not bytes: _encode names it
                if config.compacted:
                    raise _keyless(topic) from None
                placed = np.asarray(self.partitioner.partitions(topic, keys, config.partitions), dtype=np.int64)
            for partition, picked in _by_partition(placed, config.partitions):
                if picked is None:  # the whole run
                    share: Sequence[ProducerRecord] = run
                elif len(picked) == 1:
                    share = (run[picked[0]],)
                else:
                    share = itemgetter(*picked)(run)
                groups[TopicPartition(topic, partition)] = Columns(share)
        return groups


def _keyless(topic: str) -> InvalidRecordError:
    return InvalidRecordError(
        topic, "a compacted topic needs a key on every record", "give the record a key or use a non-compacted topic"
    )


def _by_partition(placed: Any, partitions: int) -> list[tuple[int, list[int] | None]]:
    """``(partition, positions of its records)`` in partition order for a numpy array of partition
    numbers; positions keep their order, and are ``None`` when one partition has every record."""
    count = len(placed)
    if partitions <= 8:
        out: list[tuple[int, list[int] | None]] = []
        for partition in range(partitions):
            positions = np.flatnonzero(placed == partition)
            if len(positions) == count:
                return [(partition, None)]
            if len(positions):
                out.append((partition, positions.tolist()))
        return out
    counts = np.bincount(placed, minlength=partitions).tolist()
    order = np.argsort(placed, kind="stable")
    out = []
    start = 0
    for partition, size in enumerate(counts):
        if size == count:
            return [(partition, None)]
        if size:
            out.append((partition, order[start : start + size].tolist()))
            start += size
    return out


def _multibyte(item: object) -> bool:
    return isinstance(item, memoryview) and (item.itemsize != 1 or item.ndim > 1)


def _kind(item: object) -> str:
    return f"a memoryview of {item.format!r} items" if isinstance(item, memoryview) else type(item).__name__


def _invalid_record(records: Sequence[ProducerRecord], exc: BaseException) -> InvalidRecordError:
    """The :class:`InvalidRecordError` for records whose encoding raised ``exc``, naming the field."""
    for record in records:
        topic, key, value, timestamp, headers = record[:5]
        if not isinstance(key, (bytes, bytearray, memoryview, type(None))) or _multibyte(key):
            return InvalidRecordError(topic, f"key is {_kind(key)}, not bytes", "encode keys to bytes")
        if not isinstance(value, (bytes, bytearray, memoryview, type(None))) or _multibyte(value):
            return InvalidRecordError(
                topic, f"value is {_kind(value)}, not bytes", "encode values to bytes (None is a tombstone)"
            )
        if not isinstance(timestamp, int) or not -(1 << 63) <= timestamp < 1 << 63:
            return InvalidRecordError(
                topic, f"timestamp_ms is {timestamp!r}, not a 64-bit int", "give milliseconds since the epoch as an int"
            )
        if not isinstance(headers, tuple) or not all(
            isinstance(h, tuple) and len(h) == 2 and isinstance(h[0], str) and isinstance(h[1], (bytes, bytearray, memoryview))
            for h in headers
        ):
            return InvalidRecordError(
                topic, "headers must be a tuple of (str, bytes) pairs", "build headers as ((name, value_bytes), ...)"
            )
    topic = records[0][0] if records else "?"
    return InvalidRecordError(topic, f"a record cannot be encoded ({exc})", "check the types of the records' fields")
