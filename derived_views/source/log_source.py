"""Spark data source ``cdclog``: batch and streaming reads of the change log, up to a commit watermark.

With :mod:`derived_views.source.log_location`, this is the only module of the views that knows where the log
lives; everything else sees rows with the columns of :data:`~derived_views.source.log_partitions.RAW_DDL`.
The functions the driver uses (:func:`read_watermark`, :func:`~derived_views.source.log_partitions.plan_partitions`,
:func:`~derived_views.source.log_partitions.read_partition`) read either backend: the
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

The records of one input partition, read as Arrow batches by the source's tasks and by the driver alike,
are :mod:`derived_views.source.log_partitions`; this module is the Spark data source around them.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition

from derived_views.source.key_splits import splits_per_partition
from derived_views.source.log_location import LogLocation
from derived_views.source.log_partitions import RAW_DDL, LogPartition, plan_partitions, read_partition, reduced_partition
from derived_views.source.watermark import Offsets, read_watermark

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.datasource import ReadLimit


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
    from several threads: the views sync tables side by side, each thread with sessions of its own).

    Spark refuses to register a Python data source under a name its lookup already resolves
    (``DATA_SOURCE_ALREADY_EXISTS``), and that lookup goes through the session the calling JVM thread
    holds as active, which PySpark sets on some calls (``createDataFrame``) and a thread keeps: a thread
    that last used a sibling session, where ``cdclog`` is registered, would be refused. So the session
    being registered is made the thread's active one while it registers. A local session is asked whether it has
    the source; a Spark Connect session, whose registration lives on the server, is remembered by
    identity."""
    from derived_views.engine.spark_session import is_remote

    with _REGISTERING:
        if is_remote(spark):
            if id(spark) not in _REGISTERED:
                spark.dataSource.register(LogDataSource)
                _REGISTERED.add(id(spark))
            return
        session = spark._jsparkSession  # the JVM session: its data sources, and the thread's active one
        if session.sessionState().dataSourceManager().dataSourceExists(LogDataSource.name()):
            return
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        sessions = getattr(jvm, "org.apache.spark.sql.classic.SparkSession")
        active = sessions.getActiveSession()
        sessions.setActiveSession(session)
        try:
            spark.dataSource.register(LogDataSource)
        finally:  # the thread's active session as it was: the caller's thread may be a user's
            if active.isDefined():
                sessions.setActiveSession(active.get())
            else:
                sessions.clearActiveSession()


def offsets_json(offsets: Offsets) -> str:
    """Offsets as the JSON text the ``startingOffsets``/``endingOffsets`` options take."""
    return json.dumps(offsets, sort_keys=True)
