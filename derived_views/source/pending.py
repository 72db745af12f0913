"""What one sync step reads for a table: its pending events, read from the log, reduced per key and typed.

A table's pending range is read and reduced per log partition (:mod:`derived_views.events.reduction`): in the
driver when it is small (:data:`DRIVER_READ_LIMIT`), else by the Spark tasks that read it (:func:`read_log`:
the embedded log through the ``cdclog`` source, Kafka through Spark's Kafka source; read and reduce in one
Python worker per log partition). Each envelope is parsed once: into typed columns by Arrow in the
reduction when it can (:mod:`derived_views.events.typed_rows`), else by Spark
(:func:`~derived_views.events.spark_typing.typed`). A small batch is typed in the driver, with no Spark job
when Arrow typed every event (:mod:`derived_views.events.driver_typed`), else by one Spark job whose rows
come back to the driver as Arrow; its :class:`~derived_views.events.batch_facts.BatchFacts` are computed
there, and it is applied from those rows (a local relation); a large one is checkpointed locally by one
job that also observes its facts (:func:`typed_batch`). Either way the source of a MERGE is deterministic.
"""

from __future__ import annotations

from dataclasses import replace as with_fields
from typing import TYPE_CHECKING, Any

from derived_views.engine.progress import Progress
from derived_views.events.arrow_reduction import reduce_table
from derived_views.events.batch_facts import BatchFacts, arrow_facts, checkpointed
from derived_views.events.reduction import EVENT_DDL
from derived_views.events.spark_typing import Plan, typed, widened
from derived_views.source.log_location import LogLocation
from derived_views.source.log_partitions import plan_partitions, read_partition
from derived_views.source.log_source import Offsets, offsets_json
from derived_views.source.table_step import TableStep

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def read_log(
    spark: SparkSession,
    location: LogLocation | str,
    topics: list[str],
    start: Offsets,
    end: Offsets,
    reduce: str | None = None,
    columns: list[tuple[str, str]] | None = None,
) -> DataFrame:
    """Log rows of ``topics`` in ``[start, end)`` read by Spark tasks, one task per log partition: raw
    (:data:`~derived_views.source.log_partitions.RAW_DDL`), or reduced per partition (``reduce`` = ``latest``/``all``,
    rows of :data:`EVENT_DDL`) by the tasks that read them (one per key split of each partition when
    Spark has more cores than partitions: :mod:`derived_views.source.key_splits`), typed by Arrow as ``columns`` in the
    same parse when given (:mod:`derived_views.events.typed_rows`). The embedded log is read through the ``cdclog``
    source, Kafka through Spark's Kafka source (:func:`derived_views.source.kafka_read.read_kafka`)."""
    import json

    from derived_views.source.log_source import register

    location = LogLocation.of(location)
    if location.kafka is not None:
        from derived_views.source.kafka_read import read_kafka

        return read_kafka(spark, location, topics, start, end, reduce, columns)
    register(spark)
    reader = (
        spark.read.format("cdclog")
        .option("path", location.path)
        .option("topics", ",".join(topics))
        .option("startingOffsets", offsets_json(start))
        .option("endingOffsets", offsets_json({t: end.get(t, {}) for t in topics}))
    )
    if reduce is not None:
        from derived_views.source.key_splits import task_slots

        reader = reader.option("reduce", reduce).option("parallelism", str(task_slots(spark)))
    if columns is not None:
        reader = reader.option("columns", json.dumps(columns))
    return reader.load()


#: A pending range of at most this many log offsets is read and reduced in the driver process and
#: handed to Spark as one Arrow table; larger ranges are read by Spark tasks through the ``cdclog``
#: source. Both give the same events (same reduction per log partition); the driver path saves the
#: source's planning round trips and Python workers, which dominate small batches.
DRIVER_READ_LIMIT = 100_000


def read_in_driver(offsets: int) -> bool:
    """Whether a pending range of ``offsets`` log offsets is read in the driver (:data:`DRIVER_READ_LIMIT`)."""
    return offsets <= DRIVER_READ_LIMIT


