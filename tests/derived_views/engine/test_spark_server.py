"""View commands attached to a warm Spark Connect server (``cdc spark-server``, ``CDC_SPARK_REMOTE``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest

from cdc.commands.demo_cmd import EXAMPLE_VIEWS, _change_one_product
from derived_views.engine.driver_jit import C1_ONLY
from local_servers.postgres import free_port
from migrations.sample_data import insert_sample_data
from tests.spark_server_process import running_spark_server

pytestmark = [pytest.mark.spark, pytest.mark.pg, pytest.mark.slow]

CDC = str(Path(__file__).resolve().parents[3] / ".venv" / "bin" / "cdc")


@contextmanager
def _running_server(workdir: Path, *settings: str) -> Iterator[str]:
    """``cdc spark-server`` on a free port (``settings``: ``--conf`` values), stopped (SIGTERM) afterwards."""
    with running_spark_server(workdir, *settings) as url:
        yield url


#: The module's server lives about two minutes: it compiles with C1 alone, as a short run's driver does
#: (a server's default is C1 and C2, which pays back only over a longer life; results are the same)
SHORT_LIVED = "spark.driver.extraJavaOptions=" + " ".join(C1_ONLY)


@pytest.fixture(scope="module")
def spark_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One server for the module's tests."""
    with _running_server(tmp_path_factory.mktemp("spark-server"), SHORT_LIVED) as url:
        yield url


def test_java_options_given_to_the_server_join_its_own() -> None:
    """``--conf spark.driver.extraJavaOptions=...`` adds to the server's Java options (its log4j
    configuration, the class archive) instead of replacing them; other settings override the defaults."""
    from derived_views.engine.jvm_output import driver_java_options
    from derived_views.engine.spark_server import server_command

    command = server_command(conf={"spark.driver.extraJavaOptions": "-XX:+UseSerialGC", "spark.sql.shuffle.partitions": "2"})
    settings = [command[i + 1] for i, arg in enumerate(command) if arg == "--conf"]
    java = [s.removeprefix("spark.driver.extraJavaOptions=") for s in settings if s.startswith("spark.driver.extraJavaOptions=")]
    assert java == [f"-XX:+UseSerialGC {driver_java_options()}"], settings
    assert "-Dlog4j2.configurationFile=" in java[0], java
    assert [s for s in settings if s.startswith("spark.sql.shuffle.partitions=")] == ["spark.sql.shuffle.partitions=2"]
    # the server writes view tables' timestamps in microseconds, as every view session does
    assert "spark.sql.parquet.outputTimestampType=TIMESTAMP_MICROS" in settings


#: Run in a process of its own (a Spark Connect session switches pyspark into Connect mode for the whole
#: process): a context kept alive and an idle session, past the server's session timeout.
_KEEP_ALIVE_CHECK = """
import sys, time
from derived_views.write.context import ViewContext
from derived_views.engine.spark_session import build_spark
idle = build_spark("idle")
kept = ViewContext(build_spark("kept"), sys.argv[1], sys.argv[1], "cdc")
kept.beside()
kept.keep_alive()
deadline = time.monotonic() + 12
while time.monotonic() < deadline:
    kept.keep_alive()
    time.sleep(1)
print("kept", kept.spark.range(3).count(), kept.beside().spark.range(2).count())
try:
    idle.range(1).count()
    print("idle alive")
except Exception as exc:
    print("idle dropped")
"""


