"""A table read again beside the stream: its rate beside COPY of the same table to /dev/null, and another
table's commit-to-log latency (p50/p99) during the read beside the same load without one.

Usage: python bench/capture_reread.py [rows]   (default 1,000,000). Goals: rate ratio >= 0.5, p99 within 2x.

The read is started by ``ALTER TABLE bench ADD COLUMN flag int DEFAULT (7 + random() * 0)::int`` (a
volatile default rewrites the table: its existing rows hold a value no change carried; a constant default
would be carried by the schema record instead, with no read). A writer commits ~200 single-row updates
a second to ``busy`` all along; a poller notes when each reaches the log (the published watermark, polled every 2 ms).

Two spans are printed: from the ``ALTER`` (which rewrites the table on the server, and whose WAL the
stream must get through before the read can begin), and the read itself, from the moment capture
begins it (a read under way, polled every 2 ms) until every row is in. The latency during the read is
printed for both spans too.

A session holds a transaction with an ID open from before the ``ALTER`` to the read's end (a read made
with a replication slot would wait for it, and the stream with it), and a sampler notes every 20 ms
how long capture's oldest transaction holding a snapshot (``backend_xmin``) has been open: the longest
is printed beside the read's length.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
import psycopg

from bench.capture_common import bench_database, timed
from cdc.run.coordinator import Capture
from log_store import LogStore, TopicPartition


def _writer(url: str, stop: threading.Event, commits: dict[int, float]) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        n = 0
        while not stop.is_set():
            n += 1
            conn.execute("UPDATE busy SET n = %s WHERE id = 1", (n,))
            commits[n] = time.perf_counter()
            time.sleep(0.005)


def _poller(settings_dir: str, stop: threading.Event, arrivals: dict[int, float]) -> None:
    offset = 0
    while not stop.is_set():
        try:
            with LogStore.open(Path(settings_dir) / "log") as log:
                while not stop.is_set():
                    tp = TopicPartition("cdc.public.busy", 0)
                    while batch := log.read(tp, offset):
                        now = time.perf_counter()
                        for record in batch:
                            if record.value is not None:
                                arrivals.setdefault(int(orjson.loads(record.value)["after"]["n"]), now)
                        offset = batch[-1].offset + 1
                    time.sleep(0.002)
        except Exception:  # noqa: BLE001 - the log or topic does not exist yet
            time.sleep(0.05)


def _xmin_watch(url: str, stop: threading.Event, skip: list[int], longest: list[float]) -> None:
    """The longest time a session other than ``skip``'s has held a snapshot open, sampled every 20 ms."""
    with psycopg.connect(url, autocommit=True) as conn:
        while not stop.is_set():
            row = conn.execute(
                "SELECT COALESCE(max(extract(epoch FROM clock_timestamp() - xact_start)), 0)::float8 FROM pg_stat_activity "
                "WHERE datname = current_database() AND backend_xmin IS NOT NULL AND backend_type = 'client backend' "
                "AND pid <> pg_backend_pid() AND pid <> ALL(%s)",
                (skip,),
            ).fetchone()
            longest[0] = max(longest[0], float(row[0]) if row else 0.0)
            time.sleep(0.02)


def _percentiles(values: list[float]) -> str:
    if len(values) < 2:
        return "n/a"
    cuts = statistics.quantiles(values, n=100)
    return f"p50 {cuts[49] * 1000:.0f} ms, p99 {cuts[98] * 1000:.0f} ms over {len(values)} commits"


def main(rows: int) -> None:
    with bench_database() as (server, url, settings):
        settings = settings.model_copy(update={"tables": ["public.bench", "public.busy"], "partitions": 1})
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO bench (id, name, amount) SELECT g, 'name ' || g, g * 1.25 FROM generate_series(1, %s) g", (rows,)
            )
            conn.execute("CREATE TABLE busy (id int PRIMARY KEY, n int)")
            conn.execute("INSERT INTO busy VALUES (1, 0)")
            conn.execute("ALTER PUBLICATION cdc_publication ADD TABLE busy")
            conn.execute("VACUUM ANALYZE bench")
        with timed() as anchor, open("/dev/null", "wb") as sink:
            subprocess.run(
                [str(server.bindir / "psql"), url, "-c", "COPY (SELECT * FROM bench) TO STDOUT"], check=True, stdout=sink
            )
        stop, done = threading.Event(), threading.Event()
        capture = Capture(settings, stop=stop)
        running = threading.Thread(target=capture.run)
        running.start()
        while capture.stats.snapshot_rows < rows + 1:
            time.sleep(0.05)
        commits: dict[int, float] = {}
        arrivals: dict[int, float] = {}
        threads = [
            threading.Thread(target=_writer, args=(url, done, commits)),
            threading.Thread(target=_poller, args=(str(settings.data_dir), done, arrivals)),
        ]
        for thread in threads:
            thread.start()
        time.sleep(5)  # the load without a read
        open_tx = psycopg.connect(url)
        open_tx.execute("CREATE TEMPORARY TABLE held_open (id int)")
        open_tx.execute("INSERT INTO held_open VALUES (1)")  # an ID, held until the read's end
        longest = [0.0]
        with psycopg.connect(url, autocommit=True) as conn:  # the ALTER's own session is not capture's
            skip = [open_tx.info.backend_pid, conn.info.backend_pid]
            watch = threading.Thread(target=_xmin_watch, args=(url, done, skip, longest))
            watch.start()
            read_start = time.perf_counter()
            conn.execute("ALTER TABLE bench ADD COLUMN flag int DEFAULT (7 + random() * 0)::int")
            conn.execute("UPDATE bench SET name = 'x' WHERE id = 1")
        while not capture.reads and capture.stats.snapshot_rows < 2 * rows:
            time.sleep(0.002)
        reading = time.perf_counter()
        while capture.stats.snapshot_rows < 2 * rows:
            time.sleep(0.002)
        read_end = time.perf_counter()
        open_tx.close()
        time.sleep(1)
        done.set()
        for thread in [*threads, watch]:
            thread.join()
        stop.set()
        running.join()
    latency = {n: arrivals[n] - at for n, at in commits.items() if n in arrivals}
    before = [v for n, v in latency.items() if commits[n] < read_start]
    during = [v for n, v in latency.items() if read_start <= commits[n] < read_end]
    read_only = [v for n, v in latency.items() if reading <= commits[n] < read_end]
    seconds, read_seconds = read_end - read_start, read_end - reading
    print(f"re-read of {rows:,} rows beside the stream: {seconds:.2f} s ({rows / seconds:,.0f} rows/s, from the ALTER)")
    print(f"  of which the read itself: {read_seconds:.2f} s ({rows / read_seconds:,.0f} rows/s, from its start)")
    copy_rate = rows / anchor[0]
    print(
        f"COPY of the same table to /dev/null: {anchor[0]:.2f} s ({copy_rate:,.0f} rows/s); "
        f"ratio {anchor[0] / seconds:.2f} from the ALTER, {anchor[0] / read_seconds:.2f} for the read itself"
    )
    print(f"busy commit-to-log without a read: {_percentiles(before)}")
    print(f"busy commit-to-log from the ALTER to the read's end: {_percentiles(during)}")
    print(f"busy commit-to-log during the read itself: {_percentiles(read_only)}")
    print(
        f"longest snapshot a session of capture held: {longest[0]:.2f} s of a {read_seconds:.2f} s read "
        f"({capture.stats.snapshots_renewed} renewals), a transaction with an ID open all along"
    )
    print(f"load average at the end: {' '.join(f'{load:.2f}' for load in os.getloadavg())}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000)
