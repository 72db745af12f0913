"""The Spark driver JVM's own output, routed into the project's log lines instead of the terminal.

A local Spark driver is a JVM that ``pyspark`` starts with ``spark-submit``; it writes to the stderr it
inherits: the JVM's ``WARNING: Using incubator modules: jdk.incubator.vector`` (Spark's launcher always
adds ``--add-modules=jdk.incubator.vector`` to the driver's command line, and the JVM prints that
warning itself at start, before any logging framework exists, so no option silences it), log4j lines
(``NativeCodeLoader``, ``Utils``: hostname), the "default log4j profile" banner, and whatever Python
workers print. The README promises one line per event on stderr, so :func:`launch_driver` starts the
JVM with its stderr on a pipe that a thread of this process reads:

* log4j is configured by ``log4j2.properties`` beside this module (``-Dlog4j2.configurationFile`` in
  ``spark.driver.extraJavaOptions``): errors only, one line each (``LEVEL logger: message``), which
  becomes a log line of the ``spark`` logger at that level;
* the incubator-module warning is dropped (it is about the JVM's command line, not about this run), and
  so is the banner Spark prints on stderr for an interactive driver about its default log level;
* any other line (a Python worker's warning, the JVM's) becomes a warning line of the ``spark`` logger.

With ``spark-submit`` (a cluster) the driver's output is the submitter's business and nothing changes.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from pathlib import Path
from typing import Any

log = logging.getLogger("spark")

#: The log4j configuration of a driver this process starts.
LOG4J2_PROPERTIES = Path(__file__).with_name("log4j2.properties")

#: Java options of a driver this process starts (the log4j configuration).
DRIVER_JAVA_OPTIONS = f"-Dlog4j2.configurationFile={LOG4J2_PROPERTIES.as_uri()}"


def driver_java_options(given: str = "") -> str:
    """Java options of a driver this project starts: ``given`` (a user's ``spark.driver.extraJavaOptions``),
    then the project's own, which are added to the given ones and never replaced by them: the log4j
    configuration and, once set-up has made it, the class archive that shortens the JVM's start
    (:mod:`derived_views.engine.class_archive`)."""
    from derived_views.engine.class_archive import java_options

    return " ".join(filter(None, [given, DRIVER_JAVA_OPTIONS, java_options()]))


#: Lines dropped: the JVM's note on its command line, and the banner Spark prints for an interactive
#: driver (as pyspark's is) about the shell's log level, which the commands set themselves.
_DROPPED = (
    "WARNING: Using incubator modules:",
    "Setting default log level to ",
    "To adjust logging level use sc.setLogLevel(",
    "Using Spark's default log4j profile:",
)
_LOG4J = re.compile(r"^(?P<level>FATAL|ERROR|WARN|INFO|DEBUG|TRACE) (?P<logger>[\w.$-]+): (?P<message>.*)$")
_LEVELS = {
    "FATAL": logging.CRITICAL,
    "ERROR": logging.ERROR,
    "WARN": logging.WARNING,
    "INFO": logging.INFO,
    "DEBUG": logging.DEBUG,
    "TRACE": logging.DEBUG,
}


def route(line: str) -> None:
    """Log one line the driver JVM wrote to its stderr (see the module docstring)."""
    line = line.rstrip("\r\n")
    if not line.strip() or line.startswith(_DROPPED):
        return
    match = _LOG4J.match(line)
    if match is None:
        log.warning(line)
        return
    log.log(_LEVELS[match["level"]], match["message"], extra={"fields": {"source": match["logger"]}})


def _pump(fd: int) -> None:
    with os.fdopen(fd, "r", encoding="utf-8", errors="replace") as stream:
        for line in stream:
            try:
                route(line)
            except Exception:  # noqa: BLE001 - a line that cannot be logged must not stop the routing
                continue


def launch_driver(conf: dict[str, str]) -> Any:
    """Start the driver JVM with ``conf`` (its start-time settings) and its stderr routed; returns the
    py4j gateway, which ``SparkContext`` then uses instead of starting a JVM of its own."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    spark_conf = SparkConf(loadDefaults=False)
    for key, value in conf.items():
        spark_conf.set(key, value)
    read_fd, write_fd = os.pipe()
    threading.Thread(target=_pump, args=(read_fd,), name="spark-driver-stderr", daemon=True).start()
    try:
        gateway = launch_gateway(spark_conf, popen_kwargs={"stderr": write_fd})
    finally:
        os.close(write_fd)  # the JVM holds its own copy; the pipe ends when the JVM does
    SparkContext._ensure_initialized(gateway=gateway)
    return gateway
