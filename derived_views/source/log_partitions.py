"""The log's records as Arrow batches, one input partition (a topic-partition's offset range) at a time.

What both the ``cdclog`` Spark source's tasks (:mod:`derived_views.source.log_source`) and the driver
(:mod:`derived_views.source.pending`, a small range read in the driver) read: the ranges planned from a
watermark's offsets (:func:`plan_partitions`, one :class:`LogPartition` each, or one per key split:
:mod:`derived_views.source.key_splits`), each read from the embedded log's files or from Kafka into rows of
:data:`RAW_DDL` (:func:`read_partition`), or reduced per key in the same process
(:func:`reduced_partition`).

Workers import this module (a :class:`LogPartition` travels to them pickled), so it must be importable
on them, as :mod:`derived_views.source.log_source` is.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import InputPartition

from derived_views.source.log_location import LogLocation
from derived_views.source.watermark import Offsets
from event_format import LSN_HEADER, SEQUENCE_HEADER, UNCHANGED_HEADER

if TYPE_CHECKING:
    import pyarrow as pa

    from log_store import RecordColumns
    from log_store.log import LogReader

#: Columns of every row the source yields, in order.
RAW_DDL = (
    "topic string, partition int, offset bigint, key string, value string, "
    "timestamp_ms bigint, unchanged string, deleted_lsn bigint, deleted_seq bigint"
)
"""``unchanged`` is the record's ``unchanged`` header (JSON text); ``deleted_lsn``/``deleted_seq`` are a
tombstone's ``lsn``/``sequence`` headers, the position of the deletion it stands for (null otherwise)."""

_CHUNK = 50_000
_CHUNK_BYTES = 64 << 20


class LogPartition(InputPartition):
    """Offsets ``[start, end)`` of one topic-partition of the log at ``location``.

    Parameters
    ----------
    location : LogLocation
        The log, opened read-only by whoever reads the partition (a worker of the ``cdclog`` source, or
        the driver).
    topic, partition : str, int
        The topic-partition.
    start, end : int
        First offset read and the offset to stop before (a watermark's end offset).
    split, splits : int
        With ``splits`` above 1, a reduced read of this range yields only the events of split ``split``'s
        keys (:mod:`derived_views.source.key_splits`); other reads ignore them.

    Notes
    -----
    Must be picklable: it travels from the driver to the Python worker.
    """

    def __init__(
        self, location: LogLocation, topic: str, partition: int, start: int, end: int, split: int = 0, splits: int = 1
    ) -> None:
        super().__init__((topic, partition, start, end, split, splits))
        self.location = location
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end
        self.split = split
        self.splits = splits


def plan_partitions(location: LogLocation | str, start: Offsets, end: Offsets, splits: int = 1) -> list[LogPartition]:
    """One input partition per topic-partition whose range ``[start, end)`` is not empty, or ``splits`` of
    them, one per key split (:mod:`derived_views.source.key_splits`)."""
    location = LogLocation.of(location)
    planned: list[LogPartition] = []
    for topic in sorted(end):
        for partition, end_offset in sorted(end[topic].items(), key=lambda item: int(item[0])):
            begin = int(start.get(topic, {}).get(partition, 0))
            if end_offset > begin:
                planned.extend(
                    LogPartition(location, topic, int(partition), begin, int(end_offset), split, splits)
                    for split in range(splits)
                )
    return planned


#: Column names of :data:`RAW_DDL`, in order.
_RAW_NAMES = [part.split()[0] for part in RAW_DDL.split(",")]


