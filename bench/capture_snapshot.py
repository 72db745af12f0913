"""Snapshot throughput: rows/s from a table into the log, beside COPY of the same table to /dev/null.

Usage: python bench/capture_snapshot.py [rows]   (default 1,000,000). Target: ratio >= 0.5.

Also prints the CPU time the snapshot took in this process (building events, appending to the log)
and in the server's backends (building the JSON), to show which side bounds the rate.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg

from bench.capture_common import bench_database, timed
from cdc.coordinator import Capture


def main(rows: int) -> None:
    with bench_database() as (server, url, settings):
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO bench (id, name, amount) SELECT g, 'name ' || g, g * 1.25 FROM generate_series(1, %s) g",
                (rows,),
            )
            conn.execute("VACUUM ANALYZE bench")
        with timed() as anchor, open("/dev/null", "wb") as sink:
            subprocess.run(
                [str(server.bindir / "psql"), url, "-c", "COPY (SELECT * FROM bench) TO STDOUT"], check=True, stdout=sink
            )
        time.sleep(0.3)  # the connections above have exited
        server_cpu = _children_cpu(server.data_dir)
        before_cpu = os.times()
        with timed() as ours:
            stats = Capture(settings, once=True, progress=False).run()
        ours_cpu = os.times()
        time.sleep(0.3)  # the snapshot sessions' backends exit and are reaped
        server_after = _children_cpu(server.data_dir)
        server_cpu = server_after - server_cpu if server_cpu >= 0 and server_after >= 0 else float("nan")
        ours_rate = stats.snapshot_rows / ours[0]
        anchor_rate = rows / anchor[0]
        print(f"rows={rows} snapshot_rows={stats.snapshot_rows}")
        print(f"snapshot into the log: {ours_rate:>12,.0f} rows/s ({ours[0]:.1f} s)")
        print(f"COPY to /dev/null    : {anchor_rate:>12,.0f} rows/s ({anchor[0]:.1f} s)")
        print(f"ratio                : {ours_rate / anchor_rate:.2f} (target >= 0.5)")
        python_cpu = ours_cpu.user + ours_cpu.system - before_cpu.user - before_cpu.system
        print(
            f"CPU seconds          : capture {python_cpu:.2f} (user {ours_cpu.user - before_cpu.user:.2f}), "
            f"server backends {server_cpu:.2f}"
        )


def _children_cpu(data_dir: Path) -> float:
    """CPU seconds of the server's exited backends (the postmaster's reaped children), -1 when unknown."""
    try:
        pid = int((data_dir / "postmaster.pid").read_text().split()[0])
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, ValueError, IndexError):
        return -1.0
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000)
