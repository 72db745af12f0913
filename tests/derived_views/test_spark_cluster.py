"""The views on a real Spark standalone cluster: ``spark-submit`` of ``cdc/spark_job.py``, and ``cdc spark-server``.

The cluster (:mod:`tests.fix_spark_cluster`) is a master and two one-core workers. Each scenario captures
the reference schema's sample data (in the embedded-log scenario the Connect server's run and
spark-submit's share one capture), runs the view commands on the cluster exactly as the docs show
(``docs/scaling.md``), verifies every view equal to the source, and reads Spark's event log to assert that
the tasks ran in the workers' executors, the log's reads among them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from cdc.commands.demo_cmd import EXAMPLE_VIEWS, _change_one_product
from derived_views.engine.spark_jars import installed_jars
from migrations.sample_data import insert_sample_data
from tests.derived_views.pipeline import context, verify_views
from tests.fix_spark_cluster import SparkCluster, spark_home
from tests.spark_server_process import running_spark_server, server_environment

#: each scenario starts several JVMs (spark-submit drivers, executors): minutes on a busy 2-core machine
if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from cdc.config.settings import Settings

pytestmark = [pytest.mark.spark, pytest.mark.pg, pytest.mark.slow, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
VIEWS = ("warehouse", "search.products", "cache.order")


def _env(reference_db: str, data_dir: Path, **extra: str) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("CDC_") or k == "CDC_SPARK_JARS_DIR"},
        "CDC_DATABASE_URL": reference_db,
        "CDC_DATA_DIR": str(data_dir),
        "CDC_VIEWS_FILE": str(EXAMPLE_VIEWS),
        "PYSPARK_PYTHON": sys.executable,  # the executors' Python: an environment with pg-cdc installed
        "SPARK_HOME": spark_home(),
        "SPARK_LOCAL_IP": "127.0.0.1",  # driver and executors talk over loopback
        **extra,
    }


def _run(env: dict[str, str], *command: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"{' '.join(command)} exited {result.returncode}:\n{result.stderr[-4000:]}"
    return result


#: ``sync --once`` then ``rebuild warehouse`` in one application (one driver and its executors started
#: once); stops at the first command that fails. The rebuild's log ranges are read by Spark tasks however
#: small (a test's log is far below the size the driver reads itself): the executors then read the log. The
#: sync reads with ``{sync_limit}`` as its driver-read limit
_SYNC_THEN_REBUILD = """
import sys

from derived_views.source import pending
from cdc.cli import main

for command, limit in ((["sync", "--once"], {sync_limit}), (["rebuild", "warehouse"], 0)):
    pending.DRIVER_READ_LIMIT = limit
    sys.argv = ["cdc", *command]
    try:
        main()
    except SystemExit as stop:
        if stop.code:
            raise
"""

#: both commands' log ranges read by tasks
SYNC_THEN_REBUILD_JOB = _SYNC_THEN_REBUILD.format(sync_limit=0)

#: the sync as ``cdc/spark_job.py`` runs it (a change this small read in the driver), the rebuild by tasks
DRIVER_SYNC_THEN_REBUILD_JOB = _SYNC_THEN_REBUILD.format(sync_limit="pending.DRIVER_READ_LIMIT")


def _submit(
    cluster: SparkCluster, env: dict[str, str], events: Path, *args: str, job: str = "cdc/spark_job.py"
) -> subprocess.CompletedProcess[str]:
    """``spark-submit --master spark://... JOB ARGS``, as docs/scaling.md shows it, with an event log."""
    events.mkdir(exist_ok=True)
    return _run(
        env,
        str(BIN / "spark-submit"),
        "--master",
        cluster.master,
        "--jars",
        ",".join(str(jar) for jar in installed_jars()),  # as docs/scaling.md shows: the jars set-up fetched
        "--conf",
        "spark.executor.memory=1g",
        "--conf",
        "spark.eventLog.enabled=true",
        "--conf",
        f"spark.eventLog.dir=file:{events}",
        "--conf",
        "spark.eventLog.compress=false",
        "--conf",
        "spark.eventLog.rolling.enabled=false",
        job,
        *args,
    )


def _event_files(events: Path) -> list[Path]:
    """Every application's event log in ``events`` (plain JSON lines, one file per application)."""
    files = [path for path in events.rglob("*") if path.is_file() and not path.name.startswith(".")]
    assert files, f"no event log in {events}"
    return files


def _task_executors(events: Path) -> dict[str, int]:
    """``{executor id: tasks ended}`` over every application's event log in ``events``."""
    counts: dict[str, int] = {}
    for log in _event_files(events):
        for line in log.read_text().splitlines():
            event = json.loads(line)
            if event.get("Event") == "SparkListenerTaskEnd":
                executor = event["Task Info"]["Executor ID"]
                counts[executor] = counts.get(executor, 0) + 1
    return counts


def _application_ids(events: Path) -> set[str]:
    """The id of every application whose event log is in ``events`` (at least one)."""
    ids = set()
    for log in _event_files(events):
        for line in log.read_text().splitlines():
            event = json.loads(line)
            if event.get("Event") == "SparkListenerApplicationStart":
                ids.add(str(event["App ID"]))
    assert ids, f"no application start in the event logs of {events}"
    return ids


def _plans(events: Path) -> str:
    """Every physical plan the applications in ``events`` ran, as one text."""
    plans = []
    for log in _event_files(events):
        for line in log.read_text().splitlines():
            event = json.loads(line)
            if event.get("Event", "").endswith("SparkListenerSQLExecutionStart"):
                plans.append(event.get("physicalPlanDescription", ""))
    return "\n".join(plans)


