"""Shared set-up of the view benchmarks: a Spark session that can also read PostgreSQL over JDBC.

The full-refresh anchor is what a team without CDC would run: Spark's JDBC source reads the whole
source table and overwrites a Delta table. The PostgreSQL JDBC driver is resolved once by Spark's own
dependency resolver into ``<virtualenv>/jars-jdbc`` (the project's sessions never need it).
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

JDBC_DRIVER = "org.postgresql:postgresql:42.7.4"


def jdbc_jars() -> list[Path]:
    """The PostgreSQL JDBC driver jars, resolved on first use."""
    directory = Path(sys.prefix) / "jars-jdbc"
    found = sorted(directory.glob("*.jar"))
    if found:
        return found
    import shutil
    import subprocess

    # a separate process: a JVM that resolved packages keeps them in its configuration
    with tempfile.TemporaryDirectory(prefix="cdc-ivy-") as ivy:
        subprocess.run(
            [sys.executable, "-c",
             "from pyspark.sql import SparkSession; SparkSession.builder.master('local[1]')"
             f".config('spark.jars.packages', '{JDBC_DRIVER}').config('spark.jars.ivy', '{ivy}')"
             ".config('spark.ui.enabled', 'false').getOrCreate().stop()"],
            check=True, capture_output=True,
        )
        directory.mkdir(parents=True, exist_ok=True)
        for jar in Path(ivy, "jars").glob("*.jar"):
            shutil.copy2(jar, directory / jar.name)
    return sorted(directory.glob("*.jar"))


def bench_spark() -> SparkSession:
    """The views' Delta session with the JDBC driver on the class path."""
    from derived_views.spark_session import build_spark

    path = ":".join(str(jar) for jar in jdbc_jars())
    return build_spark("cdc-bench-views", conf={"spark.driver.extraClassPath": path,
                                                "spark.executor.extraClassPath": path})


def jdbc_options(url: str, table: str) -> dict[str, str]:
    """Spark JDBC options for a ``postgresql://user:pw@host:port/db`` URL."""
    parsed = urlparse(url)
    options = {
        "url": f"jdbc:postgresql://{parsed.hostname}:{parsed.port or 5432}{parsed.path}",
        "dbtable": table,
        "user": parsed.username or "postgres",
        "driver": "org.postgresql.Driver",
        "fetchsize": "10000",
    }
    if parsed.password:
        options["password"] = parsed.password
    return options


def full_refresh(spark: SparkSession, url: str, table: str, target: str, rows: int) -> None:
    """Read ``table`` over JDBC (two range partitions on ``id``) and overwrite the Delta table ``target``."""
    frame = (spark.read.format("jdbc").options(**jdbc_options(url, table))
             .option("partitionColumn", "id").option("lowerBound", "1").option("upperBound", str(rows))
             .option("numPartitions", "2").load())
    frame.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(target)


@contextmanager
def timed() -> Iterator[list[float]]:
    """Yields a list that holds the elapsed seconds once the block ends."""
    box: list[float] = []
    start = time.perf_counter()
    yield box
    box.append(time.perf_counter() - start)
