"""Which compilers the driver JVM of a run compiles Java code with: C1 alone for a short run.

HotSpot compiles hot methods twice by default. C1 compiles them quickly; C2 then compiles them again,
slowly, into faster code. A scheduled ``cdc sync --once`` of a small change lives tens of seconds,
and most of it is the first run of a few hundred different queries. On a small machine, C2's compiler
thread takes a core away from that work, and the code it builds rarely pays back before the process
ends. A long run is the opposite case: its hot loops run for minutes, and C2's code pays back many
times. Measured on 2 cores, each pair in the same run:

- the demo's change into every view, fresh process: 39-46 s with C1 alone, 50-66 s by default; a
  sync with nothing pending: 6.3-7.4 s against 7.2-9.5 s;
- a rebuild by replay of 300,000 products: 18.0 s with C1 alone, 10.8 s by default; the test suite's
  long-lived Spark session (two view test modules): 466 s against 336 s.

So only a one-shot run whose work is small starts its driver with C1 alone (``-XX:TieredStopAtLevel=1``).
Small is the rule of :mod:`derived_views.evaluation`: at most :data:`~derived_views.evaluation.SMALL_BATCH_EVENTS`
events pending, and view tables small on local disk. ``--continuous``, ``cdc spark-server``,
``cdc rebuild``, a large backlog, large tables, a log in Kafka, and a driver started by ``spark-submit``
keep the JVM's default. Results are the same either way. Only speed differs.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from derived_views.evaluation import SMALL_BATCH_EVENTS, pending_events, small_tables
from derived_views.log_location import LogLocation
from derived_views.log_source import read_watermark
from derived_views.progress import Progress, min_offsets
from derived_views.status import delta_tables, table_progress

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: The Java options of a driver that compiles with C1 alone. Without tiered compilation the JVM reserves
#: 48 MB for compiled code instead of 240 MB, and the demo's change into every view has filled 48 MB:
#: the JVM then stopped compiling, and died when it next needed room for an adapter. So the tiered
#: default size is kept.
C1_ONLY = ("-XX:TieredStopAtLevel=1", "-XX:ReservedCodeCacheSize=240m")

log = logging.getLogger("cdc.views")


def pending_everywhere(location: LogLocation, tables: list[Path], prefix: str) -> int | None:
    """Events of the source tables' topics (``prefix``) up to the log's latest watermark not yet applied
    by the view table furthest behind on each log partition, over the Delta ``tables`` (every event of a
    topic no table has applied yet); ``None`` when the log cannot be read here (the run itself then says why)."""
    try:
        watermark = read_watermark(location)
    except Exception as exc:  # noqa: BLE001 - only a hint: the run reports what is wrong with the log
        log.debug("no estimate of the pending work: %s", exc)
        return None
    if watermark is None:
        return 0
    progresses = [progress for progress in map(_quiet_progress, tables) if progress is not None]
    pending = 0
    for topic in watermark.offsets:
        if topic.startswith(f"{prefix}.__"):
            continue  # the log's own topics (the schemas, the snapshot ledger): no view applies them
        applying = [progress for progress in progresses if topic in progress.offsets]
        pending += pending_events(watermark, [topic], Progress(min_offsets(applying, [topic])))
    return pending


def _quiet_progress(table: Path) -> Progress | None:
    """The table's progress; ``None`` for a table that cannot be read (its own step reports it)."""
    try:
        return table_progress(table)
    except Exception:  # noqa: BLE001 - deltalake raises its own error kinds for a damaged log
        return None


def short_run(location: LogLocation, views_dir: Path, prefix: str) -> bool:
    """Whether a one-shot run over the log at ``location`` (topics named with ``prefix``) into the views
    under ``views_dir`` is small enough to compile with C1 alone (see the module docstring)."""
    if location.kafka is not None:
        return False
    tables = delta_tables(views_dir)
    pending = pending_everywhere(location, tables, prefix)
    return pending is not None and pending <= SMALL_BATCH_EVENTS and small_tables(str(table) for table in tables)


def driver_compilers(spark: SparkSession) -> str:
    """The compilers ``spark``'s driver JVM runs with, as its own arguments say: ``C1`` or ``C1+C2``."""
    runtime = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()  # type: ignore[union-attr]
    return "C1" if C1_ONLY[0] in list(runtime.getInputArguments()) else "C1+C2"
