"""How Spark evaluates a step's queries: generated code by default, interpreted for small work.

By default Spark compiles every query it runs to Java source and then to bytecode (whole-stage code
generation, and code generation of each expression). A sync step runs a few hundred small queries (event
parsing with one expression per column and schema version, MERGEs, state reads), most of them different,
so on a fresh process compiling them can cost more than running them. Measured on this project's
benchmarks (2 cores):

- the demo's change into every view (tables of a few hundred rows, kilobytes): code generation took 22%
  of the driver JVM's samples (Java Flight Recorder), and evaluating the step interpreted
  (``spark.sql.codegen.factoryMode=NO_CODEGEN`` with whole-stage code generation off: Spark's own
  fallback whenever generated code fails to compile) took 30-33 s instead of 37-38 s in a fresh process,
  14-16 s instead of 18-21 s in a warm one;
- continuous sync of 100,000 products (tens of megabytes; a MERGE rewrites whole files) was slower
  interpreted: commit-to-visible p50 9.5 s against 7.3 s; and a 1% fan-out re-index over 300,000
  documents (6.3 million term rows) took 41 s interpreted against 22 s.

So a table's work runs interpreted only when it applies at most :data:`SMALL_BATCH_EVENTS` events (from
offsets) *and* the tables it reads and writes hold at most :data:`SMALL_TABLE_BYTES` of data files on
local disk; a rebuild, a table far behind, a large table or one on object storage keeps code generation.

Results are the same either way (both paths implement the same expressions); only speed differs.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from derived_views.engine.delta_sql import is_local

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: A table's work applying at most this many events may be evaluated without generated code ...
SMALL_BATCH_EVENTS = 20_000
#: ... when the tables it reads and writes hold at most this many bytes of data files: between the
#: demo's kilobytes (faster interpreted) and 100,000 products' tens of megabytes (faster compiled).
SMALL_TABLE_BYTES = 4 << 20
_FACTORY_MODE = "spark.sql.codegen.factoryMode"
_WHOLE_STAGE = "spark.sql.codegen.wholeStage"


def small_tables(paths: Iterable[str]) -> bool:
    """Whether the Delta tables at ``paths`` hold at most :data:`SMALL_TABLE_BYTES` of data files together
    (counted on disk, files a ``VACUUM`` would remove included; a path not on local disk counts as large)."""
    total = 0
    for path in paths:
        if not is_local(path):
            return False
        for directory, subdirectories, files in os.walk(path.removeprefix("file://")):
            subdirectories[:] = [d for d in subdirectories if d != "_delta_log"]
            for name in files:
                if name.endswith(".parquet") or name.endswith(".bin"):
                    total += os.stat(os.path.join(directory, name)).st_size
                    if total > SMALL_TABLE_BYTES:
                        return False
    return True


@contextmanager
def sized_for(spark: SparkSession, events: int, tables: Iterable[str]) -> Iterator[None]:
    """Within the block, ``spark`` (this session only) evaluates interpreted when the work is small:
    ``events`` to apply, and the Delta tables at ``tables`` it reads and writes (see the module docstring)."""
    if events > SMALL_BATCH_EVENTS or not small_tables(tables):
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
