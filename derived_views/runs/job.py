"""The Spark session of a view command: started sized for its run, and described for its log line.

A command that runs one step and ends (``one_shot``) starts a driver that compiles with C1 alone when
the step is small (:mod:`derived_views.runs.short_run`, reasons in :mod:`derived_views.engine.driver_jit`);
any other run keeps the JVM's default. :func:`session_facts` says which session a command got, so the
application can log it without reaching into the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from derived_views.engine.driver_jit import driver_compilers
from derived_views.engine.spark_session import build_spark, is_remote, remote_url
from derived_views.runs.short_run import short_run
from derived_views.source.log_location import LogLocation

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def start_session(location: LogLocation, views_dir: Path, topic_prefix: str, *, one_shot: bool = False) -> SparkSession:
    """The session of a view command over the log at ``location`` into the views under ``views_dir``;
    ``one_shot``: the process runs one step and ends."""
    return build_spark("cdc-views", short_run=one_shot and short_run(location, views_dir, topic_prefix))


@dataclass(frozen=True)
class SessionFacts:
    """Which Spark a command runs on: its master (a Spark Connect URL for a remote session), its
    application id and the driver's compilers (``C1`` or ``C1+C2``; ``None`` when remote)."""

    master: str | None
    app_id: str | None
    compilers: str | None


def session_facts(spark: SparkSession) -> SessionFacts:
    """What ``spark`` is (see :class:`SessionFacts`). A local driver's own log is quieted to fatal
    errors: a failed task reaches the user as the command's one error line, and Spark's log of the same
    failure would repeat it as pages of stack traces."""
    if is_remote(spark):
        return SessionFacts(remote_url(), None, None)
    spark.sparkContext.setLogLevel("FATAL")
    conf = spark.sparkContext.getConf()
    return SessionFacts(conf.get("spark.master"), conf.get("spark.app.id"), driver_compilers(spark))
