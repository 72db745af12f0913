"""A new log's first read: rows/s from a table into the log beside COPY of the same table to /dev/null,
with 1 and 2 sessions (``CDC_SNAPSHOT_SESSIONS``), while another table's changes stream.

Usage: python bench/capture_snapshot.py [rows]   (default 1,000,000). Goals: ratio >= 0.7; the other
table's commit-to-log p99 during the read within 1.5x of the same load after it; no capture session
holding a snapshot for longer than a few seconds.

Each run starts capture on a new log (``cdc capture`` as a service, in a thread of this process): the
slot is made, and every table is read beside the stream. A writer commits ~200 single-row updates a
second to ``busy`` all along; a poller notes when each reaches the log. A session holds a transaction
with an ID open from before capture starts to the read's end (a read made with a slot's snapshot would
wait for it), and a sampler notes every 20 ms how long capture's oldest transaction holding a snapshot
(``backend_xmin``) has been open. Also printed: the CPU time the read took in this process and in the
server's backends, to show which side bounds the rate.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg

from bench.capture_common import bench_database, timed
from bench.capture_reread import _percentiles, _poller, _writer, _xmin_watch
from cdc.run.coordinator import Capture


def run(rows: int, sessions: int) -> None:
    with bench_database() as (server, url, settings):
        settings = settings.model_copy(
            update={"tables": ["public.bench", "public.busy"], "partitions": 1, "snapshot_sessions": sessions}
        )
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO bench (id, name, amount) SELECT g, 'name ' || g, g * 1.25 FROM generate_series(1, %s) g",
                (rows,),
            )
            conn.execute("CREATE TABLE busy (id int PRIMARY KEY, n int)")
            conn.execute("INSERT INTO busy VALUES (1, 0)")
            conn.execute("ALTER PUBLICATION cdc_publication ADD TABLE busy")
            conn.execute("VACUUM ANALYZE bench")
        with timed() as anchor, open("/dev/null", "wb") as sink:
            subprocess.run(
                [str(server.bindir / "psql"), url, "-c", "COPY (SELECT * FROM bench) TO STDOUT"], check=True, stdout=sink
            )
        # the slot is made first (as `cdc setup` does): its creation waits for transactions holding an ID
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (settings.slot,))
        done, stop = threading.Event(), threading.Event()
        commits: dict[int, float] = {}
        arrivals: dict[int, float] = {}
        open_tx = psycopg.connect(url)
        open_tx.execute("CREATE TEMPORARY TABLE held_open (id int)")
        open_tx.execute("INSERT INTO held_open VALUES (1)")  # an ID, held until the read's end
        longest = [0.0]
        threads = [
            threading.Thread(target=_writer, args=(url, done, commits)),
            threading.Thread(target=_poller, args=(str(settings.data_dir), done, arrivals)),
            threading.Thread(target=_xmin_watch, args=(url, done, [open_tx.info.backend_pid], longest)),
        ]
        server_cpu = _children_cpu(server.data_dir)
        before_cpu = os.times()
        capture = Capture(settings, stop=stop)
        running = threading.Thread(target=capture.run)
        read_start = time.perf_counter()
        running.start()
        for thread in threads:
            thread.start()
        while capture.stats.snapshot_rows < rows + 1:
            time.sleep(0.002)
        read_end = time.perf_counter()
        ours_cpu = os.times()
        open_tx.close()
        time.sleep(5)  # the same load, no read
        done.set()
        for thread in threads:
            thread.join()
        stop.set()
        running.join()
        server_after = _children_cpu(server.data_dir)
    seconds = read_end - read_start
    latency = {n: arrivals[n] - at for n, at in commits.items() if n in arrivals}
    during = [v for n, v in latency.items() if commits[n] < read_end]
    after = [v for n, v in latency.items() if commits[n] >= read_end + 0.5]
    print(f"-- {sessions} session(s)")
    print(
        f"first read of {rows:,} rows into a new log: {seconds:.2f} s ({rows / seconds:,.0f} rows/s, from capture's start, "
        f"slot made before)"
    )
    print(f"COPY of the same table to /dev/null: {anchor[0]:.2f} s; ratio {anchor[0] / seconds:.2f} (goal >= 0.7)")
    print(f"busy commit-to-log during the read: {_percentiles(during)}")
    print(f"busy commit-to-log after it:        {_percentiles(after)}")
    print(
        f"longest snapshot a session of capture held: {longest[0]:.2f} s of a {seconds:.2f} s read "
        f"({capture.stats.snapshots_renewed} renewals), a transaction with an ID open all along"
    )
    python_cpu = ours_cpu.user + ours_cpu.system - before_cpu.user - before_cpu.system
    print(f"CPU seconds: capture {python_cpu:.2f}, server backends {server_after - server_cpu:.2f}")


def _children_cpu(data_dir: Path) -> float:
    """CPU seconds of the server's exited backends (the postmaster's reaped children), -1 when unknown."""
    try:
        pid = int((data_dir / "postmaster.pid").read_text().split()[0])
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, ValueError, IndexError):
        return -1.0
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def main(rows: int) -> None:
    for sessions in (1, 2):
        run(rows, sessions)
    print(f"load average at the end: {' '.join(f'{load:.2f}' for load in os.getloadavg())}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000)
