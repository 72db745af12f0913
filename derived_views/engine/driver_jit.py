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
Small is the rule of :mod:`derived_views.engine.evaluation`: at most :data:`~derived_views.engine.evaluation.SMALL_BATCH_EVENTS`
events pending, and view tables small on local disk. ``--continuous``, ``cdc spark-server``,
``cdc rebuild``, a large backlog, large tables, a log in Kafka, and a driver started by ``spark-submit``
keep the JVM's default. Results are the same either way. Only speed differs. Whether a run is small is
decided above the engine, from the log and the views (:mod:`derived_views.runs.short_run`); the engine
only starts the driver with :data:`C1_ONLY` when told to (``build_spark(short_run=True)``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: The Java options of a driver that compiles with C1 alone. Without tiered compilation the JVM reserves
#: 48 MB for compiled code instead of 240 MB, and the demo's change into every view has filled 48 MB:
#: the JVM then stopped compiling, and died when it next needed room for an adapter. So the tiered
#: default size is kept.
C1_ONLY = ("-XX:TieredStopAtLevel=1", "-XX:ReservedCodeCacheSize=240m")


def driver_compilers(spark: SparkSession) -> str:
    """The compilers ``spark``'s driver JVM runs with, as its own arguments say: ``C1`` or ``C1+C2``."""
    runtime = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()  # type: ignore[union-attr]
    return "C1" if C1_ONLY[0] in list(runtime.getInputArguments()) else "C1+C2"
