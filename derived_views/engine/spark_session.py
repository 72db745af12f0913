"""Build the SparkSession every view job runs in: Delta Lake enabled, local by default.

On this machine the session runs ``local[*]`` with the Delta jars fetched at set-up (see
:mod:`derived_views.engine.spark_jars`), so it never needs the network. On a cluster the same jobs are
started with ``spark-submit --packages io.delta:...`` and a master URL; :func:`build_spark` then leaves
the master and the jars to spark-submit. A driver JVM this process starts has its output routed into
the project's log lines (:mod:`derived_views.engine.jvm_output`).

With ``CDC_SPARK_REMOTE`` (``sc://host:port``) no JVM starts here: the session is a Spark Connect client
of a server that stays warm between runs (:mod:`derived_views.engine.spark_server`), and the server holds the
settings below.
"""

from __future__ import annotations

import atexit
import os
import socket
import sys
import urllib.parse
from typing import TYPE_CHECKING

from derived_views.engine.engine_settings import engine_settings
from derived_views.engine.jvm_output import driver_java_options, launch_driver
from derived_views.engine.spark_jars import installed_jars, spark_packages

#: Spark Connect's default port.
DEFAULT_PORT = 15002

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: How view tables store timestamps: Parquet's ``TIMESTAMP(MICROS)``, Spark's own precision, not the
#: ``INT96`` Spark writes by default. Readers take an ``INT96`` value as nanoseconds (delta-rs, hence
#: ``deltalake``, which ``cdc verify``, ``cdc search`` and ``cdc cache get`` read with), and nanoseconds since
#: 1970 in 64 bits end at 1677-09-21 and 2262-04-11: an instant outside (1000-06-15, 9999-12-31) read
#: back as another (2169-07-24, 1816-03-30). Files written before keep their ``INT96`` values until the
#: table is rebuilt (``cdc rebuild``).
PARQUET_TIMESTAMPS = {"spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS"}

#: Settings of every view session: Delta enabled, no UI, few shuffle partitions, UTC, a 2 GB driver, secrets
#: redacted, timestamps stored in microseconds, names resolved with case.
SESSION_DEFAULTS = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.session.timeZone": "UTC",
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.driver.memory": "2g",
    # secrets in data source options (Kafka's SASL login, a client key) never appear in a plan
    "spark.sql.redaction.options.regex": "(?i)url|password|jaas|keystore\\.key",
    # no Python call site captured per column expression: that costs five JVM calls per expression
    # built, several times the expression itself, while the views' errors name their table and column
    "spark.python.sql.dataFrameDebugging.enabled": "false",
    # names resolve with case, as PostgreSQL's quoted names do: ``duration`` beside ``"Duration"`` in one
    # frame is two columns, not an ambiguous reference (Delta still compares a table's column names
    # without case, so such twins are stored under names of their own: derived_views.events.column_names)
    "spark.sql.caseSensitive": "true",
    **PARQUET_TIMESTAMPS,
}


def build_spark(
    app_name: str = "cdc", master: str | None = None, conf: dict[str, str] | None = None, *, short_run: bool = False
) -> SparkSession:
    """Return a Delta-enabled session, reusing the active one when this process already has it.

    Workers run this interpreter (``PYSPARK_PYTHON``), so the Python data source and the views'
    modules import the same code as the driver. ``short_run``: a driver JVM this call starts compiles
    with C1 alone (:mod:`derived_views.engine.driver_jit`).
    """
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    remote = remote_url()
    if remote and master is None:
        return _attach(remote, app_name, conf or {})
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    settings = {"spark.app.name": app_name}
    submitted = submitted_driver()
    if master or not submitted:
        settings["spark.master"] = master or engine_settings().spark_master
    settings.update({**SESSION_DEFAULTS, **(conf or {})})
    jars = installed_jars()
    if submitted:
        pass  # spark-submit fixed the driver's classpath: its --jars / --packages, checked below
    elif jars:
        settings["spark.jars"] = ",".join(str(jar) for jar in jars)
    else:
        settings["spark.jars.packages"] = spark_packages()
    if not submitted and SparkContext._gateway is None and "PYSPARK_GATEWAY_PORT" not in os.environ:
        # this process starts the driver JVM: its output becomes log lines (derived_views.engine.jvm_output)
        java_options = driver_java_options(settings.get("spark.driver.extraJavaOptions", ""))
        if short_run:
            from derived_views.engine.driver_jit import C1_ONLY

            java_options = " ".join([java_options, *C1_ONLY])
        settings["spark.driver.extraJavaOptions"] = java_options
        launch_driver(settings)
    builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    if submitted:
        _require_delta(session)
    return session


