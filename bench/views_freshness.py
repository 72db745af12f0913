"""Freshness in continuous mode: commit-to-visible latency at a steady write rate.

Usage: python bench/views_freshness.py [seconds] [transactions_per_second] [rows] [insert|update]
(default 60 s, 2 tx/s, 100,000 products already in the view, insert)

Capture streams into the log and ``cdc sync warehouse --continuous`` (in-process) applies it while a
writer commits one transaction at a steady rate (the reference schema's ``products`` table, rows shaped
as in ``migrations/sample_data.py``): with ``insert`` it inserts 10 products (batches of new keys are
appended), with ``update`` it inserts 5 and changes the price of 5 existing ones (every batch is then
merged). A transaction is *visible* once a sync
step whose watermark is at or past its commit LSN has committed to Delta; its latency is that moment
minus the source commit time (``_cdc_commit_ts``). Printed beside the targets: p50 <= 2 s, p99 <= 5 s.
"""

from __future__ import annotations

import bisect
import random
import statistics
import sys
import threading
import time

import psycopg

from bench.views_common import PRODUCTS_SQL, bench_spark, products_database
from cdc.coordinator import Capture
from derived_views import runner, warehouse
from derived_views.runner import StepReport


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main(seconds: float, rate: float, preload: int, workload: str = "insert") -> None:
    spark = bench_spark()
    with products_database(preload) as (_server, url, settings):
        Capture(settings, once=True).run()
        ctx = runner.context_from_settings(settings, spark)
        runner.step(ctx, ["warehouse"])  # creates the tables (and warms Spark up)
        stop = threading.Event()
        steps: list[tuple[int, float]] = []

        def record(report: StepReport) -> None:
            if report.watermark is not None:
                steps.append((report.watermark.lsn, time.time()))

        capture = threading.Thread(target=lambda: Capture(settings, stop=stop).run(), daemon=True)
        views = threading.Thread(
            target=lambda: runner.continuous(ctx, ["warehouse"], 0.1, should_stop=stop.is_set, on_step=record),
            daemon=True,
        )
        capture.start()
        views.start()
        written = 0
        per_tx = 10 if workload == "insert" else 5
        chooser = random.Random(7)
        with psycopg.connect(url, autocommit=True) as conn:
            start = time.monotonic()
            while time.monotonic() - start < seconds:
                with conn.transaction():
                    conn.execute(PRODUCTS_SQL, (preload + written + 1, preload + written + per_tx))
                    if workload == "update":
                        ids = [chooser.randint(1, preload) for _ in range(5)]
                        conn.execute("UPDATE products SET price = price + 1 WHERE id = ANY(%s)", (ids,))
                written += per_tx
                time.sleep(max(0.0, start + written / per_tx / rate - time.monotonic()))
        deadline = time.monotonic() + 60
        path = warehouse.current_path(ctx, "public.products")
        while time.monotonic() < deadline:  # poll until the last transaction is visible
            if spark.read.format("delta").load(path).count() >= preload + written:
                break
            time.sleep(0.5)
        stop.set()
        views.join(timeout=120)
        capture.join(timeout=60)
        rows = spark.read.format("delta").load(path).filter(f"id > {preload}").groupBy("_cdc_lsn").agg({"_cdc_commit_ts": "max"}).collect()
    lsns = [lsn for lsn, _ in steps]
    latencies = []
    for row in rows:
        index = bisect.bisect_left(lsns, row["_cdc_lsn"])
        if index < len(steps):
            latencies.append(steps[index][1] - row["max(_cdc_commit_ts)"].timestamp())
    print(f"workload={workload} transactions={len(rows)} products inserted={written} preloaded={preload} "
          f"rate={rate:g} tx/s duration={seconds:g} s sync steps={len(steps)}")
    print(f"commit-to-visible p50: {_percentile(latencies, 0.5):6.2f} s   (target <= 2 s)")
    print(f"commit-to-visible p99: {_percentile(latencies, 0.99):6.2f} s   (target <= 5 s)")
    print(f"mean {statistics.mean(latencies):.2f} s, max {max(latencies):.2f} s")


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 60.0, float(sys.argv[2]) if len(sys.argv) > 2 else 2.0,
         int(sys.argv[3]) if len(sys.argv) > 3 else 100_000, sys.argv[4] if len(sys.argv) > 4 else "insert")
