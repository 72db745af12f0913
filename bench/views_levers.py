"""Levers of ``cdc sync``'s speed, each printed beside its anchor measured in the same run (used by
``bench.views_side_by_side``, which describes them).

- :func:`file_layout`: what a MERGE of a few random keys rewrites, by the target's file layout;
- :func:`merge_forms`: ``cdc sync``'s MERGE of the current table beside the plain upsert MERGE a user writes,
  on copies of one table with the same batches;
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

from bench.views_scheduled import BARE_START, line, start_server, timed

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from bench.views_side_by_side import Writer
    from cdc.config.settings import Settings

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
    # one round more than measured: the first round (left out) compiles and loads what later ones reuse
    samples = [chooser.sample(range(1, count + 1), MERGE_KEYS) for _ in range(MERGES + 1)]
    files = {path: int(spark.sql(f"DESCRIBE DETAIL delta.`{path}`").collect()[0]["numFiles"]) for _, path, _ in layouts}
    metrics: dict[str, list[dict[str, int]]] = {path: [] for _, path, _ in layouts}
    walls: dict[str, list[float]] = {path: [] for _, path, _ in layouts}
    for round_number, keys in enumerate(samples):
        for _label, path, max_rows in layouts:  # round by round, so that every layout meets the same load
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
            if round_number:
                walls[path].append(time.perf_counter() - started)
                metrics[path].append(_last_merge(spark, path))
    print(f"file layout: {MERGES} MERGEs of {MERGE_KEYS} random keys each into {count:,} rows (mean per MERGE, after one more)")
    print(f"  {'layout':<42}{'files':>7}{'rows copied':>13}{'files -/+':>11}{'DVs':>5}{'wall s':>8}  deltalake reads it")
    for label, path, _ in layouts:
        mean = {name: statistics.mean(m.get(name, 0) for m in metrics[path]) for name in METRICS}
        print(
            f"  {label:<42}{files[path]:7d}{mean['numTargetRowsCopied']:13,.0f}"
            f"{mean['numTargetFilesRemoved']:6.1f}/{mean['numTargetFilesAdded']:<4.1f}"
            f"{mean['numTargetDeletionVectorsAdded']:5.1f}{statistics.median(walls[path]):8.2f}  {_deltalake_reads(path)}"
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


#: Rows a batch of :func:`merge_forms` updates, and rows it inserts (a step of the steady workload: 7
#: transactions of 5 updates and 5 inserts).
BATCH_UPDATES = BATCH_INSERTS = 35


def merge_forms(spark: SparkSession, table: str, workdir: Path) -> None:
    """:data:`MERGES` batches of :data:`BATCH_UPDATES` updates and :data:`BATCH_INSERTS` inserts, each applied
    to two copies of the table at ``table`` (``cdc sync``'s current table): by ``cdc sync``'s own MERGE
    (:func:`derived_views.write.scd1.merge_current`: the LSN guard, SQL over a temporary view of the
    batch) and by the Delta documentation's upsert (``DeltaTable.merge`` with ``whenMatchedUpdateAll``,
    ``whenNotMatchedInsertAll``), in turns (which goes first alternates). Prints each one's median wall
    time and Delta's ``executionTimeMs``."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from derived_views.engine.progress import Progress
    from derived_views.events.metadata_columns import KEY, LSN, OP, SEQ, TS, UNCHANGED
    from derived_views.source.as_of import LogAsOf
    from derived_views.source.log_location import LogLocation
    from derived_views.source.table_step import TableStep
    from derived_views.source.watermark import LogWatermark
    from derived_views.write.context import DELETION_VECTORS
    from derived_views.write.scd1 import merge_current
    from derived_views.write.table_evolution import TableTypes

    spark.conf.set(DELETION_VECTORS, "false")
    rows = spark.read.format("delta").load(table)
    paths = {form: str(workdir / f"form-{form}") for form in ("cdc", "plain")}
    for path in paths.values():
        rows.write.format("delta").save(path)
    meta = {KEY, LSN, SEQ, TS, OP}
    columns = [(f.name, f.dataType.simpleString()) for f in rows.schema.fields if f.name not in meta]
    top_id, top_lsn = rows.agg(F.max("id"), F.max(LSN)).collect()[0]
    chooser = random.Random(13)
    types = TableTypes()
    walls: dict[str, list[float]] = {"cdc": [], "plain": []}
    executions: dict[str, list[int]] = {"cdc": [], "plain": []}
    for turn in range(MERGES + 1):  # the first turn (left out) compiles and loads what later ones reuse
        lsn = top_lsn + 1 + turn
        updated = chooser.sample(range(1, int(top_id) + 1), BATCH_UPDATES)
        inserted = chooser.sample(range(1, int(top_id) + 1), BATCH_INSERTS)
        first_new = int(top_id) + 1 + turn * BATCH_INSERTS
        new_ids = F.element_at(F.array(*[F.lit(first_new + i) for i in range(BATCH_INSERTS)]), F.col("_n") + 1)
        source = spark.read.format("delta").load(table)
        updates = source.where(F.col("id").isin(updated)).withColumn("price", F.col("price") + 1).withColumn(OP, F.lit("u"))
        inserts = (
            source.where(F.col("id").isin(inserted))
            .withColumn("_n", F.row_number().over(Window.orderBy("id")) - 1)
            .withColumn("id", new_ids.cast("bigint"))
            .withColumn(KEY, F.to_json(F.struct("id")))
            .withColumn(OP, F.lit("c"))
            .drop("_n")
        )
        batch = (
            updates.unionByName(inserts)
            .withColumn(LSN, F.lit(lsn).cast("bigint"))
            .withColumn(SEQ, F.monotonically_increasing_id())
            .withColumn("_cdc_error", F.lit(None).cast("string"))
            .withColumn(UNCHANGED, F.array().cast("array<string>"))
            .localCheckpoint()
        )
        for form in ("cdc", "plain") if turn % 2 == 0 else ("plain", "cdc"):
            started = time.perf_counter()
            if form == "cdc":
                progress = Progress(position=f"{lsn:016X}")
                as_of = LogAsOf(LogLocation(), LogWatermark(progress.position, 0, {}))  # no log: the batch is made here
                step = TableStep(as_of, [], paths[form], columns=columns, progress=progress, whole_rows=True)
                merge_current(spark, step, batch, types=types)
            else:
                _upsert(spark, paths[form], batch.drop("_cdc_error", UNCHANGED))
            if turn:
                walls[form].append(time.perf_counter() - started)
                executions[form].append(_last_merge(spark, paths[form]).get("executionTimeMs", 0))
    print(
        f"MERGE forms: {MERGES} batches of {BATCH_UPDATES} updates and {BATCH_INSERTS} inserts into copies of "
        f"{rows.count():,} rows (median, after one more)"
    )
    for form, label in (("plain", "the documented upsert (anchor)"), ("cdc", "cdc sync's MERGE (LSN guard, SQL)")):
        wall, execution = statistics.median(walls[form]), statistics.median(executions[form]) / 1000
        ratio = wall / statistics.median(walls["plain"])
        print(f"  {label:<42}wall {wall:6.2f} s  Delta executionTimeMs {execution:6.2f} s  {ratio:5.2f}x")


