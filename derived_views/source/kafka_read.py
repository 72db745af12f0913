"""A view's pending events from a log in Kafka, read through Spark's Kafka source and reduced as the
``cdclog`` source reduces the embedded log's (:func:`derived_views.source.pending.read_log` chooses)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from derived_views.events.arrow_reduction import reduce_table
from derived_views.events.reduction import EVENT_DDL
from derived_views.source.log_location import LogLocation
from event_format import LSN_HEADER, SEQUENCE_HEADER, UNCHANGED_HEADER

if TYPE_CHECKING:
    from pyspark.sql import Column as SparkColumn
    from pyspark.sql import DataFrame, SparkSession

    from derived_views.source.log_source import Offsets


def read_kafka(
    spark: SparkSession,
    location: LogLocation,
    topics: list[str],
    start: Offsets,
    end: Offsets,
    reduce: str | None = None,
    columns: list[tuple[str, str]] | None = None,
) -> DataFrame:
    """:func:`read_log` of a log in Kafka, through Spark's Kafka source.

    The source reads ``read_committed`` and makes one Spark partition per Kafka partition, in offset
    order, which is what the per-partition reduction needs (every event of a key is in one partition);
    its rows are mapped to :data:`~derived_views.source.log_partitions.RAW_DDL` and reduced by ``mapInArrow``, one
    Python worker per partition, as the ``cdclog`` source reduces its partitions. ``failOnDataLoss`` stays
    on: the source skips offsets it cannot see above the partition's earliest offset (compaction's gaps,
    commit markers, aborted records) as it should, and fails only where records below a range's end are
    gone from the partition's start (retention or a deleted topic), which a view must not skip.
    """
    import functools

    from derived_views.events.typed_rows import typed_ddl
    from derived_views.source.log_partitions import RAW_DDL

    ranges = _nonempty_ranges(topics, start, end)
    out_ddl = RAW_DDL if reduce is None else EVENT_DDL if columns is None else f"{EVENT_DDL}, {typed_ddl(columns)}"
    if not ranges:
        return spark.createDataFrame([], schema=out_ddl)

    raw = _kafka_rows(spark, location, ranges)
    if reduce is None:
        return raw
    return raw.mapInArrow(functools.partial(_reduce_partition, reduce, columns), out_ddl)


def _nonempty_ranges(topics: list[str], start: Offsets, end: Offsets) -> dict[str, dict[str, tuple[int, int]]]:
    """Per topic and partition, ``(start, end)`` offsets of the partitions with something to read."""
    ranges = {
        topic: {p: (int(start.get(topic, {}).get(p, 0)), int(e)) for p, e in end.get(topic, {}).items()} for topic in topics
    }
    ranges = {topic: {p: r for p, r in parts.items() if r[1] > r[0]} for topic, parts in ranges.items()}
    return {topic: parts for topic, parts in ranges.items() if parts}


def _kafka_rows(spark: SparkSession, location: LogLocation, ranges: dict[str, dict[str, tuple[int, int]]]) -> DataFrame:
    """The records of ``ranges`` read committed through Spark's Kafka source, as :data:`RAW_DDL` rows."""
    import json

    from pyspark.sql import functions as F

    def header(name: str, as_type: str) -> SparkColumn:
        return F.expr(f"try_cast(cast(try_element_at(filter(headers, h -> h.key = '{name}'), 1).value AS STRING) AS {as_type})")

    tombstone = F.col("value").isNull()
    return (
        spark.read.format("kafka")
        .options(**location.spark_options())
        .option("assign", json.dumps({topic: sorted(int(p) for p in parts) for topic, parts in ranges.items()}))
        .option("startingOffsets", json.dumps({t: {p: r[0] for p, r in parts.items()} for t, parts in ranges.items()}))
        .option("endingOffsets", json.dumps({t: {p: r[1] for p, r in parts.items()} for t, parts in ranges.items()}))
        .option("kafka.isolation.level", "read_committed")
        .option("includeHeaders", "true")
        .option("failOnDataLoss", "true")
        .load()
        .select(
            F.col("topic"),
            F.col("partition").cast("int"),
            F.col("offset"),
            F.col("key").cast("string").alias("key"),
            F.col("value").cast("string").alias("value"),
            F.unix_millis("timestamp").alias("timestamp_ms"),
            header(UNCHANGED_HEADER, "STRING").alias("unchanged"),
            F.when(tombstone, header(LSN_HEADER, "BIGINT")).alias("deleted_lsn"),
            F.when(tombstone, header(SEQUENCE_HEADER, "BIGINT")).alias("deleted_seq"),
        )
    )


def _reduce_partition(mode: str, columns: list[tuple[str, str]] | None, batches: Any) -> Any:
    """One Kafka partition's raw rows reduced per key (:func:`derived_views.events.arrow_reduction.reduce_table`), in a worker."""
    from derived_views.events.typed_rows import row_type

    yield from reduce_table(batches, mode, None if columns is None else row_type(columns)).to_batches()
