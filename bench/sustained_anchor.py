"""The hand-written job ``bench.views_sustained`` measures ``cdc sync`` against: what a Spark user writes to
keep the same current and history tables of pgbench's tables from the log, without the project's views.

Usage: python -m bench.sustained_anchor LOG_DIR TARGET_DIR APPLIED_FILE

One Structured Streaming query over the ``cdclog`` source (``rows=events``, every pgbench table's topic and
the bench's probe table), triggered as fast as it can, whose ``foreachBatch`` does per table what the Delta
documentation's patterns do:

- current (SCD1): the latest event per key of the micro-batch (by ``lsn``, ``sequence``), one MERGE on the
  key (delete, update every column, insert); a keyless table's rows are appended;
- history (SCD2): one version row per event, valid to the key's next event in the batch; one MERGE of the
  staged union (a close row per key ends the table's current version, every version is inserted); a
  keyless table's versions are appended.

Rows are typed with ``from_json(after, DDL)`` and matched on the log's ``key`` text. pgbench has no TOAST
values, so there are no partial rows to fold (the project's views fold them). Every micro-batch ends at a
commit watermark of the log; after each one the job appends ``<highest lsn of the batch> <unix time>`` to
APPLIED_FILE, which the bench reads as the position the job's tables are exact as of.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: topic -> (table DDL, keyed)
TABLES = {
    "cdc.public.pgbench_accounts": ("aid int, bid int, abalance int, filler string", True),
    "cdc.public.pgbench_branches": ("bid int, bbalance int, filler string", True),
    "cdc.public.pgbench_tellers": ("tid int, bid int, tbalance int, filler string", True),
    "cdc.public.pgbench_history": ("tid int, bid int, aid int, delta int, mtime timestamp, filler string", False),
    "cdc.public.sustained_probe": ("id int, n bigint", True),
}


def _exists(spark: SparkSession, path: str) -> bool:
    from delta.tables import DeltaTable

    return bool(DeltaTable.isDeltaTable(spark, path))


def _write(spark: SparkSession, path: str, rows: DataFrame, merge: str | None, clauses: object) -> None:
    """Append ``rows`` to a new table (or with ``merge`` None), else MERGE them as ``clauses`` says."""
    from delta.tables import DeltaTable

    if merge is None or not _exists(spark, path):
        rows.write.format("delta").mode("append").save(path)
        return
    builder = DeltaTable.forPath(spark, path).alias("t").merge(rows.alias("s"), merge)
    clauses(builder).execute()  # type: ignore[operator]


def _current(spark: SparkSession, path: str, events: DataFrame, columns: list[str], keyed: bool) -> None:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if not keyed:
        _write(spark, path, events.where("op <> 'd'").select(*columns), None, None)
        return
    latest = Window.partitionBy("key").orderBy(F.col("lsn").desc(), F.col("sequence").desc())
    rows = events.withColumn("_rank", F.row_number().over(latest)).where("_rank = 1").drop("_rank")
    if not _exists(spark, path):
        _write(spark, path, rows.where("op <> 'd'").select("key", "lsn", *columns), None, None)
        return
    values = {c: f"s.{c}" for c in ("key", "lsn", *columns)}
    _write(
        spark, path, rows.select("key", "lsn", "op", *columns), "t.key = s.key",
        lambda b: b.whenMatchedDelete("s.op = 'd'").whenMatchedUpdate("s.op <> 'd'", values)
        .whenNotMatchedInsert("s.op <> 'd'", values),
    )  # fmt: skip


def _history(spark: SparkSession, path: str, events: DataFrame, columns: list[str], keyed: bool) -> None:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if not keyed:
        versions = events.where("op <> 'd'").select(
            *columns, F.col("lsn").alias("valid_from"), F.lit(None).cast("bigint").alias("valid_to")
        )
        _write(spark, path, versions, None, None)
        return
    by_key = Window.partitionBy("key").orderBy("lsn", "sequence")
    versions = events.select(
        "key", "op", *columns,
        F.col("lsn").alias("valid_from"), F.col("sequence").alias("valid_from_seq"),
        F.when(F.col("op") == "d", F.col("lsn")).otherwise(F.lead("lsn").over(by_key)).alias("valid_to"),
        F.row_number().over(by_key).alias("_rank"),
    ).withColumn("is_current", F.col("valid_to").isNull() & (F.col("op") != "d"))  # fmt: skip
    if not _exists(spark, path):
        _write(spark, path, versions.drop("_rank"), None, None)
        return
    closes = versions.where("_rank = 1").select(
        F.col("key").alias("merge_key"), *[F.lit(None).alias(c) for c in ("key", "op", *columns)],
        "valid_from", "valid_from_seq", F.lit(None).cast("bigint").alias("valid_to"), F.lit(False).alias("is_current"),
    )  # fmt: skip
    staged = (
        versions.drop("_rank")
        .select(F.lit(None).cast("string").alias("merge_key"), "*")
        .unionByName(closes, allowMissingColumns=True)
    )
    inserted = {c: f"s.{c}" for c in ("key", "op", *columns, "valid_from", "valid_from_seq", "valid_to", "is_current")}
    _write(
        spark, path, staged, "t.key = s.merge_key AND t.is_current",
        lambda b: b.whenMatchedUpdate("s.valid_from > t.valid_from", {"valid_to": "s.valid_from", "is_current": "false"})
        .whenNotMatchedInsert("s.merge_key IS NULL", inserted),
    )  # fmt: skip


def run(log_dir: str, target: Path, applied_file: Path) -> None:
    from pyspark.sql import functions as F

    import derived_views
    from bench.views_common import bench_spark

    spark = bench_spark().newSession()  # Delta's defaults, as a user's job gets them
    derived_views.register(spark)

    def apply(batch: DataFrame, _batch_id: int) -> None:
        events = batch.where("error IS NULL AND op IS NOT NULL AND op <> 't'").persist()
        try:
            present = {row["topic"] for row in events.select("topic").distinct().collect()}
            for topic in sorted(present & TABLES.keys()):
                ddl, keyed = TABLES[topic]
                columns = [part.split()[0] for part in ddl.split(", ")]
                typed = events.where(F.col("topic") == topic).select(
                    "key", "op", "lsn", "sequence", F.from_json(F.coalesce("after", "before"), ddl).alias("row")
                )
                typed = typed.select("key", "op", "lsn", "sequence", *[F.col(f"row.{c}").alias(c) for c in columns])
                name = topic.removeprefix("cdc.")
                _current(spark, str(target / "current" / name), typed, columns, keyed)
                _history(spark, str(target / "history" / name), typed, columns, keyed)
            top = events.agg(F.max("lsn")).collect()[0][0]
        finally:
            events.unpersist()
        if top is not None:
            with applied_file.open("a") as out:
                out.write(f"{int(top)} {time.time()}\n")

    stream = (
        spark.readStream.format("cdclog")
        .option("path", log_dir)
        .option("topics", ",".join(TABLES))
        .option("rows", "events")
        .load()
    )
    query = stream.writeStream.foreachBatch(apply).option("checkpointLocation", str(target / "_checkpoint")).start()
    query.awaitTermination()


if __name__ == "__main__":
    run(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]))
