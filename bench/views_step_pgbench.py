"""Where a warm warehouse step over pgbench's tables spends its time, table by table, step by step.

Usage: python -m bench.views_step_pgbench [--conf KEY=VALUE]... [--deletion-vectors] [--alternate N]
[scale] [steps] [seconds] [rate]
(default pgbench scale 5 (500,000 accounts), 6 steps, each after 10 s of ``pgbench -c 2 -R 100``)

A fresh PostgreSQL gets ``pgbench -i`` (``pgbench_history``, keyless, ``REPLICA IDENTITY FULL``), ``cdc
setup`` and a first capture; the warehouse keeps the four tables, and its first step (which also warms
Spark up) makes them. Then, per step: ``seconds`` of ``pgbench -n -c 2 -R rate``, ``cdc capture --once``,
and one ``cdc sync`` step (``runner.step``, in this process, as ``--continuous`` runs it). Printed per step,
beside its wall time (the anchor, measured in the same run):

- per view table: the newest commit's operation and Delta's MERGE metrics (as ``bench.views_step_phases``);
- from Spark's event log: the time some job ran, the driver's time between jobs, jobs, tasks.

``--alternate N``: odd steps apply one source table at a time, even steps ``N`` at once
(``derived_views.views.warehouse.TABLES_SIDE_BY_SIDE``), so both are measured under the same load.
Prints figures only; it asserts nothing.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import psycopg

import bench.ordinary_pages  # noqa: F401 - capture runs in this process, as the command sets it up
from bench.views_step_phases import _newest_commit, _time_of
from bench.views_step_profile import conf_and_words, event_log_spark, events, summarize
from bench.views_sustained import BIN, TABLES, _env
from local_servers.postgres import LocalPostgres


def main(scale: int, steps: int, seconds: int, rate: int, conf: dict[str, str], vectors: bool, alternate: int) -> None:
    import tempfile
    from pathlib import Path

    from cdc.config import view_arguments
    from cdc.config.settings import load_settings
    from cdc.run.coordinator import Capture
    from derived_views.runs import runner
    from derived_views.views import warehouse

    with LocalPostgres() as server:
        url = server.url()
        data_dir = Path(tempfile.mkdtemp(prefix="cdc-step-pgbench-"))
        pgbench = str(server.bindir / "pgbench")
        subprocess.run([pgbench, "-i", "-q", "-s", str(scale), url], check=True, capture_output=True)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("ALTER TABLE pgbench_history REPLICA IDENTITY FULL")
        env = _env(url, data_dir) | {"CDC_TABLES": ",".join(TABLES)}
        subprocess.run([str(BIN / "cdc"), "setup"], env=env, check=True, capture_output=True)
        settings = load_settings(database_url=url, data_dir=str(data_dir), tables=",".join(TABLES), deletion_vectors=vectors)
        spark, directory = event_log_spark("cdc-bench-step-pgbench", conf)
        Capture(settings, once=True).run()
        ctx = view_arguments.context_from_settings(settings, spark)
        started = time.monotonic()
        runner.step(ctx, ["warehouse"])
        print(f"scale {scale}, {seconds} s of {rate} tx/s a step, conf={conf}, deletion vectors {vectors}")
        print(f"first step (tables made, Spark warmed up) {time.monotonic() - started:.1f} s", flush=True)
        windows: list[tuple[int, int, float, str]] = []
        for number in range(steps):
            load = [pgbench, "-n", "-c", "2", "-R", str(rate), "-T", str(seconds), url]
            subprocess.run(load, check=True, capture_output=True)
            Capture(settings, once=True).run()
            if alternate:
                warehouse.TABLES_SIDE_BY_SIDE = 1 if number % 2 == 0 else alternate
            started_ms, started = int(time.time() * 1000), time.monotonic()
            report = runner.step(ctx, ["warehouse"])
            wall = time.monotonic() - started
            head = f"step {number + 1}: {report.events} tables at once {warehouse.TABLES_SIDE_BY_SIDE} wall {wall:.1f} s"
            windows.append((started_ms, int(time.time() * 1000), wall, head))
            print(head)
            for table in TABLES:
                paths = {"current": warehouse.current_path(ctx, table), "history": warehouse.history_path(ctx, table)}
                for label, path in paths.items():
                    print(f"  {table.removeprefix('public.'):18} {label:8} {_newest_commit(path)}", flush=True)
        spark.stop()  # flushes the event log
    every = events(directory)
    shutil.rmtree(data_dir, ignore_errors=True)
    shutil.rmtree(directory, ignore_errors=True)
    for start, end, wall, head in windows:
        print(head)
        for line in summarize([event for event in every if start <= _time_of(event) <= end], wall)[:5]:
            print(f"  {line}")


if __name__ == "__main__":
    settings, words = conf_and_words(sys.argv[1:])
    vectors = "--deletion-vectors" in words
    alternate = int(words[words.index("--alternate") + 1]) if "--alternate" in words else 0
    numbers = [int(w) for i, w in enumerate(words) if w.isdigit() and (i == 0 or words[i - 1] != "--alternate")]
    scale, steps, seconds, rate = numbers + [5, 6, 10, 100][len(numbers) :]
    main(scale, steps, seconds, rate, settings, vectors, alternate)
