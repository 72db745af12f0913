"""A Spark Connect server that keeps one warm Spark (JVM, Delta, compiled code) between view syncs.

A scheduled ``cdc sync --once`` that starts its own Spark pays for a JVM, Delta's classes and the code
generation of every MERGE on each run: seconds before any work, and each first query of a process is
slow. With ``CDC_SPARK_REMOTE=sc://host:port`` the commands attach to a long-running Spark Connect server
instead (:func:`derived_views.engine.spark_session.build_spark`): a client session starts in a fraction of a
second and the server's JVM has run the same queries before.

:func:`server_command` is what ``cdc spark-server`` runs in the foreground (for systemd or compose): the
Spark Connect server that ships with pyspark, with the Delta jars fetched at set-up, the session settings
every view session has (:data:`derived_views.engine.spark_session.SESSION_DEFAULTS`), and this interpreter for
Python workers, so the log's data source (:mod:`derived_views.source.log_source`) runs the same code as the
client. The server reads and writes the same paths as the client (the views and the log): run it on
the same machine, or where those paths are the same shared storage.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from derived_views.engine.engine_settings import engine_settings
from derived_views.engine.jvm_output import driver_java_options
from derived_views.engine.spark_jars import installed_jars, spark_packages
from derived_views.engine.spark_session import DEFAULT_PORT, SESSION_DEFAULTS

#: The server class in pyspark's ``spark-connect`` jar.
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def server_command(
    port: int = DEFAULT_PORT, host: str = "127.0.0.1", master: str | None = None, conf: dict[str, str] | None = None
) -> list[str]:
    """The ``spark-submit`` command line of a Spark Connect server for the views."""
    import pyspark

    conf = dict(conf or {})
    java_options = driver_java_options(conf.pop("spark.driver.extraJavaOptions", ""))
    settings = {
        **SESSION_DEFAULTS,
        "spark.connect.grpc.binding.address": host,
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.extraJavaOptions": java_options,
        **conf,
    }
    command = [
        str(Path(pyspark.__file__).parent / "bin" / "spark-submit"),
        "--class",
        SERVER_CLASS,
        "--name",
        "cdc-spark-server",
        "--master",
        master or engine_settings().spark_master,
    ]
    jars = installed_jars()
    if jars:
        command += ["--jars", ",".join(str(jar) for jar in jars)]
    else:
        command += ["--packages", spark_packages()]
    for key, value in settings.items():
        command += ["--conf", f"{key}={value}"]
    return [*command, "spark-internal"]


def server_environment() -> dict[str, str]:
    """The server's environment: Python workers run this interpreter (see the module docstring)."""
    return {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