def _arrow_batch(topic: str, partition: int, chunks: Sequence[RecordColumns]) -> pa.RecordBatch:
    """Records (whole stored batches, as columns) as one Arrow batch in :data:`RAW_DDL` order.

    Keys and values go to Arrow as their stored bytes (one copy per column, no object per record) and
    are cast to UTF-8 text by Arrow (which validates them); only records that carry headers are looked
    at one by one. Bytes that are not UTF-8 (a record no capture wrote) become text with ``\\x..``
    escapes, which is no JSON the views can read: such a value becomes a poison event for the
    dead-letter table, never an error that stops every later sync. So does a header that is not what
    capture writes.
    """
    import numpy as np
    import pyarrow as pa

    from log_store import first_header

    offsets = np.concatenate([chunk.offsets for chunk in chunks])
    value_lengths = np.concatenate([chunk.value_lengths for chunk in chunks])
    n = len(offsets)
    unchanged: list[str | None] | None = None
    deleted_lsn: list[int | None] | None = None
    deleted_seq: list[int | None] | None = None
    if any(chunk.headers is not None for chunk in chunks):
        unchanged, deleted_lsn, deleted_seq = [None] * n, [None] * n, [None] * n
        at = 0
        for chunk in chunks:
            if chunk.headers is not None:
                for i, headers in enumerate(chunk.headers, at):
                    if not headers:
                        continue
                    header = first_header(headers, UNCHANGED_HEADER)
                    unchanged[i] = None if header is None else header.decode(errors="backslashreplace")
                    if value_lengths[i] < 0:
                        deleted_lsn[i] = _header_int(first_header(headers, LSN_HEADER))
                        deleted_seq[i] = _header_int(first_header(headers, SEQUENCE_HEADER))
            at += len(chunk)
    arrays = [
        pa.array([topic] * n, pa.string()),
        pa.array(np.full(n, partition, dtype=np.int32)),
        pa.array(offsets),
        _text(np.concatenate([chunk.key_lengths for chunk in chunks]), [chunk.keys for chunk in chunks]),
        _text(value_lengths, [chunk.values for chunk in chunks]),
        pa.array(np.concatenate([chunk.timestamps for chunk in chunks])),
        pa.array(unchanged, pa.string()) if unchanged is not None else pa.nulls(n, pa.string()),
        pa.array(deleted_lsn, pa.int64()) if deleted_lsn is not None else pa.nulls(n, pa.int64()),
        pa.array(deleted_seq, pa.int64()) if deleted_seq is not None else pa.nulls(n, pa.int64()),
    ]
    return pa.RecordBatch.from_arrays(arrays, _RAW_NAMES)


def _text(lengths: Any, pieces: Sequence[memoryview]) -> pa.Array:
    """A byte column (lengths, -1 for null, and the items back to back) as an Arrow string array;
    bytes that are not UTF-8 are escaped (see :func:`_arrow_batch`)."""
    import numpy as np
    import pyarrow as pa

    n = len(lengths)
    valid = lengths >= 0
    bounds = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.maximum(lengths, 0), out=bounds[1:])
    data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
    nulls = n - int(np.count_nonzero(valid))
    validity = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    raw = pa.Array.from_buffers(pa.large_binary(), n, [validity, pa.py_buffer(bounds), pa.py_buffer(data)], nulls)
    try:
        return raw.cast(pa.string())
    except pa.ArrowInvalid:
        return pa.array(
            [None if item is None else item.decode(errors="backslashreplace") for item in raw.to_pylist()], pa.string()
        )


def _header_int(value: bytes | None) -> int | None:
    """A decimal header value; ``None`` when missing, not a number or outside a signed 64-bit integer
    (the tombstone is then unpositioned)."""
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        return None
    return number if -(1 << 63) <= number < (1 << 63) else None