def submitted_driver() -> bool:
    """Whether this process is a driver that ``spark-submit`` started: its JVM is already running, with the
    master, jars and settings spark-submit was given, which a session built here must not replace."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def _require_delta(session: SparkSession) -> None:
    """One clear error when ``spark-submit`` was not given Delta Lake's jars: the session would otherwise
    start without Delta and fail at its first table with a class-loading trace."""
    from derived_views.errors import SparkJarsMissingError

    jvm = session.sparkContext._jvm
    try:
        jvm.org.apache.spark.util.Utils.classForName("io.delta.sql.DeltaSparkSessionExtension", True, False)  # type: ignore[union-attr]
    except Exception as exc:
        raise SparkJarsMissingError(spark_packages()) from exc


def remote_url() -> str | None:
    """The Spark Connect server the commands attach to (``CDC_SPARK_REMOTE``), if any."""
    return engine_settings().spark_remote


def is_remote(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect session (no JVM in this process)."""
    from pyspark.sql.utils import is_remote as connect_mode

    return connect_mode() or type(spark).__module__.startswith("pyspark.sql.connect")


#: Seconds to wait for the Spark Connect server's port before giving up (its client would retry for minutes).
CONNECT_TIMEOUT_S = 10.0


def _attach(url: str, app_name: str, conf: dict[str, str]) -> SparkSession:
    """A new Spark Connect session on the server at ``url``, with ``conf`` set in it.

    The server's port is tried first: a server that is down is one clear error at once
    (:class:`~derived_views.errors.SparkServerUnreachableError`), not minutes of the client's retries."""
    from derived_views.errors import SparkServerUnreachableError

    parsed = urllib.parse.urlparse(url)
    try:
        port = parsed.port or DEFAULT_PORT
    except ValueError:
        port = 0
    if parsed.scheme != "sc" or not parsed.hostname or not port:
        raise SparkServerUnreachableError(url, "not a Spark Connect URL (sc://host:port)")
    try:
        socket.create_connection((parsed.hostname, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise SparkServerUnreachableError(url, exc.strerror or str(exc)) from None
    return _configured(url, app_name, dict(conf))


def _configured(url: str, app_name: str, conf: dict[str, str]) -> SparkSession:
    """A new Spark Connect session with ``conf`` set in it, remembered for :func:`new_session`."""
    session = _connect(url, app_name)
    for key, value in conf.items():
        session.conf.set(key, value)
    _ATTACHED[id(session)] = (url, app_name, conf)
    return session


#: How each Spark Connect session this process attached was made (URL, app name, settings), by ``id``:
#: a session beside it (:func:`new_session`) is made the same way, on the same server.
_ATTACHED: dict[int, tuple[str, str, dict[str, str]]] = {}


def _connect(url: str, app_name: str = "cdc") -> SparkSession:
    """A new Spark Connect session, released on the server when this process exits.

    Released explicitly: a session left to the interpreter's final garbage collection closes its gRPC
    channel from a finalizer, which can wait forever on the channel's own threads."""
    from pyspark.sql import SparkSession

    session = SparkSession.builder.remote(url).appName(app_name).create()
    atexit.register(session.stop)
    return session


def new_session(spark: SparkSession) -> SparkSession:
    """A second session beside ``spark`` (its own settings and temporary views, the same Spark)."""
    if is_remote(spark):
        return _configured(*_ATTACHED.get(id(spark), (remote_url() or "", "cdc", {})))
    return spark.newSession()
