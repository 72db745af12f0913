"""Levers of ``cdc sync``'s speed, each printed beside its anchor measured in the same run (used by
``bench.views_side_by_side``, which describes them).

- :func:`file_layout`: what a MERGE of a few random keys rewrites, by the target's file layout;
- :func:`scheduled`: a fresh ``cdc sync --once`` of one small transaction beside a bare Spark start.

Prints figures only; asserts nothing.
"""

from __future__ import annotations

import os
import random
import signal
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from bench.views_scheduled import _BARE_START, _line, _start_server, _timed

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from bench.views_side_by_side import Writer
    from cdc.settings import Settings

#: Keys a layout's MERGE changes, and how many such MERGEs each layout gets (different keys each time).
MERGE_KEYS = 20
MERGES = 3
#: Spark's cap on the rows of one written file (Delta's writes, a MERGE's rewrites included, honour it).
MAX_RECORDS_PER_FILE = "spark.sql.files.maxRecordsPerFile"
#: Delta's MERGE metrics printed per layout.
METRICS = ("numTargetRowsCopied", "numTargetFilesRemoved", "numTargetFilesAdded", "numTargetDeletionVectorsAdded")


def file_layout(spark: SparkSession, table: str, workdir: Path) -> None:
    """MERGEs of :data:`MERGE_KEYS` random keys (each raising their price, newer ``_cdc_lsn``) into the
    table ``cdc sync`` wrote at ``table`` (the anchor) and into copies of its rows laid out otherwise:
    Delta's metrics (the mean over :data:`MERGES` MERGEs), the MERGE's wall time (median), the table's files,
    and whether ``deltalake`` (hence pandas, Polars) can read the table."""
    from pyspark.sql import functions as F

    from derived_views.write.context import DELETION_VECTORS

    spark.conf.set(DELETION_VECTORS, "false")  # the copies are written as cdc sync writes tables by default
    rows = spark.read.format("delta").load(table)
    count = rows.count()
    clustered = rows.repartitionByRange(10, "_cdc_key").sortWithinPartitions("_cdc_key")
    layouts: list[tuple[str, str, str | None]] = [("as cdc sync laid it out (anchor)", table, None)]
    for label, name, frame, max_rows in (
        ("files of at most 10,000 rows", "rows10k", rows, "10000"),
        ("files of at most 2,000 rows", "rows2k", rows, "2000"),
        ("10 files clustered by key", "clustered", clustered, None),
        ("deletion vectors (CDC_DELETION_VECTORS)", "dv", rows, None),
    ):
        path = str(workdir / name)
        with _max_rows_per_file(spark, max_rows):
            frame.write.format("delta").save(path)
        if name == "dv":
            spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
        layouts.append((label, path, max_rows))
    chooser = random.Random(11)
    samples = [chooser.sample(range(1, count + 1), MERGE_KEYS) for _ in range(MERGES)]
    print(f"file layout: {MERGES} MERGEs of {MERGE_KEYS} random keys each into {count:,} rows (mean per MERGE)")
    print(f"  {'layout':<42}{'files':>7}{'rows copied':>13}{'files -/+':>11}{'DVs':>5}{'wall s':>8}  deltalake reads it")
    for label, path, max_rows in layouts:
        files = int(spark.sql(f"DESCRIBE DETAIL delta.`{path}`").collect()[0]["numFiles"])
        metrics: list[dict[str, int]] = []
        walls: list[float] = []
        for keys in samples:
            changed = (
                spark.read.format("delta")
                .load(path)
                .where(F.get_json_object("_cdc_key", "$.id").cast("bigint").isin(keys))
                .withColumn("price", F.col("price") + 1)
                .withColumn("_cdc_lsn", F.col("_cdc_lsn") + 1)
            )
            source = changed.localCheckpoint()
            started = time.perf_counter()
            with _max_rows_per_file(spark, max_rows):  # the files a MERGE rewrites keep the layout
                _merge(spark, path, source)
            walls.append(time.perf_counter() - started)
            metrics.append(_last_merge(spark, path))
        mean = {name: statistics.mean(m.get(name, 0) for m in metrics) for name in METRICS}
        print(
            f"  {label:<42}{files:7d}{mean['numTargetRowsCopied']:13,.0f}"
            f"{mean['numTargetFilesRemoved']:6.1f}/{mean['numTargetFilesAdded']:<4.1f}"
            f"{mean['numTargetDeletionVectorsAdded']:5.1f}{statistics.median(walls):8.2f}  {_deltalake_reads(path)}"
        )


