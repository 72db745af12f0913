"""Incremental sync vs full refresh, and rebuild by replay vs a full JDBC re-snapshot, in one run.

Usage: python bench/views_sync.py [rows]   (default 1,000,000)

The reference schema's ``products`` table (long description text, numeric price, jsonb attributes,
text[] tags) with ``rows`` rows is captured into the log and synced into the warehouse's current-state
table. Then 1% of the rows are updated and captured, twice, and two figures are taken side by side:

- incremental sync of those changes (read log range, reduce, MERGE) vs a full refresh (Spark JDBC read
  of the whole source table + Delta overwrite) — target: incremental at least 10x faster. The anchor is
  timed on its second run (its first one warms the JDBC path up), and so is the incremental sync: its
  first run in the process (a cold JVM: the MERGE code is loaded and compiled) is printed too;
- rebuild by replay of the compacted log (one Delta overwrite) vs the same full JDBC re-snapshot —
  target: rebuild no slower.
"""

from __future__ import annotations

import sys

import psycopg

from bench.capture_common import timed
from bench.views_common import bench_spark, full_refresh, products_database, sync_current
from cdc.config import view_arguments
from cdc.run.coordinator import Capture
from derived_views.views import warehouse
from log_store import LogStore


def main(rows: int) -> None:
    spark = bench_spark()
    with products_database(rows) as (_server, url, settings):
        with timed() as capture_s:
            Capture(settings, once=True).run()
        ctx = view_arguments.context_from_settings(settings, spark)
        with timed() as initial:
            sync_current(ctx, "public.products")
        changed = max(1, rows // 100)
        incremental: list[list[float]] = []
        for remainder in (7, 8):  # the first MERGE of the process runs on a cold JVM; the second is steady
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(f"UPDATE products SET price = price + 1, name = name || '+' WHERE id % 100 = {remainder}")
            Capture(settings, once=True).run()
            with timed() as elapsed:
                sync_current(ctx, "public.products")
            incremental.append(elapsed)
        refresh_path = str(settings.data_dir / "full_refresh" / "public.products")
        full_refresh(spark, url, "public.products", refresh_path, rows)  # warm-up: the JDBC path's first run
        with timed() as refresh:
            full_refresh(spark, url, "public.products", refresh_path, rows)
        with LogStore.open(settings.log_dir, settings.log_config(), writer=True) as log:
            log.roll()
            log.compact()
        with timed() as rebuild:
            sync_current(ctx, "public.products", replace=True)
        count = spark.read.format("delta").load(warehouse.current_path(ctx, "public.products")).count()
        assert count == rows, count

    print(f"rows={rows} changed={changed} (capture of the snapshot: {capture_s[0]:.1f} s, first sync: {initial[0]:.1f} s)")
    cold, warm = incremental[0][0], incremental[1][0]
    print(f"incremental sync of 1%, first in process (cold JVM): {cold:8.2f} s   -> {refresh[0] / cold:.1f}x faster")
    print(f"incremental sync of 1%, next (warm, like the anchor): {warm:8.2f} s")
    print(
        f"full refresh (JDBC+overwrite, after a warm-up run) : {refresh[0]:8.2f} s   "
        f"-> incremental is {refresh[0] / warm:.1f}x faster (target >= 10x)"
    )
    print(f"rebuild by replay           : {rebuild[0]:8.2f} s")
    print(
        f"full JDBC re-snapshot       : {refresh[0]:8.2f} s   "
        f"-> rebuild/re-snapshot = {rebuild[0] / refresh[0]:.2f} (target <= 1.0)"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000)
