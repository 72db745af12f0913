"""What a history table's MERGE reads and rewrites as its history grows, by the table's layout.

Usage: python -m bench.history_layout [keys] [versions] [changes] [merges]
(default 300,000 keys, each with 6 versions (5 ended, 1 current), 1,000 changed keys a MERGE, 4 MERGEs)

Two copies of one history table, as :mod:`derived_views.write.scd2` keeps it: partitioned by
:data:`~derived_views.write.scd2.HISTORY_PARTITIONS` (the layout) and in one partition (the anchor, the
layout before it). Each MERGE ends the current version of ``changes`` scattered keys and inserts their new
version, with the history MERGE's condition (``t._cdc_key = s._merge_key AND t._cdc_is_current``). Printed
per MERGE and layout: wall time, rows copied, bytes written; then the layout's median time as a ratio of
the anchor's. The anchor copies every row of the files it touches, ended versions with the current ones,
so its cost grows with the history; the layout copies the current partition alone.

Prints figures only; it asserts nothing.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from derived_views.engine.delta_sql import create_if_missing, table_ref
from derived_views.write.scd2 import HISTORY_PARTITIONS

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DDL = "_cdc_key bigint, payload string, _cdc_valid_from_lsn bigint, _cdc_valid_to_lsn bigint, _cdc_is_current boolean"
METRICS = ("numTargetRowsCopied", "numTargetRowsUpdated", "numTargetBytesAdded")


def build(spark: SparkSession, path: str, partitioned: bool, keys: int, versions: int) -> None:
    """A history of ``versions`` versions of each of ``keys`` keys, the newest current, in 8 files."""
    create_if_missing(spark, path, DDL, HISTORY_PARTITIONS if partitioned else ())
    rows = spark.range(0, keys * versions).selectExpr(
        f"pmod(id, {keys}) AS _cdc_key",
        "repeat('x', 60) AS payload",
        f"id div {keys} AS _cdc_valid_from_lsn",
        f"CASE WHEN id div {keys} = {versions - 1} THEN NULL ELSE id div {keys} + 1 END AS _cdc_valid_to_lsn",
        f"id div {keys} = {versions - 1} AS _cdc_is_current",
    )
    rows.repartition(8).write.format("delta").mode("append").save(path)


def merge(spark: SparkSession, path: str, keys: int, changes: int, lsn: int) -> tuple[float, dict[str, int]]:
    """End ``changes`` scattered keys' current versions at ``lsn`` and insert their new ones; the time
    and Delta's metrics of the MERGE."""
    changed = spark.range(0, changes).selectExpr(f"pmod(id * 7919 + {lsn * 13}, {keys}) AS k").distinct()
    staged = changed.selectExpr(
        "k AS _merge_key", "k AS _cdc_key", "'y' AS payload", f"{lsn} AS _cdc_valid_from_lsn"
    ).unionByName(
        changed.selectExpr(
            "CAST(NULL AS bigint) AS _merge_key", "k AS _cdc_key", "'y' AS payload", f"{lsn} AS _cdc_valid_from_lsn"
        )
    )
    staged.createOrReplaceTempView("staged")
    started = time.perf_counter()
    spark.sql(
        f"MERGE INTO {table_ref(path)} t USING staged s ON t._cdc_key = s._merge_key AND t._cdc_is_current "
        "WHEN MATCHED THEN UPDATE SET _cdc_valid_to_lsn = s._cdc_valid_from_lsn, _cdc_is_current = false "
        "WHEN NOT MATCHED AND s._merge_key IS NULL THEN INSERT "
        "(_cdc_key, payload, _cdc_valid_from_lsn, _cdc_valid_to_lsn, _cdc_is_current) "
        "VALUES (s._cdc_key, s.payload, s._cdc_valid_from_lsn, NULL, true)"
    ).collect()
    took = time.perf_counter() - started
    newest = spark.sql(f"DESCRIBE HISTORY {table_ref(path)} LIMIT 1").first()
    assert newest is not None
    return took, {name: int(newest["operationMetrics"][name]) for name in METRICS}


def main(keys: int, versions: int, changes: int, merges: int) -> None:
    from derived_views.engine.spark_session import build_spark

    spark = build_spark("history-layout", master="local[2]")
    spark.conf.set("spark.databricks.delta.merge.materializeSource", "none")
    root = Path(tempfile.mkdtemp(prefix="history-layout-"))
    print(f"{keys:,} keys x {versions} versions ({keys * versions:,} rows), {changes:,} changed keys a MERGE")
    times: dict[str, list[float]] = {}
    try:
        for label, partitioned in (("one partition (anchor)", False), ("partitioned by is-current", True)):
            path = str(root / label.split()[0])
            build(spark, path, partitioned, keys, versions)
            times[label] = []
            for number in range(merges):
                took, metrics = merge(spark, path, keys, changes, versions + number)
                times[label].append(took)
                print(f"{label:26} merge {number + 1}: {took:6.2f} s  " + "  ".join(f"{k} {v:,}" for k, v in metrics.items()))
        anchor, layout = (statistics.median(values[1:] or values) for values in times.values())
        print(f"median MERGE (first left out): partitioned {layout:.2f} s, anchor {anchor:.2f} s, ratio {layout / anchor:.2f}")
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    numbers = [int(a) for a in sys.argv[1:]]
    main(*(numbers + [300_000, 6, 1_000, 4][len(numbers) :]))
