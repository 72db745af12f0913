"""Build the SparkSession every view job runs in: Delta Lake enabled, local by default.

On this machine the session runs ``local[*]`` with the Delta jars fetched at set-up (see
:mod:`derived_views.delta_jars`), so it never needs the network. On a cluster the same jobs are
started with ``spark-submit --packages io.delta:...`` and a master URL; :func:`build_spark` then leaves
the master and the jars to spark-submit. A driver JVM this process starts has its output routed into
the project's log lines (:mod:`derived_views.jvm_output`).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from derived_views.delta_jars import delta_coordinate, installed_jars
from derived_views.jvm_output import DRIVER_JAVA_OPTIONS, launch_driver

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.session.timeZone": "UTC",
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.driver.memory": "2g",
}


def build_spark(app_name: str = "cdc", master: str | None = None, conf: dict[str, str] | None = None) -> SparkSession:
    """Return a Delta-enabled session, reusing the active one when this process already has it.

    Workers run this interpreter (``PYSPARK_PYTHON``), so the Python data source and the views'
    modules import the same code as the driver.
    """
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    settings = {"spark.app.name": app_name}
    submitted = "spark.master" in os.environ.get("PYSPARK_SUBMIT_ARGS", "") or os.environ.get("SPARK_SUBMIT")
    if master or not submitted:
        settings["spark.master"] = master or os.environ.get("CDC_SPARK_MASTER", "local[2]")
    settings.update({**_DELTA_CONF, **(conf or {})})
    jars = installed_jars()
    if jars:
        settings["spark.jars"] = ",".join(str(jar) for jar in jars)
    else:
        settings["spark.jars.packages"] = delta_coordinate()
    if not submitted and SparkContext._gateway is None and "PYSPARK_GATEWAY_PORT" not in os.environ:
        # this process starts the driver JVM: its output becomes log lines (derived_views.jvm_output)
        settings["spark.driver.extraJavaOptions"] = " ".join(
            filter(None, [settings.get("spark.driver.extraJavaOptions"), DRIVER_JAVA_OPTIONS]))
        launch_driver(settings)
    builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
