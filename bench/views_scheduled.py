"""A scheduled ``cdc sync --once`` as cron runs it: a fresh process each time, beside a bare Spark start.

Usage: python -m bench.views_scheduled [--keep]   (``--keep``: leave the cluster and data directories, and
print how to run a step again by hand, e.g. under a profiler)

On a throwaway PostgreSQL with the demo's schema, data and views (``views.example.toml``), each figure is
one fresh process's wall time, measured in the same run as the anchor:

- bare Spark start: a process that builds the views' Spark session (JVM and Delta, the jars local) and
  stops it, doing no work (the anchor);
- ``cdc sync --once`` of the demo's first snapshot into every view;
- ``cdc sync --once`` with nothing pending (target: at most 1.5x the anchor);
- ``cdc sync --once`` carrying the demo's change (a category renamed, a product repriced, an order line
  added, customers deleted; ``cdc capture --once`` first) into every view (target: at most 3x the anchor).

Each is measured twice: with Spark started by the command itself (the default), and with the command
attached to a warm Spark (``cdc spark-server``, ``CDC_SPARK_REMOTE``; a second data directory and slot,
so the server's first sync is a first sync too). The server is started once, its start timed apart;
the change sync is then run twice (the first on a server that has not run those queries yet, the
second as every later cron run finds it).

Prints figures only; it asserts nothing.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cdc.commands.demo_cmd import EXAMPLE_VIEWS, _change_one_product
from local_servers.postgres import LocalPostgres, free_port

BARE_START = "from derived_views.engine.spark_session import build_spark; build_spark('cdc-bare').stop()"


def timed(command: list[str], env: dict[str, str]) -> float:
    """Seconds a fresh process running ``command`` takes; fails on a non-zero exit."""
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return elapsed


def start_server(cdc: str, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str, float]:
    """``cdc spark-server`` on a free port; returns it, its URL and the seconds until it listened."""
    port = free_port()
    started = time.perf_counter()
    server = subprocess.Popen(
        [cdc, "spark-server", "--port", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if server.poll() is not None:
                raise SystemExit(f"cdc spark-server exited {server.returncode}") from None
            time.sleep(0.2)
    return server, f"sc://127.0.0.1:{port}", time.perf_counter() - started


def line(label: str, seconds: float, anchor: float, target: str = "") -> str:
    return f"{label:<44}{seconds:7.2f} s   {seconds / anchor:5.1f}x" + (f"   ({target})" if target else "")


def main(keep: bool) -> None:
    from cdc.setup import migrate
    from migrations.sample_data import insert_sample_data

    cdc = str(Path(sys.executable).with_name("cdc"))
    server = LocalPostgres()
    url = server.start()
    local_dir = Path(tempfile.mkdtemp(prefix="cdc-bench-scheduled-"))
    remote_dir = Path(tempfile.mkdtemp(prefix="cdc-bench-scheduled-remote-"))
    env = {
        **os.environ,
        "CDC_DATABASE_URL": url,
        "CDC_DATA_DIR": str(local_dir),
        "CDC_PARTITIONS": "3",
        "CDC_VIEWS_FILE": str(EXAMPLE_VIEWS),
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
    }
    env.pop("CDC_SPARK_REMOTE", None)
    spark_server: subprocess.Popen[bytes] | None = None
    try:
        migrate.upgrade(url)
        insert_sample_data(url)
        timed([cdc, "setup"], env)
        timed([cdc, "capture", "--once"], env)
        bare = timed([sys.executable, "-c", BARE_START], env)
        first = timed([cdc, "sync", "--once"], env)
        idle = timed([cdc, "sync", "--once"], env)
        _change_one_product(url)
        timed([cdc, "capture", "--once"], env)
        change = timed([cdc, "sync", "--once"], env)

        spark_server, remote, server_start = start_server(cdc, env)
        attached = {**env, "CDC_DATA_DIR": str(remote_dir), "CDC_SLOT": "cdc_bench_attached", "CDC_SPARK_REMOTE": remote}
        timed([cdc, "setup"], attached)
        timed([cdc, "capture", "--once"], attached)
        first_attached = timed([cdc, "sync", "--once"], attached)
        idle_attached = timed([cdc, "sync", "--once"], attached)
        changes_attached = []
        for _ in range(2):
            _change_one_product(url)
            timed([cdc, "capture", "--once"], attached)
            changes_attached.append(timed([cdc, "sync", "--once"], attached))
        bare_again = timed([sys.executable, "-c", BARE_START], env)
        anchor = min(bare, bare_again)
        print(f"bare Spark start (JVM + Delta, no work)     {anchor:7.2f} s   (anchor; {bare:.2f} and {bare_again:.2f} s)")
        print("Spark started by each command:")
        print(line("  first sync of the demo data, all views", first, anchor))
        print(line("  sync with nothing pending", idle, anchor, "target <= 1.5x"))
        print(line("  sync of the demo's change, all views", change, anchor, "target <= 3x"))
        print(f"attached to a warm Spark (cdc spark-server; the server listened after {server_start:.2f} s):")
        print(line("  first sync of the demo data, all views", first_attached, anchor))
        print(line("  sync with nothing pending", idle_attached, anchor, "target <= 1.5x"))
        print(line("  sync of the demo's change, first", changes_attached[0], anchor))
        print(line("  sync of the demo's change, next", changes_attached[1], anchor, "target <= 3x"))
        if keep:
            print(f"kept: CDC_DATABASE_URL={url} CDC_DATA_DIR={local_dir} CDC_PARTITIONS=3 CDC_VIEWS_FILE={EXAMPLE_VIEWS}")
            print(
                f"  and CDC_DATA_DIR={remote_dir} CDC_SLOT=cdc_bench_attached (with CDC_SPARK_REMOTE=sc://127.0.0.1:PORT "
                f"of a `cdc spark-server --port PORT` you start)"
            )
            print(f"stop the server with: pg_ctl -D {server.data_dir} stop")
    finally:
        if spark_server is not None:
            spark_server.send_signal(signal.SIGTERM)
            spark_server.wait(timeout=60)
        if not keep:
            server.stop()
            import shutil

            shutil.rmtree(local_dir, ignore_errors=True)
            shutil.rmtree(remote_dir, ignore_errors=True)


if __name__ == "__main__":
    main("--keep" in sys.argv[1:])