def _settings(env: dict[str, str]) -> Settings:
    """The settings ``env`` gives the commands, for this process's own reads and writes of the same views."""
    from cdc.config.settings import load_settings

    return load_settings(
        database_url=env["CDC_DATABASE_URL"],
        data_dir=env["CDC_DATA_DIR"],
        views_file=env["CDC_VIEWS_FILE"],
        log=env.get("CDC_LOG", ""),
        topic_prefix=env.get("CDC_TOPIC_PREFIX", "cdc"),
    )


def _verify_every_view(spark: SparkSession, env: dict[str, str]) -> None:
    """Every view equal to the source, read in this process (the tables are files; any reader will do)."""
    assert verify_views(context(spark, _settings(env)), env["CDC_DATABASE_URL"], list(VIEWS)) > 0


def test_a_spark_server_then_spark_submit_sync_rebuild_and_verify_the_views_on_a_cluster(
    spark: SparkSession, spark_cluster: SparkCluster, reference_db: str, tmp_path: Path
) -> None:
    """The embedded log, on a path every executor reads. First ``cdc spark-server`` with the cluster as its
    master: the commands attached to it capture, sync and verify every view, and the master lists the server
    as an application holding the workers' cores. The server stopped, one ``spark-submit`` application
    syncs a change and rebuilds by replay (the log read by the ``cdclog`` source in the executors); every
    view verified equal to the source again."""
    insert_sample_data(reference_db)
    env = _env(reference_db, tmp_path / "data")
    cdc = str(BIN / "cdc")
    server_env = server_environment(CDC_SPARK_MASTER=spark_cluster.master, SPARK_LOCAL_IP="127.0.0.1")
    with running_spark_server(tmp_path, "spark.executor.memory=1g", env=server_env) as url:
        attached = {**env, "CDC_SPARK_REMOTE": url}
        _run(attached, cdc, "setup")
        _run(attached, cdc, "capture", "--once")
        _run(attached, cdc, "sync", "--once")
        _verify_every_view(spark, env)
        apps = spark_cluster.status()["activeapps"]
        assert isinstance(apps, list) and len(apps) == 1 and apps[0]["cores"] == 2, apps

    events = tmp_path / "events"
    _change_one_product(reference_db)
    _run(env, cdc, "capture", "--once")
    job = tmp_path / "sync_then_rebuild_job.py"
    job.write_text(DRIVER_SYNC_THEN_REBUILD_JOB)
    submitted = _submit(spark_cluster, env, events, job=str(job))
    # spark-submit joins the Python driver's stderr to its stdout
    assert "cache.order: 1 events" in submitted.stdout, submitted.stdout[-3000:]
    assert "rebuilt warehouse" in submitted.stdout, submitted.stdout[-3000:]
    _verify_every_view(spark, env)

    executors = _task_executors(events)
    assert "driver" not in executors and len(executors) >= 2 and sum(executors.values()) > 0, executors
    assert "cdclog" in _plans(events).lower()  # the rebuild read the log through the source, in tasks
    finished = {app["id"] for app in spark_cluster.status()["completedapps"]}
    assert _application_ids(events) <= finished, finished  # the application ran on the cluster, and ended


@pytest.mark.kafka
def test_views_on_kafka_rebuild_through_spark_submit_on_a_cluster(
    spark: SparkSession,
    spark_cluster: SparkCluster,
    reference_db: str,
    tmp_path: Path,
    kafka_bootstrap: str,
    kafka_prefix: str,
) -> None:
    """The log in Kafka: a sync and a rebuild on the cluster (one application), the topics read by Spark's
    Kafka source in the executors, every view verified equal to the source."""
    insert_sample_data(reference_db)
    env = _env(reference_db, tmp_path / "data", CDC_LOG=f"kafka://{kafka_bootstrap}", CDC_TOPIC_PREFIX=kafka_prefix)
    events = tmp_path / "events"
    _run(env, str(BIN / "cdc"), "setup")
    _run(env, str(BIN / "cdc"), "capture", "--once")
    job = tmp_path / "sync_then_rebuild_job.py"
    job.write_text(SYNC_THEN_REBUILD_JOB)
    submitted = _submit(spark_cluster, env, events, job=str(job))
    assert "rebuilt warehouse" in submitted.stdout, submitted.stdout[-3000:]  # both commands ran
    _verify_every_view(spark, env)
    executors = _task_executors(events)
    assert "driver" not in executors and len(executors) >= 2, executors
    assert "kafka" in _plans(events).lower()  # Spark's Kafka source read the topics, in tasks


def test_spark_submit_without_delta_jars_is_one_clear_error(tmp_path: Path) -> None:
    """Without ``--jars`` / ``--packages`` the submitted driver has no Delta: one error line naming both fixes."""
    env = _env("postgresql://nobody@127.0.0.1:1/none", tmp_path / "data")
    command = [str(BIN / "spark-submit"), "--master", "local[1]", "cdc/spark_job.py", "sync", "warehouse", "--once"]
    result = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr  # spark-submit joins the Python driver's stderr to its stdout
    assert result.returncode == 2, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Delta Lake is not on the Spark driver's classpath" in errors[0], output[-3000:]
    assert "--packages io.delta:delta-spark_" in errors[0] and "--jars" in errors[0]
