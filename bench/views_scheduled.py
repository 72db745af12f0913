"""A scheduled ``cdc sync --once`` as cron runs it: a fresh process each time, beside a bare Spark start.

Usage: python -m bench.views_scheduled [--keep]   (``--keep``: leave the cluster and data directory, and
print how to run a step again by hand, e.g. under a profiler)

On a throwaway PostgreSQL with the demo's schema, data and views (``views.example.toml``), each figure is
one fresh process's wall time, measured in the same run as the anchor:

- bare Spark start: a process that builds the views' Spark session (JVM and Delta, the jars local) and
  stops it, doing no work (the anchor);
- ``cdc sync --once`` of the demo's first snapshot into every view;
- ``cdc sync --once`` with nothing pending (target: at most 1.5x the anchor);
- ``cdc sync --once`` carrying the demo's change (a category renamed, a product repriced, an order line
  added, customers deleted; ``cdc capture --once`` first) into every view (target: at most 3x the anchor).

Prints figures only; it asserts nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cdc.commands.demo_cmd import EXAMPLE_VIEWS, _change_one_product
from cdc.local_postgres import LocalPostgres

_BARE_START = "from derived_views.spark_session import build_spark; build_spark('cdc-bare').stop()"


def _timed(command: list[str], env: dict[str, str]) -> float:
    """Seconds a fresh process running ``command`` takes; fails on a non-zero exit."""
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return elapsed


def main(keep: bool) -> None:
    from cdc import migrate
    from migrations.sample_data import insert_sample_data

    cdc = str(Path(sys.executable).with_name("cdc"))
    server = LocalPostgres()
    url = server.start()
    data_dir = Path(tempfile.mkdtemp(prefix="cdc-bench-scheduled-"))
    env = {**os.environ, "CDC_DATABASE_URL": url, "CDC_DATA_DIR": str(data_dir), "CDC_PARTITIONS": "3",
           "CDC_VIEWS_FILE": str(EXAMPLE_VIEWS), "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    try:
        migrate.upgrade(url)
        insert_sample_data(url)
        _timed([cdc, "setup"], env)
        _timed([cdc, "capture", "--once"], env)
        bare = _timed([sys.executable, "-c", _BARE_START], env)
        first = _timed([cdc, "sync", "--once"], env)
        idle = _timed([cdc, "sync", "--once"], env)
        _change_one_product(url)
        _timed([cdc, "capture", "--once"], env)
        change = _timed([cdc, "sync", "--once"], env)
        bare_again = _timed([sys.executable, "-c", _BARE_START], env)
        anchor = min(bare, bare_again)
        print(f"bare Spark start (JVM + Delta, no work)   {anchor:7.2f} s   (anchor; {bare:.2f} and {bare_again:.2f} s)")
        print(f"first sync of the demo data, all views    {first:7.2f} s   {first / anchor:5.1f}x")
        print(f"sync with nothing pending                 {idle:7.2f} s   {idle / anchor:5.1f}x   (target <= 1.5x)")
        print(f"sync of the demo's change, all views      {change:7.2f} s   {change / anchor:5.1f}x   (target <= 3x)")
        if keep:
            print(f"kept: CDC_DATABASE_URL={url} CDC_DATA_DIR={data_dir} CDC_PARTITIONS=3 CDC_VIEWS_FILE={EXAMPLE_VIEWS}")
            print(f"stop the server with: pg_ctl -D {server.data_dir} stop")
    finally:
        if not keep:
            server.stop()
            import shutil

            shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main("--keep" in sys.argv[1:])
