"""Where a warm continuous step of the freshness workload spends its time, table by table and phase by phase.

Usage: python -m bench.views_step_phases [--conf KEY=VALUE]... [steps] [transactions_per_step] [rows]
(default 5 steps of 10 transactions, 100,000 products already in the view; ``--conf`` adds a Spark
setting, to measure a knob, for example ``spark.sql.files.maxRecordsPerFile=1000``)

The workload of ``bench.views_freshness update``: each transaction inserts 5 products and changes the
price of 5 existing ones. The warehouse keeps ``public.products``; its tables are created first (which
also warms Spark up). Then, per step: the transactions are committed, ``cdc capture --once`` puts them in
the log, and one ``cdc sync`` step (``runner.step``, in this process, as ``--continuous`` runs it) applies
them. Printed per step, beside the step's wall time (the anchor, measured in the same run):

- per view table: the newest commit's operation, Delta's own MERGE metrics (``executionTimeMs``,
  ``scanTimeMs``, ``rewriteTimeMs``; rows copied unchanged into new files; files removed and added);
- from Spark's event log: the time some job ran, the driver's time between jobs, jobs, tasks.

A step at 2 transactions/s sees about ``2 x`` its own duration of transactions, so ``10`` matches a
5 s step. Prints figures only; it asserts nothing.
"""

from __future__ import annotations

import random
import sys
import time

import psycopg

from bench.views_common import PRODUCTS_SQL, products_database
from bench.views_step_profile import conf_and_words, event_log_spark, events, summarize
from cdc.config import view_arguments
from cdc.run.coordinator import Capture
from derived_views.runs import runner
from derived_views.views import warehouse

#: Delta's MERGE metrics printed per table, in this order.
METRICS = (
    "executionTimeMs",
    "scanTimeMs",
    "rewriteTimeMs",
    "numTargetRowsCopied",
    "numTargetFilesRemoved",
    "numTargetFilesAdded",
)


def _newest_commit(path: str) -> str:
    """The newest commit's operation and its metrics, as one line."""
    from deltalake import DeltaTable

    table = DeltaTable(path)
    commit = table.history(1)[0]
    metrics = commit.get("operationMetrics") or {}
    shown = " ".join(f"{name}={metrics[name]}" for name in METRICS if name in metrics)
    return f"v{table.version()} {commit.get('operation')}: {shown} (files now {len(table.file_uris())})"


def main(steps: int, per_step: int, preload: int, conf: dict[str, str]) -> None:
    spark, directory = event_log_spark("cdc-bench-phases", conf)
    chooser = random.Random(7)
    windows: list[tuple[int, int, float]] = []
    with products_database(preload) as (_server, url, settings):
        Capture(settings, once=True).run()
        ctx = view_arguments.context_from_settings(settings, spark)
        runner.step(ctx, ["warehouse"])  # creates the tables and warms Spark up
        paths = {
            "current": warehouse.current_path(ctx, "public.products"),
            "history": warehouse.history_path(ctx, "public.products"),
        }
        written = preload
        lines: list[list[str]] = []
        with psycopg.connect(url, autocommit=True) as conn:
            for _ in range(steps):
                for _ in range(per_step):
                    with conn.transaction():
                        conn.execute(PRODUCTS_SQL, (written + 1, written + 5))
                        ids = [chooser.randint(1, preload) for _ in range(5)]
                        conn.execute("UPDATE products SET price = price + 1 WHERE id = ANY(%s)", (ids,))
                    written += 5
                Capture(settings, once=True).run()
                started_ms, started = int(time.time() * 1000), time.monotonic()
                report = runner.step(ctx, ["warehouse"])
                wall = time.monotonic() - started
                windows.append((started_ms, int(time.time() * 1000), wall))
                lines.append(
                    [f"events {report.events}"] + [f"  {label:<8} {_newest_commit(path)}" for label, path in paths.items()]
                )
    spark.stop()  # flushes the event log
    every = events(directory)
    print(f"rows={preload} transactions per step={per_step} steps={steps} conf={conf}")
    for number, ((start, end, wall), step_lines) in enumerate(zip(windows, lines, strict=True), 1):
        print(f"step {number}: {step_lines[0]}")
        for line in step_lines[1:]:
            print(line)
        inside = [event for event in every if start <= _time_of(event) <= end]
        for line in summarize(inside, wall)[:5]:
            print(f"  {line}")


def _time_of(event: dict[str, object]) -> int:
    """An event's time in ms since the epoch (job, stage, task and SQL events each name it differently)."""
    for name in ("Submission Time", "Completion Time", "time"):
        if isinstance(event.get(name), int):
            return int(event[name])  # type: ignore[call-overload]
    info = event.get("Task Info")
    if isinstance(info, dict) and isinstance(info.get("Finish Time"), int):
        return int(info["Finish Time"])
    stage = event.get("Stage Info")
    if isinstance(stage, dict) and isinstance(stage.get("Completion Time"), int):
        return int(stage["Completion Time"])
    return 0


if __name__ == "__main__":
    settings, words = conf_and_words(sys.argv[1:])
    numbers = [int(word) for word in words]
    steps, per_step, preload = numbers + [5, 10, 100_000][len(numbers) :]
    main(steps, per_step, preload, settings)
