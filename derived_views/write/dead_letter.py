"""The dead-letter table of a view: poison events (an unreadable envelope, or values that do not fit
the column types) recorded once each, keyed by topic, partition and offset (rule 6 of
:mod:`derived_views.write.apply`)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from derived_views.engine.commit_progress import committing
from derived_views.engine.delta_sql import merge_into
from derived_views.events.metadata_columns import KEY, LSN

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from derived_views.write.table_evolution import TableTypes


DEAD_LETTER_DDL = (
    "target string, topic string, partition int, offset bigint, key string, value string, error string, "
    "lsn bigint, recorded_at timestamp"
)


def dead_letter(spark: SparkSession, path: str, frame: DataFrame, target: str, types: TableTypes) -> None:
    """Record the poison events of ``frame`` in the dead-letter table at ``path`` (idempotent).

    The tables of a view share one dead-letter table and may be applied side by side in separate
    sessions, so its creation and MERGEs are serialized in this process (:data:`_DEAD_LETTER_WRITES`)."""
    with _DEAD_LETTER_WRITES:
        _dead_letter(spark, path, frame, target, types)


#: Held while a dead-letter table is written (poison events are rare; one lock for all of them).
_DEAD_LETTER_WRITES = threading.Lock()


def _dead_letter(spark: SparkSession, path: str, frame: DataFrame, target: str, types: TableTypes) -> None:
    from pyspark.sql import functions as F

    types.ensure(spark, path, DEAD_LETTER_DDL)
    poison = frame.filter(F.col("_cdc_error").isNotNull()).select(
        F.lit(target).alias("target"),
        F.col("_cdc_topic").alias("topic"),
        F.col("_cdc_partition").alias("partition"),
        F.col("_cdc_offset").alias("offset"),
        F.col(KEY).alias("key"),
        F.col("_cdc_raw").alias("value"),
        F.col("_cdc_error").alias("error"),
        F.col(LSN).alias("lsn"),
        F.current_timestamp().alias("recorded_at"),
    )
    with committing(spark, None):
        merge_into(
            spark,
            path,
            poison,
            "t.target = s.target AND t.topic = s.topic AND t.partition = s.partition AND t.offset = s.offset",
        ).when_not_matched_insert_all().execute()
