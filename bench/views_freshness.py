"""Freshness in continuous mode: commit-to-visible latency at a steady write rate, per view table.

Usage: python -m bench.views_freshness [seconds] [transactions_per_second] [rows] [insert|update] [--all-views]
(default 60 s, 2 tx/s, 100,000 products already in the view, insert; ``--all-views``: beside the
warehouse, a search index and a cache entity over the products, all synced by the one continuous loop)

Capture streams into the log and ``cdc sync --continuous`` (in-process: ``warehouse``, or every view)
applies it while a writer commits one transaction at a steady rate (the reference schema's ``products``
table, rows shaped as in ``migrations/sample_data.py``): with ``insert`` it inserts 10 products (batches
of new keys are appended), with ``update`` it inserts 5 and changes the price of 5 existing ones (every
batch is then merged). A transaction is *visible* in a view table at the first Delta commit of that
table whose recorded progress (promise 5: the watermark in the commit) is at or past its commit LSN;
its latency there is that commit's time minus the source commit time (``_cdc_commit_ts``). Every table
below holds every transaction (each one inserts products), so each table's figures cover all of them.
Printed beside the targets: p50 <= 3 s and p99 <= 6 s for the warehouse's current table, p99 <= 10 s
for every view table.
"""

from __future__ import annotations

import bisect
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg

from bench.views_common import PRODUCTS_SQL, bench_spark, products_database
from cdc.config import view_arguments
from cdc.run.coordinator import Capture
from derived_views.engine.commit_progress import committed_progress
from derived_views.engine.progress import Progress
from derived_views.runs import runner
from derived_views.views import warehouse

#: The views of ``--all-views``: the warehouse, a search index joining the category, a cache entity.
ALL_VIEWS = """
[warehouse]
tables = ["public.products", "public.categories"]

[search.products]
root = "public.products"
text = ["name", "description", "tags", "category_name"]
stored = ["name", "category_name", "price"]

[search.products.joins.category]
table = "public.categories"
on = "category_id"
columns = { category_name = "name" }

[cache.product]
root = "public.products"
"""


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _commits(path: str) -> tuple[list[int], list[float]]:
    """The table's commits that record progress, in order: their as-of LSNs and commit times (s)."""
    from deltalake import DeltaTable

    marks: list[tuple[int, float]] = []
    for commit in DeltaTable(path).history():
        progress = Progress.from_json(commit.get("userMetadata"))
        if progress is not None and progress.position:
            marks.append((progress.lsn, commit["timestamp"] / 1000))
    marks.sort()
    return [lsn for lsn, _ in marks], [ts for _, ts in marks]


def _latencies(path: str, transactions: list[tuple[int, float]]) -> list[float]:
    """Commit-to-visible seconds in the table at ``path`` of each (commit LSN, commit time) transaction."""
    lsns, times = _commits(path)
    found = []
    for lsn, committed in transactions:
        index = bisect.bisect_left(lsns, lsn)
        if index < len(lsns):
            found.append(min(times[index:]) - committed)
    return found


def main(seconds: float, rate: float, preload: int, workload: str = "insert", all_views: bool = False) -> None:
    spark = bench_spark()
    tables = "public.products,public.categories" if all_views else "public.products"
    views_file = None
    if all_views:
        views_file = Path(tempfile.mkdtemp(prefix="cdc-bench-freshness-")) / "views.toml"
        views_file.write_text(ALL_VIEWS)
    with products_database(preload, tables=tables, views_file=views_file) as (_server, url, settings):
        Capture(settings, once=True).run()
        ctx = view_arguments.context_from_settings(settings, spark)
        names = runner.resolve([], ctx.definitions) if all_views else ["warehouse"]
        runner.step(ctx, names)  # creates the tables (and warms Spark up)
        stop = threading.Event()
        capture = threading.Thread(target=lambda: Capture(settings, stop=stop).run(), daemon=True)
        views = threading.Thread(target=lambda: runner.continuous(ctx, names, 0.1, should_stop=stop.is_set), daemon=True)
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
        paths = {
            "warehouse current": warehouse.current_path(ctx, "public.products"),
            "warehouse history": warehouse.history_path(ctx, "public.products"),
        }
        if all_views:
            paths.update(
                {
                    "search documents": ctx.path("search", "products", "documents"),
                    "search terms": ctx.path("search", "products", "terms"),
                    "cache entries": ctx.path("cache", "product", "entries"),
                }
            )
        deadline = time.monotonic() + 120
        current = paths["warehouse current"]
        while time.monotonic() < deadline:  # poll until the last transaction is in the warehouse
            if spark.read.format("delta").load(current).count() >= preload + written:
                break
            time.sleep(0.5)
        last_lsn = spark.read.format("delta").load(current).agg({"_cdc_lsn": "max"}).first()[0]
        while time.monotonic() < deadline:  # ... and in every other table
            if all((committed_progress(path) or Progress()).lsn >= last_lsn for path in paths.values()):
                break
            time.sleep(0.5)
        stop.set()
        views.join(timeout=120)
        capture.join(timeout=60)
        rows = (
            spark.read.format("delta")
            .load(paths["warehouse current"])
            .filter(f"id > {preload}")
            .groupBy("_cdc_lsn")
            .agg({"_cdc_commit_ts": "max"})
            .collect()
        )
        transactions = [(row["_cdc_lsn"], row["max(_cdc_commit_ts)"].timestamp()) for row in rows]
        visible = {label: _latencies(path, transactions) for label, path in paths.items()}
    print(
        f"workload={workload} transactions={len(transactions)} products inserted={written} preloaded={preload} "
        f"rate={rate:g} tx/s duration={seconds:g} s views={','.join(names)}"
    )
    for label, latencies in visible.items():
        if len(latencies) < len(transactions):
            print(f"{label:<18} only {len(latencies)} of {len(transactions)} transactions visible")
            continue
        target = "targets p50 <= 3 s, p99 <= 6 s" if label == "warehouse current" else "target p99 <= 10 s"
        print(
            f"{label:<18} commit-to-visible p50 {_percentile(latencies, 0.5):6.2f} s  p99 "
            f"{_percentile(latencies, 0.99):6.2f} s  mean {statistics.mean(latencies):5.2f} s  max "
            f"{max(latencies):5.2f} s   ({target})"
        )


if __name__ == "__main__":
    positional = [a for a in sys.argv[1:] if not a.startswith("--")]
    main(
        float(positional[0]) if len(positional) > 0 else 60.0,
        float(positional[1]) if len(positional) > 1 else 2.0,
        int(positional[2]) if len(positional) > 2 else 100_000,
        positional[3] if len(positional) > 3 else "insert",
        "--all-views" in sys.argv[1:],
    )
