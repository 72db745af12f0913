"""A sync step of 1M pending events within the default 2 GB driver: whether it completes, and its peak memory.

Usage: python -m bench.views_memory [--rows N]   (default 1,000,000)

The reference schema's ``products`` table (the widest of its tables: a 40-word description, numeric
price, jsonb attributes, text[] tags) with N rows is captured into the log, and the warehouse view
(its current and history tables, as ``cdc sync --once`` keeps them without a views file) is synced in
ONE step (:func:`derived_views.runs.runner.step`) by the project's default session
(:func:`cdc.config.view_arguments.context_from_settings`: ``local[2]``, ``spark.driver.memory=2g``), twice:

1. the snapshot: N ``r`` events into tables that do not exist yet (each table is written by one overwrite);
2. every row updated in one source transaction: N ``u`` events into the N-row tables. This is the step
   that stresses the sync path most, and the figure: each table's pending batch is checkpointed in the
   driver (Spark runs ``local``: the block manager, the shuffles and every task live in the driver JVM)
   while its MERGE joins it with all N rows of the table and rewrites every file (the history table
   joins 2N staged rows: a close row per key and a version row per event), and both tables are
   applied side by side. The snapshot step reads and writes as many events, with no join. The widest
   table makes each pending event weigh the most.

Measured for each step (from a reset at its start), beside the 2 GB limit:

- whether it completed (every table applied, the row counts right) or the error;
- the driver JVM's heap, through its management beans polled every 50 ms: the figure is the peak of the
  heap in use right after a collection (``GcInfo.getMemoryUsageAfterGc`` of each collection: what
  survived it, plus old-generation garbage a concurrent cycle has not reclaimed yet, so an upper bound of
  the data the step held); beside it the peak heap used at any moment (garbage included: it fills the
  heap up to what the collector lets it, so it says little of the need), the old generation's own peak,
  the heap committed, and the collections, young and full (a full collection means the heap ran short),
  with their pause time. Spark sizes its caches and shuffle buffers from the heap (``spark.memory.fraction``)
  and spills beyond, so a full heap is not a failure by itself: completing is the test;
- the driver JVM process's peak RSS (``VmHWM`` of the java child, reset through ``/proc/<pid>/clear_refs``:
  heap committed plus metaspace, code, threads and direct buffers);
- this Python process's peak RSS (``VmHWM``, reset the same way), and the Python workers' (the
  ``cdclog`` reads of a batch over 100,000 events): the largest one's peak RSS and the peak of their RSS
  summed (shared pages counted in each).

``--driver-memory`` runs the same steps with another ``spark.driver.memory``, to show the headroom.
Prints figures, asserts only row counts.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import psycopg

from bench.capture_common import timed
from bench.views_common import load_average, products_database
from cdc.run.coordinator import Capture

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from derived_views.write.context import ViewContext

MB = 1 << 20
POLL_S = 0.05


def _status_kb(pid: int, field: str) -> int:
    """A ``kB`` field of ``/proc/<pid>/status`` (0 once the process is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _reset_peak_rss(pid: int) -> None:
    """Reset the process's ``VmHWM`` to its current RSS (Linux ``clear_refs``, value 5)."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:  # gone meanwhile
        pass


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from ``/proc/*/stat``)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _is_full(collector: str) -> bool:
    """Whether the collector named so collects the whole heap (G1's and the serial/parallel collectors' old
    generation collections)."""
    return "Old" in collector or collector in ("MarkSweepCompact", "PS MarkSweep")


class DriverMemory:
    """Peak memory of the driver JVM, this process and the Python workers during a ``with`` block."""

    def __init__(self, spark: SparkSession) -> None:
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        factory = jvm.java.lang.management.ManagementFactory
        self._memory = factory.getMemoryMXBean()
        self._pools = [pool for pool in factory.getMemoryPoolMXBeans() if pool.getType().toString() == "Heap memory"]
        self._heap_pool_names = [pool.getName() for pool in self._pools]
        self._collectors = list(factory.getGarbageCollectorMXBeans())
        self.java_pid = int(jvm.java.lang.ProcessHandle.current().pid())
        self.max_heap_mb = self._memory.getHeapMemoryUsage().getMax() / MB
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.figures: dict[str, Any] = {}

    def _collections(self) -> dict[str, tuple[int, int]]:
        return {c.getName(): (int(c.getCollectionCount()), int(c.getCollectionTime())) for c in self._collectors}

    def _after_collections(self, seen: dict[str, int]) -> None:
        """Record the heap used right after the newest collection of each collector that collected since
        the last call (``seen``: collection count per collector): the peak after a young (or mixed)
        collection, and after a full one."""
        for collector in self._collectors:
            name = collector.getName()
            count = int(collector.getCollectionCount())
            if count == seen.get(name, 0):
                continue
            seen[name] = count
            info = collector.getLastGcInfo()
            if info is None:
                continue
            after = info.getMemoryUsageAfterGc()
            used = sum(after.get(pool).getUsed() for pool in self._heap_pool_names) / MB
            key = "after_full_mb" if _is_full(name) else "after_gc_mb"
            self.figures[key] = max(self.figures[key], used)

    def _poll(self) -> None:
        workers_at = 0.0
        seen = {name: count for name, (count, _) in self._before.items()}
        while not self._stop.is_set():
            try:
                usage = self._memory.getHeapMemoryUsage()
                self.figures["heap_used_mb"] = max(self.figures["heap_used_mb"], usage.getUsed() / MB)
                self.figures["committed_mb"] = max(self.figures["committed_mb"], usage.getCommitted() / MB)
                self._after_collections(seen)
            except Exception:  # noqa: BLE001 - the JVM may be gone; the step reports why
                return
            if time.monotonic() >= workers_at:
                workers_at = time.monotonic() + 0.5
                rss = {pid: _status_kb(pid, "VmRSS") for pid in _descendants(self.java_pid)}
                for pid in rss:
                    self._worker_peak[pid] = max(self._worker_peak.get(pid, 0), _status_kb(pid, "VmHWM"))
                self.figures["workers_sum_mb"] = max(self.figures["workers_sum_mb"], sum(rss.values()) / 1024)
            self._stop.wait(POLL_S)

    def __enter__(self) -> DriverMemory:
        for pool in self._pools:
            pool.resetPeakUsage()
        for pid in (os.getpid(), self.java_pid, *_descendants(self.java_pid)):
            _reset_peak_rss(pid)
        self._worker_peak: dict[int, int] = {}
        self._before = self._collections()
        self.figures = {"heap_used_mb": 0.0, "committed_mb": 0.0, "after_gc_mb": 0.0, "after_full_mb": 0.0, "workers_sum_mb": 0.0}
        self._thread = threading.Thread(target=self._poll, name="heap-poll", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()
        figures = self.figures
        figures["python_peak_mb"] = _status_kb(os.getpid(), "VmHWM") / 1024
        figures["workers_max_mb"] = max(self._worker_peak.values(), default=0) / 1024
        figures["java_rss_mb"] = _status_kb(self.java_pid, "VmHWM") / 1024
        try:
            peaks = {pool.getName(): pool.getPeakUsage().getUsed() / MB for pool in self._pools}
            after = self._collections()
        except Exception:  # noqa: BLE001 - the JVM is gone
            return
        figures["old_peak_mb"] = sum(v for name, v in peaks.items() if "Old" in name or "Tenured" in name)
        counts = {n: after[n][0] - self._before.get(n, (0, 0))[0] for n in after}
        figures["young"] = sum(count for n, count in counts.items() if not _is_full(n))
        figures["full"] = sum(count for n, count in counts.items() if _is_full(n))
        figures["gc_s"] = sum(after[n][1] - self._before.get(n, (0, 0))[1] for n in after) / 1000


def _step(ctx: ViewContext, label: str, rows: int, history_rows: int) -> tuple[str, float, int, str, dict[str, Any]]:
    """One sync step of the warehouse, its memory measured: (label, seconds, events its tables applied,
    outcome, figures); a completed step must leave ``rows`` current rows and ``history_rows`` versions."""
    from derived_views.runs import runner
    from derived_views.views import warehouse

    outcome = "completed"
    events = 0
    with timed() as elapsed, DriverMemory(ctx.spark) as memory:
        try:
            report = runner.step(ctx, ["warehouse"])
            events = sum(report.events.values())
            if report.failures:
                outcome = "FAILED: " + "; ".join(f"{f.table}: {f.error}" for f in report.failures)
        except Exception as exc:  # noqa: BLE001 - a figure: the step did not complete
            outcome = f"FAILED: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
    if outcome == "completed":
        for path, expected in (
            (warehouse.current_path(ctx, "public.products"), rows),
            (warehouse.history_path(ctx, "public.products"), history_rows),
        ):
            count = ctx.spark.read.format("delta").load(path).count()
            assert count == expected, (path, count, expected)
    return label, elapsed[0], events, f"{outcome}; {load_average()}", {**memory.figures, "max_heap_mb": memory.max_heap_mb}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="products (and events per step), default 1,000,000")
    parser.add_argument(
        "--driver-memory", default=None, help="spark.driver.memory instead of the project's default (2g), e.g. 1g"
    )
    args = parser.parse_args()
    from cdc.config import view_arguments
    from derived_views.engine.spark_session import build_spark

    started = time.perf_counter()
    print(f"start: {load_average()}", flush=True)
    results = []
    with products_database(args.rows) as (_server, url, settings):
        with timed() as snapshot:
            Capture(settings, once=True).run()
        # the project's default session (spark.driver.memory=2g) unless --driver-memory says otherwise
        spark = build_spark("cdc-views", conf={"spark.driver.memory": args.driver_memory}) if args.driver_memory else None
        ctx = view_arguments.context_from_settings(settings, spark)
        conf = ctx.spark.sparkContext.getConf()
        session = f"master {conf.get('spark.master')}, spark.driver.memory={conf.get('spark.driver.memory')}"
        print(f"products filled and captured (snapshot {snapshot[0]:.1f} s); {load_average()}", flush=True)
        results.append(_step(ctx, "1. snapshot into new tables", args.rows, args.rows))
        print(f"{results[-1][0]}: {results[-1][1]:.1f} s, {results[-1][3]}", flush=True)
        with psycopg.connect(url) as conn:
            updated = conn.execute("UPDATE products SET price = price + 1, name = name || '+'").rowcount
        with timed() as captured:
            Capture(settings, once=True).run()
        print(f"{updated:,} rows updated in one transaction, captured in {captured[0]:.1f} s", flush=True)
        results.append(_step(ctx, "2. every row updated, into the tables", args.rows, 2 * args.rows))
        print(f"{results[-1][0]}: {results[-1][1]:.1f} s, {results[-1][3]}", flush=True)
        ctx.spark.stop()

    print(
        f"rows={args.rows:,} products (warehouse: current + history tables); session: {session}; "
        f"wall time {(time.perf_counter() - started) / 60:.1f} min"
    )
    for label, seconds, events, outcome, f in results:
        print(
            f"{label}: {args.rows:,} pending events in one step ({events:,} applied: current + history), "
            f"{seconds:.1f} s: {outcome}"
        )
        if "young" not in f:
            print("  (the driver JVM did not answer after the step)")
            continue
        limit = f["max_heap_mb"]
        print(
            f"  driver JVM heap after collections, peak: {f['after_gc_mb']:7.0f} MB of {limit:.0f} MB (-Xmx) "
            f"-> {f['after_gc_mb'] / limit:.2f} of the limit"
        )
        print(
            f"  driver JVM heap used at any moment    : {f['heap_used_mb']:7.0f} MB (garbage included); old gen peak "
            f"{f['old_peak_mb']:.0f} MB; committed at most {f['committed_mb']:.0f} MB"
        )
        full = f" (heap right after, at most {f['after_full_mb']:.0f} MB: the live data then)" if f["full"] else ""
        print(
            f"  collections                           : {f['young']} young, {f['full']} full{full}, {f['gc_s']:.1f} s of pauses"
        )
        print(f"  driver JVM process, peak RSS          : {f['java_rss_mb']:7.0f} MB")
        print(f"  Python driver process, peak RSS       : {f['python_peak_mb']:7.0f} MB")
        print(f"  Python workers, peak RSS largest / sum: {f['workers_max_mb']:7.0f} MB / {f['workers_sum_mb']:.0f} MB")


if __name__ == "__main__":
    main()
