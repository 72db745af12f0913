"""A class-data-sharing archive for the Spark driver JVM, so that every ``cdc`` command's driver starts sooner.

A driver JVM spends most of its first seconds loading, parsing and verifying the same classes each run
(Spark SQL, Delta, Hadoop, Parquet: some 20,000 of them). Java's application class-data sharing keeps
those classes, already parsed and verified, in an archive file that a JVM maps at start instead. Set-up
makes the archive once (``python -m derived_views.class_archive``): it starts a driver with
``-XX:ArchiveClassesAtExit``, runs a small Delta workload (create, append, ``MERGE``, read, Arrow
collect), and stops it; the JVM writes what it loaded as it exits. Every driver this project starts
afterwards (:func:`derived_views.jvm_output.launch_driver`, ``cdc spark-server``) maps it with
``-XX:SharedArchiveFile``.

Measured on 2 cores: a session's start went from 4.3 s to 2.8 s, and start plus a first Delta write and
``MERGE`` from about 14 s to 11 s.

Safety: the archive only ever changes how fast classes load, never which classes load. The JVM checks the
archive against its own build and class path and ignores one that does not match (a Java or jar
upgrade); ``-Xlog:cds=off,cds+dynamic=off`` keeps that check silent, so a stale archive costs the
speed-up and nothing else. The file's name is keyed by the Java binary, the pyspark version and the jar
set (:func:`archive_path`), so a changed installation looks for, and set-up makes, a new one. The archive
is written under a temporary name and renamed into place, so a driver never maps a half-written one.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from derived_views.spark_jars import installed_jars, jars_dir

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: JVM options that silence the JVM's report of an archive it cannot use (it then runs without it).
QUIET_CDS = "-Xlog:cds=off,cds+dynamic=off"


def java_binary() -> Path | None:
    """The ``java`` the Spark launcher runs: ``$JAVA_HOME/bin/java``, else the one on ``PATH``."""
    java_home = os.environ.get("JAVA_HOME")
    found = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    return Path(os.path.realpath(found)) if found and os.path.exists(found) else None


def archive_path() -> Path | None:
    """Where the archive of this installation lives (it may not exist yet); ``None`` without Java."""
    import pyspark

    java = java_binary()
    if java is None:
        return None
    libjvm = next(iter(sorted(java.parent.parent.glob("lib/server/libjvm.so"))), java)
    stat = libjvm.stat()
    identity = "\n".join(
        [str(java), str(stat.st_size), str(int(stat.st_mtime)), pyspark.__version__, *(jar.name for jar in installed_jars())]
    )
    key = hashlib.sha256(identity.encode()).hexdigest()[:16]
    return jars_dir() / f"driver-classes-{key}.jsa"


def java_options() -> str:
    """Driver JVM options that map this installation's archive; empty when there is none."""
    if os.environ.get("CDC_CLASS_ARCHIVE", "on").strip().lower() in {"off", "0", "false", "no"}:
        return ""
    path = archive_path()
    if path is None or not path.is_file():
        return ""
    return f"-XX:SharedArchiveFile={path} {QUIET_CDS}"


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
    from derived_views.spark_session import build_spark

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