def _cdc(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([CDC, *args], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"cdc {' '.join(args)}: {result.stderr}"
    return result


def test_sync_attached_to_a_spark_server_is_exact(spark_server: str, reference_db: str, tmp_path: Path) -> None:
    insert_sample_data(reference_db)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CDC_")},
        "CDC_DATABASE_URL": reference_db,
        "CDC_DATA_DIR": str(tmp_path / "data"),
        "CDC_PARTITIONS": "3",
        "CDC_VIEWS_FILE": str(EXAMPLE_VIEWS),
        "CDC_SPARK_REMOTE": spark_server,
    }
    _cdc(env, "setup")
    _cdc(env, "capture", "--once")
    first = _cdc(env, "sync", "--once")
    assert f"spark_master={spark_server}" in first.stderr, first.stderr
    product_id, _order = _change_one_product(reference_db)
    _cdc(env, "capture", "--once")
    change = _cdc(env, "sync", "--once")
    # the change reached every view: 6 warehouse events (category, product, order line, customers deleted)
    assert "warehouse: 0 events" not in change.stderr and "cache.order: 1 events" in change.stderr, change.stderr
    for view in ("warehouse", "search.products", "cache.order"):
        verified = _cdc(env, "verify", view, "--no-sync")
        assert f"{view} equals the source" in verified.stdout, verified.stdout
    again = _cdc(env, "sync", "--once")
    assert "warehouse: 0 events, search.products: 0 events, cache.order: 0 events" in again.stderr, again.stderr
    _cdc(env, "rebuild", "warehouse")
    rebuilt = _cdc(env, "verify", "warehouse", "--no-sync")
    assert "warehouse equals the source" in rebuilt.stdout, rebuilt.stdout
    hits = _cdc(env, "search", "products", "brass lantern")
    assert "brass lantern" in hits.stdout, hits.stdout

    from deltalake import DeltaTable

    current = DeltaTable(str(tmp_path / "data" / "warehouse" / "current" / "public.products"))
    prices = {row["id"]: row["price"] for row in current.to_pyarrow_table(columns=["id", "price"]).to_pylist()}
    assert prices[product_id] == Decimal("12.34")

    # --continuous over the server: a later change arrives without another command, and SIGTERM ends it
    syncing = subprocess.Popen(
        [CDC, "sync", "--continuous", "--interval", "0.2"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        with psycopg.connect(reference_db, autocommit=True) as conn:
            conn.execute("UPDATE products SET price = 56.78 WHERE id = %s", (product_id,))
        _cdc(env, "capture", "--once")
        deadline = time.monotonic() + 180
        while True:
            current.update_incremental()
            table = current.to_pyarrow_table(columns=["id", "price"]).to_pylist()
            if {row["id"]: row["price"] for row in table}[product_id] == Decimal("56.78"):
                break
            assert syncing.poll() is None, syncing.stderr.read() if syncing.stderr else ""
            assert time.monotonic() < deadline, "sync --continuous did not apply the change within 180 s"
            time.sleep(0.5)
    finally:
        syncing.send_signal(signal.SIGTERM)
        _out, errors = syncing.communicate(timeout=120)
    assert syncing.returncode == 0, errors


def test_an_unreachable_spark_server_is_one_clear_error(tmp_path: Path) -> None:
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CDC_")},
        "CDC_DATA_DIR": str(tmp_path / "data"),
        "CDC_SPARK_REMOTE": f"sc://127.0.0.1:{port}",
    }
    started = time.monotonic()
    result = subprocess.run([CDC, "sync", "--once"], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    errors = [line for line in result.stderr.splitlines() if not line.startswith("ts=")]
    assert errors == [
        f"error: no Spark Connect server answers at sc://127.0.0.1:{port} (CDC_SPARK_REMOTE): "
        "Connection refused; start one with `cdc spark-server`, or unset CDC_SPARK_REMOTE to run "
        "Spark in this process"
    ], result.stderr
    assert time.monotonic() - started < 60


def test_keep_alive_holds_sessions_the_server_drops_when_idle(tmp_path: Path) -> None:
    """A server that drops a session after 5 s without a request: the context that keeps its sessions alive
    (its own and its sibling's) still queries after 12 s, an idle session does not."""
    timeout = ("spark.connect.session.manager.defaultSessionTimeout=5s", "spark.connect.session.manager.maintenanceInterval=1s")
    with _running_server(tmp_path, *timeout) as url:
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("CDC_")}, "CDC_SPARK_REMOTE": url}
        result = subprocess.run(
            [sys.executable, "-c", _KEEP_ALIVE_CHECK, str(tmp_path)], env=env, capture_output=True, text=True, timeout=300
        )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-2:] == ["kept 3 2", "idle dropped"], result.stdout + result.stderr
