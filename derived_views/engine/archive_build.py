"""Makes the Spark driver JVM's class-data-sharing archive: ``python -m derived_views.engine.archive_build``.

What the archive is, where it lives and why a stale one is harmless: :mod:`derived_views.engine.class_archive`.
This module starts a driver (:func:`derived_views.engine.spark_session.build_spark`) with
``-XX:ArchiveClassesAtExit``, runs a small Delta workload, and stops it; the archive is written under a
temporary name and renamed into place, so a driver never maps a half-written one.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from derived_views.engine.class_archive import QUIET_CDS, archive_path
from derived_views.engine.spark_session import build_spark

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def _workload(spark: SparkSession, directory: Path) -> None:
    """Delta work of the kind every view step does, so the archive holds the classes a step loads."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    table = str(directory / "table")
    rows = spark.range(0, 1000).select(
        F.col("id"), (F.col("id") * 2).alias("value"), F.lit("x").alias("name"), F.current_timestamp().alias("at")
    )
    rows.write.format("delta").save(table)
    changes = spark.range(995, 1005).select(
        F.col("id"), F.lit(0).cast("long").alias("value"), F.lit("y").alias("name"), F.current_timestamp().alias("at")
    )
    (
        DeltaTable.forPath(spark, table)
        .alias("t")
        .merge(changes.alias("s"), "t.id = s.id")
        .whenMatchedUpdateAll()
        .whenNotMatchedInsertAll()
        .execute()
    )
    changes.write.format("delta").mode("append").save(table)
    spark.read.format("delta").load(table).where("value = 0").groupBy("name").count().toArrow()
    spark.sql(f"DESCRIBE HISTORY delta.`{table}`").collect()


def make() -> Path | None:
    """Write this installation's archive (idempotent: an existing one is kept); ``None`` without Java."""
    target = archive_path()
    if target is None:
        return None
    if target.is_file():
        return target
    for stale in target.parent.glob("driver-classes-*.jsa"):
        stale.unlink(missing_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    with tempfile.TemporaryDirectory(prefix="cdc-classes-") as work:
        spark = build_spark(
            "cdc-class-archive",
            master="local[2]",
            conf={"spark.driver.extraJavaOptions": f"-XX:ArchiveClassesAtExit={partial} {QUIET_CDS}"},
        )
        _workload(spark, Path(work))
        spark.stop()
        _stop_driver()
    if not partial.is_file():
        raise RuntimeError(f"the driver JVM wrote no class archive at {partial}")
    os.replace(partial, target)
    return target


def _stop_driver() -> None:
    """End the driver JVM now (it writes the archive as it exits) and wait for it."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return
    process = getattr(gateway, "proc", None)
    gateway.shutdown()
    if process is not None:
        process.stdin.close()  # the driver exits when its stdin closes
        process.wait(timeout=120)
    SparkContext._gateway = None
    SparkContext._jvm = None


if __name__ == "__main__":
    made = make()
    print(made if made else "no Java found: no class archive made", file=sys.stderr)
