"""Fetch the Spark jars the views need once, so that every later Spark session starts offline.

Those are Delta Lake's Spark connector and Spark's Kafka source (``spark-sql-kafka-0-10``, for logs kept
in Kafka), each the build that matches the installed ``delta-spark`` and ``pyspark`` versions. Set-up
calls :func:`fetch` (``python -m derived_views.engine.spark_jars``): Spark's own dependency resolver downloads
them with their dependencies into an Ivy cache, and the resolved jars are copied into :func:`jars_dir`.
Sessions then pass those files as ``spark.jars`` and never touch the network.
"""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from derived_views.engine.engine_settings import engine_settings


def jars_dir() -> Path:
    """Where the resolved jars live: ``CDC_SPARK_JARS_DIR``, else ``<virtualenv>/jars``."""
    explicit = engine_settings().spark_jars_dir
    return explicit if explicit is not None else Path(sys.prefix) / "jars"


def spark_packages() -> str:
    """Maven coordinates (comma-separated) of the Delta connector built for the installed Spark minor
    version and of the Kafka source of the installed Spark version."""
    import pyspark

    delta_version = importlib.metadata.version("delta-spark")
    spark_minor = ".".join(pyspark.__version__.split(".")[:2])
    return (
        f"io.delta:delta-spark_{spark_minor}_2.13:{delta_version},"
        f"org.apache.spark:spark-sql-kafka-0-10_2.13:{pyspark.__version__}"
    )


def stamp() -> str:
    """Identifies the jar set, so that a version change triggers a new fetch."""
    return spark_packages()


_VERSIONED_JAR = re.compile(r"^(?P<artifact>.+?)-\d[^-]*(-[^-]+)?\.jar$")


def _artifact(file_name: str) -> str:
    """``parquet-hadoop-1.16.0.jar`` -> ``parquet-hadoop``."""
    match = _VERSIONED_JAR.match(file_name)
    return match["artifact"] if match else file_name


def _bundled_artifacts() -> set[str]:
    """Artifacts pyspark already ships; the packages' copies of them (often older) must not shadow them."""
    import pyspark

    return {_artifact(jar.name) for jar in Path(pyspark.__file__).parent.joinpath("jars").glob("*.jar")}


def installed_jars() -> list[Path]:
    """The jar files ready for offline sessions; empty when set-up has not fetched them yet."""
    directory = jars_dir()
    stamp_file = directory / "COORDINATE"
    if not stamp_file.exists() or stamp_file.read_text().strip() != stamp():
        return []
    return sorted(directory.glob("*.jar"))


@contextmanager
def resolved_jars(coordinates: str) -> Iterator[list[Path]]:
    """The jar files of Maven ``coordinates`` (comma-separated) with their dependencies, as Spark's own
    resolver downloads them from Maven Central into a throwaway Ivy cache (removed on exit)."""
    from pyspark.sql import SparkSession

    with tempfile.TemporaryDirectory(prefix="cdc-ivy-") as ivy:
        session = (
            SparkSession.builder.master("local[1]")
            .appName("cdc-fetch-jars")
            .config("spark.jars.packages", coordinates)
            .config("spark.jars.ivy", ivy)
            .config("spark.ui.enabled", "false")
            .getOrCreate()
        )
        session.stop()
        resolved = sorted(Path(ivy, "jars").glob("*.jar"))
        if not resolved:
            raise RuntimeError(f"Spark resolved no jars for {coordinates}")
        yield resolved


def fetch() -> list[Path]:
    """Resolve and copy the jars unless the current set is already present."""
    existing = installed_jars()
    if existing:
        return existing
    directory = jars_dir()
    with resolved_jars(spark_packages()) as resolved:
        if directory.exists():
            shutil.rmtree(directory)
        directory.mkdir(parents=True)
        bundled = _bundled_artifacts()
        for jar in resolved:
            if _artifact(jar.name.split("_", 1)[-1]) not in bundled:
                shutil.copy2(jar, directory / jar.name)
    (directory / "COORDINATE").write_text(stamp() + "\n")
    return installed_jars()


if __name__ == "__main__":
    for path in fetch():
        print(path)
