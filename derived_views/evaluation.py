"""How Spark evaluates a step's queries: generated code for large batches, interpreted for small ones.

By default Spark compiles every query it runs to Java source and then to bytecode (whole-stage code
generation, and code generation of each expression). A sync step runs a few hundred small queries (event
parsing with one expression per column and schema version, MERGEs, state reads), most of them different,
so on a fresh process compiling them costs more than running them: profiled with Java Flight Recorder on
a demo step, code generation took 22% of the driver JVM's samples, and evaluating the same step without
it (``spark.sql.codegen.factoryMode=NO_CODEGEN``, Spark's interpreted evaluation, the path it falls back
to whenever generated code fails to compile) took 30-33 s instead of 37-38 s. Large batches are where
generated code pays off, so a table's work runs interpreted only when it applies at most
:data:`SMALL_BATCH_EVENTS` events; a rebuild, or a table far behind, keeps code generation.

Results are the same either way (both paths implement the same expressions); only speed differs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from derived_views.log_source import LogWatermark
from derived_views.progress import Progress

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: A table's work applying at most this many events is evaluated without generated code.
SMALL_BATCH_EVENTS = 20_000
_FACTORY_MODE = "spark.sql.codegen.factoryMode"
_WHOLE_STAGE = "spark.sql.codegen.wholeStage"


def pending_events(watermark: LogWatermark, topics: list[str], progress: Progress | None) -> int:
    """Events of ``topics`` up to ``watermark`` after ``progress`` (all of them when ``None``), from offsets alone."""
    return sum(max(0, end - (progress.next_offset(topic, partition) if progress else 0))
               for topic in topics for partition, end in watermark.offsets.get(topic, {}).items())


@contextmanager
def sized_for(spark: SparkSession, events: int) -> Iterator[None]:
    """Within the block, ``spark`` (this session only) evaluates interpreted when ``events`` is small."""
    if events > SMALL_BATCH_EVENTS:
        yield
        return
    saved = {key: spark.conf.get(key, None) for key in (_FACTORY_MODE, _WHOLE_STAGE)}
    spark.conf.set(_FACTORY_MODE, "NO_CODEGEN")
    spark.conf.set(_WHOLE_STAGE, "false")
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