def _upsert(spark: SparkSession, path: str, changed: DataFrame) -> None:
    """The Delta documentation's upsert, with deletes (the ``merge`` arm's MERGE)."""
    from delta.tables import DeltaTable

    (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(changed.alias("s"), "t._cdc_key = s._cdc_key")
        .whenMatchedDelete("s._cdc_op = 'd'")
        .whenMatchedUpdateAll("s._cdc_op <> 'd'")
        .whenNotMatchedInsertAll("s._cdc_op <> 'd'")
        .execute()
    )


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

    timed([cdc, "sync", "--once"], env)  # catch up with the other arms' changes
    bare = timed([sys.executable, "-c", BARE_START], env)
    small_change()
    cold = timed([cdc, "sync", "--once"], env)
    server, remote, server_start = start_server(cdc, env)
    try:
        attached_env = {**env, "CDC_SPARK_REMOTE": remote}
        attached = []
        for _ in range(2):
            small_change()
            attached.append(timed([cdc, "sync", "--once"], attached_env))
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    bare_again = timed([sys.executable, "-c", BARE_START], env)
    anchor = min(bare, bare_again)
    print(f"scheduled: bare Spark start (JVM + Delta, no work) {anchor:7.2f} s   (anchor; {bare:.2f} and {bare_again:.2f} s)")
    print(line("  cdc sync --once of 5 changed rows, cold", cold, anchor))
    print(f"  attached to a warm Spark (cdc spark-server, listening after {server_start:.2f} s):")
    print(line("  cdc sync --once of 5 changed rows, first", attached[0], anchor))
    print(line("  cdc sync --once of 5 changed rows, next", attached[1], anchor))