def _start(progress: Progress | None, topics: list[str]) -> Offsets:
    """Where a table with ``progress`` resumes reading ``topics`` (the log's start when it has none)."""
    return {t: dict((progress or Progress()).offsets.get(t, {})) for t in topics}


def pending_table(step: TableStep, row: Any | None = None) -> Any | None:
    """The reduced events (an Arrow table of :data:`EVENT_DDL`, typed as ``row`` when given) of
    ``step``'s topics the table has not applied, read in the driver; ``None`` when the range holds more
    than :data:`DRIVER_READ_LIMIT` offsets (then Spark tasks read it, see :func:`typed_batch`)."""
    import pyarrow as pa

    as_of, topics = step.as_of, step.topics
    end = {t: as_of.watermark.offsets.get(t, {}) for t in topics}
    parts = plan_partitions(as_of.log, _start(step.applied, topics), end)
    if not read_in_driver(sum(part.end - part.start for part in parts)):
        return None
    if not parts:
        return reduce_table([], step.mode, row)
    with as_of.log.open() as log:  # one connection for every partition
        return pa.concat_tables([reduce_table(read_partition(part, log), step.mode, row) for part in parts])


def arrow_typed(columns: list[tuple[str, str]], plan: Plan | None) -> bool:
    """Whether events parsed with ``plan`` can be typed as ``columns`` by Arrow (:mod:`derived_views.events.typed_rows`):
    every event has the view's column types (one schema version), and Arrow parses each of them exactly."""
    from derived_views.events.typed_rows import row_type

    return (plan is None or (len(plan) == 1 and plan[0][1] == columns)) and row_type(columns) is not None


def typed_batch(spark: SparkSession, step: TableStep) -> tuple[DataFrame, BatchFacts]:
    """The pending events of ``step`` typed (:func:`typed`), as a deterministic frame, with their :class:`BatchFacts`.

    A range small enough for the driver (:func:`pending_table`) is typed there when Arrow typed every
    event (:func:`~derived_views.events.driver_typed.typed_in_driver`), else parsed by Spark in one job whose
    rows come back as Arrow: the facts are then computed in the driver and the frame is a local
    relation built from those rows. A larger range is read and parsed by Spark tasks and checkpointed
    locally, its facts observed by the same job (:func:`checkpointed`).
    """
    from derived_views.events.typed_rows import row_type, typed_ddl

    columns, table, plan, stored_as = step.columns, step.table, step.plan, step.stored_as
    typed_columns = columns if arrow_typed(columns, plan) else None
    events = pending_table(step, row_type(typed_columns) if typed_columns else None)
    if events is None:
        frame, facts = checkpointed(typed_events(spark, step))
        if facts.poison:
            facts = with_fields(facts, widen=widened(frame))
        return frame, facts
    if typed_columns is not None:
        from derived_views.events.driver_typed import typed_in_driver

        assembled = typed_in_driver(events, typed_columns, table, stored_as)
        if assembled is not None:
            rows, ddl = assembled
            return spark.createDataFrame(rows, schema=ddl), arrow_facts(rows)
    ddl = EVENT_DDL if typed_columns is None else f"{EVENT_DDL}, {typed_ddl(typed_columns)}"
    parsed = typed(spark.createDataFrame(events, schema=ddl), columns, table, plan, stored_as=stored_as)
    rows = parsed.toArrow()
    return spark.createDataFrame(rows, schema=parsed.schema), arrow_facts(rows)


def typed_events(spark: SparkSession, step: TableStep) -> DataFrame:
    """The pending events of ``step``'s topics read, reduced and typed by Spark tasks (:func:`typed`): each
    envelope parsed once, by Arrow in the task that reduces it when it can (:func:`arrow_typed`)."""
    as_of, topics, columns, plan = step.as_of, step.topics, step.columns, step.plan
    typed_columns = columns if arrow_typed(columns, plan) else None
    raw = read_log(
        spark, as_of.log, topics, _start(step.applied, topics), as_of.watermark.offsets, reduce=step.mode, columns=typed_columns
    )
    return typed(raw, columns, step.table, plan, stored_as=step.stored_as)
