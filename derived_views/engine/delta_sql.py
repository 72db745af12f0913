"""Delta operations on a table by path, written as Spark SQL so they run in any Spark session.

The views write through Delta's Spark connector. Its Python ``DeltaTable`` builder needs the driver JVM
in this process (or, over Spark Connect, Delta's own Connect plugins on the server); Delta's SQL needs
neither: ``MERGE INTO delta.`<path>```, ``DESCRIBE HISTORY``, ``CREATE TABLE`` run the same commands in a
local session and in a Spark Connect session (:mod:`derived_views.engine.spark_server`) alike. :class:`Merge`
keeps the builder's shape (a target aliased ``t``, a source aliased ``s``, clauses in order, conditions
and values as SQL expressions), so each MERGE reads as it did.

The commit a statement writes carries whatever the session's commit metadata holds
(:func:`derived_views.engine.commit_progress.committing`), as with the builder.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def is_local(path: str) -> bool:
    """Whether ``path`` is on local disk (no URI scheme, or ``file://``)."""
    return "://" not in path or path.startswith("file://")


def table_ref(path: str) -> str:
    """The SQL name of the Delta table at ``path``."""
    return "delta.`" + path.replace("`", "``") + "`"


def is_delta_table(spark: SparkSession, path: str) -> bool:
    """Whether a Delta table exists at ``path`` (read with ``deltalake`` on local disk, no Spark job)."""
    if is_local(path):
        from deltalake import DeltaTable

        return bool(DeltaTable.is_deltatable(path.removeprefix("file://")))
    try:
        detail = spark.sql(f"DESCRIBE DETAIL {table_ref(path)}").select("format").first()
    except Exception as exc:  # noqa: BLE001 - what no table at the path raises, through py4j or Spark Connect
        if any(marker in str(exc) for marker in _NO_TABLE):
            return False
        raise
    return detail is not None and detail["format"] == "delta"


#: What ``DESCRIBE DETAIL`` of a path that holds no Delta table fails with (a missing path, or another
#: format's files).
_NO_TABLE = (
    "DELTA_FILE_NOT_FOUND",
    "FileNotFoundException",
    "PATH_NOT_FOUND",
    "DELTA_MISSING_DELTA_TABLE",
    "is not a Delta table",
)


def history(spark: SparkSession, path: str, limit: int | None = None) -> DataFrame:
    """The table's commits, newest first (``DESCRIBE HISTORY``), at most ``limit`` of them."""
    return spark.sql(f"DESCRIBE HISTORY {table_ref(path)}" + (f" LIMIT {int(limit)}" if limit else ""))


def create_if_missing(spark: SparkSession, path: str, ddl: str, partitioned_by: Sequence[str] = ()) -> None:
    """Create an empty Delta table with the columns ``ddl`` (``name type, ...``), partitioned by the columns
    ``partitioned_by`` names (plain identifiers: the views' own metadata columns), unless one exists."""
    partitions = f" PARTITIONED BY ({', '.join(partitioned_by)})" if partitioned_by else ""
    spark.sql(f"CREATE TABLE IF NOT EXISTS {table_ref(path)} ({ddl}) USING delta{partitions}")


def partition_columns(spark: SparkSession, path: str) -> list[str]:
    """The columns the Delta table at ``path`` is partitioned by (``DESCRIBE DETAIL``): a rewrite with
    ``overwriteSchema`` keeps only the partitioning it is given."""
    detail = spark.sql(f"DESCRIBE DETAIL {table_ref(path)}").first()
    return list(detail["partitionColumns"] or []) if detail is not None else []


def _assignments(values: Mapping[str, str]) -> str:
    return ", ".join(f"{column} = {expression}" for column, expression in values.items())


def _when(condition: str | None) -> str:
    return f" AND ({condition})" if condition else ""


class Merge:
    """One ``MERGE INTO`` the Delta table at a path (target ``t``) from a DataFrame (source ``s``).

    Clauses keep the order they are added in, as in Delta's builder and SQL: within each kind (matched,
    not matched, not matched by source) the first whose condition holds applies, and the kinds must be
    added in that order (Spark's grammar)."""

    def __init__(self, spark: SparkSession, path: str, source: DataFrame, on: str) -> None:
        self._spark = spark
        self._path = path
        self._source = source
        self._on = on
        self._clauses: list[str] = []

    def when_matched_delete(self, condition: str | None = None) -> Merge:
        self._clauses.append(f"WHEN MATCHED{_when(condition)} THEN DELETE")
        return self

    def when_matched_update(self, values: Mapping[str, str], condition: str | None = None) -> Merge:
        self._clauses.append(f"WHEN MATCHED{_when(condition)} THEN UPDATE SET {_assignments(values)}")
        return self

    def when_not_matched_insert(self, values: Mapping[str, str], condition: str | None = None) -> Merge:
        columns = ", ".join(values)
        expressions = ", ".join(values.values())
        self._clauses.append(f"WHEN NOT MATCHED{_when(condition)} THEN INSERT ({columns}) VALUES ({expressions})")
        return self

    def when_not_matched_insert_all(self) -> Merge:
        self._clauses.append("WHEN NOT MATCHED THEN INSERT *")
        return self

    def when_not_matched_by_source_delete(self, condition: str | None = None) -> Merge:
        self._clauses.append(f"WHEN NOT MATCHED BY SOURCE{_when(condition)} THEN DELETE")
        return self

    def when_not_matched_by_source_update(self, values: Mapping[str, str], condition: str | None = None) -> Merge:
        self._clauses.append(f"WHEN NOT MATCHED BY SOURCE{_when(condition)} THEN UPDATE SET {_assignments(values)}")
        return self

    def statement(self, source_name: str) -> str:
        """The SQL text, the source read from the temporary view ``source_name``."""
        return f"MERGE INTO {table_ref(self._path)} AS t USING {source_name} AS s ON {self._on} " + " ".join(self._clauses)

    def execute(self) -> None:
        """Run the MERGE: one Delta commit (none when the source is empty).

        The source is a temporary view of this session under a name of its own, dropped afterwards, so
        MERGEs run side by side in one session do not see each other's sources."""
        name = f"_cdc_merge_source_{uuid.uuid4().hex}"
        self._source.createOrReplaceTempView(name)
        try:
            self._spark.sql(self.statement(name))
        except BaseException:
            with contextlib.suppress(Exception):  # the MERGE's own error is the one to report
                self._spark.catalog.dropTempView(name)
            raise
        self._spark.catalog.dropTempView(name)


def merge_into(spark: SparkSession, path: str, source: DataFrame, on: str) -> Merge:
    """A :class:`Merge` of ``source`` (``s``) into the Delta table at ``path`` (``t``) on ``on``."""
    return Merge(spark, path, source, on)