@contextmanager
def _max_rows_per_file(spark: SparkSession, rows: str | None) -> Iterator[None]:
    """Within the block, the session's writes (a MERGE's rewritten files too) split files past ``rows`` rows."""
    if rows is None:
        yield
        return
    spark.conf.set(MAX_RECORDS_PER_FILE, rows)
    try:
        yield
    finally:
        spark.conf.unset(MAX_RECORDS_PER_FILE)


def _merge(spark: SparkSession, path: str, changed: DataFrame) -> None:
    """The current table's MERGE of whole rows (:func:`derived_views.write.scd1.merge_current`'s clauses)."""
    from delta.tables import DeltaTable

    (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(changed.alias("s"), "t._cdc_key = s._cdc_key")
        .whenMatchedUpdateAll("s._cdc_lsn > t._cdc_lsn")
        .whenNotMatchedInsertAll()
        .execute()
    )


def _last_merge(spark: SparkSession, path: str) -> dict[str, int]:
    metrics = spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").collect()[0]["operationMetrics"] or {}
    return {name: int(value) for name, value in metrics.items() if value.isdigit()}


def _deltalake_reads(path: str) -> str:
    from deltalake import DeltaTable

    try:
        DeltaTable(path).to_pyarrow_table(columns=["price"])
    except Exception as exc:  # noqa: BLE001 - the answer is the figure
        return f"no ({str(exc).splitlines()[0][:60]})"
    return "yes"


def scheduled(settings: Settings, writer: Writer, views_file: Path) -> None:
    """A fresh ``cdc sync --once`` of one transaction changing 5 products, into the warehouse's current table
    the ``cdc`` arm kept (brought up to date first), beside a bare Spark start (the anchor), with Spark
    started by the command and attached to a warm ``cdc spark-server``. Capture runs all along."""
    from derived_views.source.log_location import LogLocation
    from derived_views.source.log_source import read_watermark

    cdc = str(Path(sys.executable).with_name("cdc"))
    env = {key: value for key, value in os.environ.items() if not key.startswith("CDC_") or key == "CDC_SPARK_JARS_DIR"}
    env.update(
        CDC_DATABASE_URL=settings.database_url,
        CDC_DATA_DIR=str(settings.data_dir),
        CDC_TABLES="public.products",
        CDC_VIEWS_FILE=str(views_file),
        PYTHONPATH=str(Path(__file__).resolve().parents[1]),
    )
    location = LogLocation(path=str(settings.log_dir.resolve()))

    def small_change() -> None:
        """One transaction changing 5 products, in the log once this returns."""
        before, _ = writer.burst(5)
        deadline = time.monotonic() + 120
        while (watermark := read_watermark(location)) is None or watermark.lsn <= before:
            if time.monotonic() > deadline:
                raise RuntimeError("capture did not log the change within 120 s")
            time.sleep(0.05)

    _timed([cdc, "sync", "--once"], env)  # catch up with the other arms' changes
    bare = _timed([sys.executable, "-c", _BARE_START], env)
    small_change()
    cold = _timed([cdc, "sync", "--once"], env)
    server, remote, server_start = _start_server(cdc, env)
    try:
        attached_env = {**env, "CDC_SPARK_REMOTE": remote}
        attached = []
        for _ in range(2):
            small_change()
            attached.append(_timed([cdc, "sync", "--once"], attached_env))
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    bare_again = _timed([sys.executable, "-c", _BARE_START], env)
    anchor = min(bare, bare_again)
    print(f"scheduled: bare Spark start (JVM + Delta, no work) {anchor:7.2f} s   (anchor; {bare:.2f} and {bare_again:.2f} s)")
    print(_line("  cdc sync --once of 5 changed rows, cold", cold, anchor))
    print(f"  attached to a warm Spark (cdc spark-server, listening after {server_start:.2f} s):")
    print(_line("  cdc sync --once of 5 changed rows, first", attached[0], anchor))
    print(_line("  cdc sync --once of 5 changed rows, next", attached[1], anchor))