def read_partition(partition: LogPartition, log: LogReader | None = None) -> Iterator[pa.RecordBatch]:
    """Yield the records of one input partition as Arrow batches in :data:`RAW_DDL` order.

    Parameters
    ----------
    partition : LogPartition
        The range to read.
    log : LogStore or KafkaLog, optional
        The partition's log opened already (by a caller reading many partitions, so that it connects once);
        by default one is opened and closed here.

    Yields
    ------
    pyarrow.RecordBatch
        Whole stored batches up to about 50,000 rows or 64 MB each, in offset order; offsets missing
        after compaction are skipped.

    Notes
    -----
    Stateless without ``log``: opens its own read-only handle on the log and closes it, so a batch can be
    re-read deterministically as long as the range has not been compacted away.
    """
    if log is None:
        with partition.location.open() as opened:
            yield from read_partition(partition, opened)
        return
    if partition.location.kafka is not None:
        yield from _read_kafka_partition(partition, log)
        return
    from log_store import LogStore, TopicPartition

    assert isinstance(log, LogStore), "an embedded log's location opens a LogStore"  # read as columns: its own fast path
    tp = TopicPartition(partition.topic, partition.partition)
    offset = partition.start
    while offset < partition.end:
        chunks = log.read_columns(tp, offset, max_records=_CHUNK, max_bytes=_CHUNK_BYTES, end=partition.end)
        if not chunks:
            break
        offset = int(chunks[-1].offsets[-1]) + 1
        yield _arrow_batch(partition.topic, partition.partition, chunks)


def _read_kafka_partition(partition: LogPartition, log: LogReader) -> Iterator[pa.RecordBatch]:
    """:func:`read_partition` of a partition of a log in Kafka: its committed records, in :data:`RAW_DDL` order."""
    import pyarrow as pa

    from log_store import TopicPartition, first_header

    tp = TopicPartition(partition.topic, partition.partition)
    offset = partition.start
    while offset < partition.end:
        records = log.read(tp, offset, max_records=_CHUNK, end=partition.end)
        if not records:
            break
        offset = records[-1].offset + 1
        columns: dict[str, list[Any]] = {name: [] for name in _RAW_NAMES}
        for record in records:
            unchanged = first_header(record.headers, UNCHANGED_HEADER)
            tombstone = record.value is None
            for name, item in (
                ("topic", record.topic),
                ("partition", record.partition),
                ("offset", record.offset),
                ("key", _utf8(record.key)),
                ("value", _utf8(record.value)),
                ("timestamp_ms", record.timestamp_ms),
                ("unchanged", _utf8(unchanged)),
                ("deleted_lsn", _header_int(first_header(record.headers, LSN_HEADER)) if tombstone else None),
                ("deleted_seq", _header_int(first_header(record.headers, SEQUENCE_HEADER)) if tombstone else None),
            ):
                columns[name].append(item)
        yield pa.RecordBatch.from_pydict(columns, schema=_raw_schema())


def _utf8(data: bytes | None) -> str | None:
    """Bytes as text, those that are not UTF-8 escaped (such a value is poison, see :func:`_arrow_batch`)."""
    return None if data is None else data.decode(errors="backslashreplace")


def _raw_schema() -> pa.Schema:
    import pyarrow as pa

    types = {"string": pa.string(), "int": pa.int32(), "bigint": pa.int64()}
    return pa.schema([(part.split()[0], types[part.split()[1]]) for part in RAW_DDL.split(",")])


def reduced_partition(partition: LogPartition, mode: str, row: Any | None = None) -> Iterator[pa.RecordBatch]:
    """The events of one input partition reduced per key (:func:`derived_views.events.arrow_reduction.reduce_table`),
    typed by Arrow as ``row`` when given (:mod:`derived_views.events.typed_rows`).

    Rows match :data:`derived_views.events.reduction.EVENT_DDL` (and :func:`~derived_views.events.typed_rows.typed_ddl`)
    by position. The whole partition is read before anything is yielded, since a key's latest event
    may come last.
    """
    from derived_views.events.arrow_reduction import reduce_table
    from derived_views.source.key_splits import records_of_split, yielded_by_split

    batches = (records_of_split(batch, partition.split, partition.splits) for batch in read_partition(partition))
    reduced = yielded_by_split(reduce_table(batches, mode, row), partition.split)
    yield from reduced.to_batches(max_chunksize=_CHUNK)
