"""Spark data source ``cdclog``: batch and streaming reads of the change log, up to a commit watermark.

With :mod:`derived_views.source.log_location`, this is the only module of the views that knows where the log
lives; everything else sees rows with the columns of :data:`RAW_DDL`. The functions the driver uses
(:func:`read_watermark`, :func:`plan_partitions`, :func:`read_partition`) read either backend: the
embedded log's files, or Kafka (read-committed, up to a watermark's end offsets). Spark tasks read the
embedded log through the ``cdclog`` source and Kafka through Spark's own Kafka source
(:func:`derived_views.source.pending.read_log`).

Offsets are plain dicts::

    {"position": "00000000016B3A28",              # the watermark's commit LSN ("%016X")
     "offsets": {"cdc.public.products": {"0": 120, "1": 97}}}   # next offset per topic-partition

Read it, once :func:`register` made it known to the session, as
``spark.read.format("cdclog").option("path", "data/log").option("topics", "cdc.public.products").load()``
(option ``rows`` = ``events`` parses each envelope into columns: :mod:`derived_views.events.change_events`).
Users' own jobs read it the same way: ``docs/spark-source.md`` is its user documentation.

- End offsets always come from one commit watermark of the log, so a batch never holds part of a
  source transaction (promise 2), and re-reading the same ``[start, end)`` yields the same records.
- Every Spark input partition is one topic-partition's offset range (for a reduced read, one key split
  of it: :mod:`derived_views.source.key_splits`), so all events of one key stay in one Spark partition, in log
  order.
- ``read()`` is stateless: it opens the log read-only, reads its range and yields Arrow record batches
  whose columns match :data:`RAW_DDL` by position.
- The streaming reader's ``commit()`` does nothing: Spark's checkpointed offsets are the truth.
  A read limit is not applied: a micro-batch cap could only fall on a watermark, and the log keeps
  only its latest one, so every micro-batch reads up to the latest watermark.
- Workers import this module, so it must be importable on them (``PYSPARK_PYTHON`` set to the
  project's interpreter; :func:`derived_views.engine.spark_session.build_spark` does that).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition

from derived_views.source.key_splits import splits_per_partition
from derived_views.source.log_location import LogLocation
from derived_views.source.watermark import Offsets, read_watermark
from event_format import LSN_HEADER, SEQUENCE_HEADER, UNCHANGED_HEADER

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.datasource import ReadLimit

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


def _parse_offsets(text: str | None) -> Offsets:
    if not text or text == "earliest":
        return {}
    parsed = json.loads(text)
    return {topic: {str(p): int(o) for p, o in parts.items()} for topic, parts in parsed.items()}


class _Options:
    """The source's options: ``path``, ``topics`` (comma-separated), ``startingOffsets``, ``endingOffsets``,
    ``rows`` (``raw``, the default: rows of :data:`RAW_DDL`; ``events``: each record's envelope parsed into
    the columns of :data:`derived_views.events.change_events.EVENTS_DDL`), and for batch reads ``reduce``
    (``latest``/``all``: yield the reduced events of each partition) and
    ``columns`` (a JSON list of ``[name, Spark type]`` whose Arrow struct types the reduced rows, see
    :mod:`derived_views.events.typed_rows`; only for columns it can type) and ``parallelism`` (the tasks Spark
    runs at once: a reduced read of fewer partitions splits each one's keys so that no core sits idle,
    see :mod:`derived_views.source.key_splits`)."""

    def __init__(self, given: dict[str, str]) -> None:
        options = {key.lower(): value for key, value in given.items()}
        if "path" not in options:
            raise ValueError("the cdclog source needs option 'path' (the log directory)")
        self.path = options["path"]
        self.topics = [t.strip() for t in options.get("topics", "").split(",") if t.strip()]
        if not self.topics:
            raise ValueError("the cdclog source needs option 'topics' (comma-separated topic names)")
        self.starting = _parse_offsets(options.get("startingoffsets"))
        self.ending = options.get("endingoffsets")
        self.reduce = options.get("reduce") or None
        if self.reduce not in (None, "latest", "all"):
            raise ValueError(f"the cdclog source's option 'reduce' is 'latest' or 'all', not {self.reduce!r}")
        self.columns: list[tuple[str, str]] | None = None
        if options.get("columns"):
            if self.reduce is None:
                raise ValueError("the cdclog source's option 'columns' needs option 'reduce'")
            self.columns = [(str(name), str(spark_type)) for name, spark_type in json.loads(options["columns"])]
        self.rows = options.get("rows", "raw")
        if self.rows not in ("raw", "events"):
            raise ValueError(f"the cdclog source's option 'rows' is 'raw' or 'events', not {self.rows!r}")
        if self.rows == "events" and self.reduce is not None:
            raise ValueError("the cdclog source's option 'rows' = 'events' reads every record: leave out option 'reduce'")
        parallelism = options.get("parallelism", "1")
        if not parallelism.isdigit() or int(parallelism) < 1:
            raise ValueError(f"the cdclog source's option 'parallelism' is a whole number above 0, not {parallelism!r}")
        self.parallelism = int(parallelism)

    def rows_of(self, partition: LogPartition) -> Iterator[pa.RecordBatch]:
        """The rows an unreduced read yields for ``partition``: raw, or parsed (option ``rows``)."""
        if self.rows == "events":
            from derived_views.events.change_events import change_events

            return map(change_events, read_partition(partition))
        return read_partition(partition)

    def row_type(self) -> Any | None:
        """The Arrow struct reduced rows are typed as (option ``columns``), or ``None``."""
        from derived_views.events.typed_rows import row_type

        return None if self.columns is None else row_type(self.columns)

    def end(self) -> tuple[str, int, Offsets]:
        if self.ending and self.ending != "watermark":
            parsed = json.loads(self.ending)
            return (
                str(parsed.get("position", "")),
                int(parsed.get("timestamp_ms", 0)),
                _parse_offsets(json.dumps(parsed.get("offsets", parsed))),
            )
        watermark = read_watermark(self.path, self.topics)
        if watermark is None:
            return "", 0, {topic: {} for topic in self.topics}
        return watermark.position, watermark.timestamp_ms, watermark.offsets


class LogBatchReader(DataSourceReader):
    """Batch reader of ``[startingOffsets, endingOffsets)``.

    Parameters
    ----------
    options : dict
        ``path``, ``topics``, optional ``startingOffsets`` (JSON offsets, default every partition from
        0) and ``endingOffsets`` (JSON offsets, default: the log's latest commit watermark, fixed when
        the reader is created). With ``reduce`` (``latest`` or ``all``) each partition's records are
        reduced per key in the same Python worker that reads them (:func:`reduced_partition`), and the
        rows are those of :data:`derived_views.events.reduction.EVENT_DDL`; with ``columns`` too, typed by Arrow
        in the same parse (:mod:`derived_views.events.typed_rows`).
    """

    def __init__(self, options: dict[str, str]) -> None:
        self._options = _Options(options)
        self._end = self._options.end()[2]

    def partitions(self) -> Sequence[InputPartition]:
        location = LogLocation.of(self._options.path)
        planned = plan_partitions(location, self._options.starting, self._end)
        if self._options.reduce is None:
            return planned
        splits = splits_per_partition(len(planned), self._options.parallelism)
        return planned if splits == 1 else plan_partitions(location, self._options.starting, self._end, splits)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        # Spark reads an empty plan through one placeholder partition: it yields nothing
        if not isinstance(partition, LogPartition):
            return iter(())
        if self._options.reduce is not None:
            return reduced_partition(partition, self._options.reduce, self._options.row_type())
        return self._options.rows_of(partition)


class LogStreamReader(DataSourceStreamReader):
    """Streaming reader: every micro-batch ends at the latest commit watermark.

    Parameters
    ----------
    options : dict
        As for :class:`LogBatchReader`; ``startingOffsets`` is the initial offset of a new query.

    Notes
    -----
    ``latestOffset`` returns ``start`` unchanged while the log has no watermark. ``commit`` is a no-op:
    Spark's checkpointed offsets are the truth (``commit`` arrives one batch late, and never for the
    last batch of an ``availableNow`` run).
    """

    def __init__(self, options: dict[str, str]) -> None:
        self._options = _Options(options)

    def initialOffset(self) -> dict:
        offsets = {topic: dict(parts) for topic, parts in self._options.starting.items()}
        for topic in self._options.topics:
            offsets.setdefault(topic, {})
        return {"position": "", "timestamp_ms": 0, "offsets": offsets}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:  # noqa: ARG002 - see Notes
        position, timestamp_ms, offsets = self._options.end()
        if not position:
            return start
        return {"position": position, "timestamp_ms": timestamp_ms, "offsets": offsets}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return plan_partitions(LogLocation.of(self._options.path), start.get("offsets", {}), end.get("offsets", {}))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        # Spark reads an empty plan through one placeholder partition: it yields nothing
        if not isinstance(partition, LogPartition):
            return iter(())
        return self._options.rows_of(partition)

    def commit(self, end: dict) -> None:
        """Nothing to do: the checkpointed offsets are the truth, and the log is never trimmed by readers."""


class LogDataSource(DataSource):
    """The ``cdclog`` format: rows of :data:`RAW_DDL` (or, with option ``rows`` = ``events``, of
    :data:`derived_views.events.change_events.EVENTS_DDL`) read from the change log at option ``path``. Its
    options, rows and restart behaviour are documented for users in ``docs/spark-source.md``.

    Examples
    --------
    >>> register(spark)
    >>> (spark.readStream.format("cdclog").option("path", "data/log")
    ...  .option("topics", "cdc.public.orders").load()
    ...  .writeStream.format("delta").option("checkpointLocation", "chk").trigger(availableNow=True)
    ...  .start("raw_orders"))
    """

    @classmethod
    def name(cls) -> str:
        return "cdclog"

    def schema(self) -> str:
        options = _Options(dict(self.options))
        if options.rows == "events":
            from derived_views.events.change_events import EVENTS_DDL

            return EVENTS_DDL
        if options.reduce:
            from derived_views.events.reduction import EVENT_DDL
            from derived_views.events.typed_rows import typed_ddl

            return EVENT_DDL if options.columns is None else f"{EVENT_DDL}, {typed_ddl(options.columns)}"
        return RAW_DDL

    def reader(self, schema: Any) -> DataSourceReader:
        return LogBatchReader(dict(self.options))

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return LogStreamReader(dict(self.options))


_REGISTERED: set[int] = set()
_REGISTERING = threading.Lock()


def register(spark: SparkSession) -> None:
    """Make ``spark.read.format("cdclog")`` available in ``spark`` (idempotent, once per session, safe
    from several threads: the views sync tables side by side)."""
    with _REGISTERING:
        if id(spark) not in _REGISTERED:
            spark.dataSource.register(LogDataSource)
            _REGISTERED.add(id(spark))


def offsets_json(offsets: Offsets) -> str:
    """Offsets as the JSON text the ``startingOffsets``/``endingOffsets`` options take."""
    return json.dumps(offsets, sort_keys=True)
