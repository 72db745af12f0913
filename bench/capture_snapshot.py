"""Snapshot throughput: rows/s from a table into the log, beside COPY of the same table to /dev/null.

Usage: python bench/capture_snapshot.py [rows]   (default 1,000,000). Target: ratio >= 0.5.
"""

from __future__ import annotations

import subprocess
import sys

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
            subprocess.run([str(server.bindir / "psql"), url, "-c", "COPY (SELECT * FROM bench) TO STDOUT"],
                           check=True, stdout=sink)
        with timed() as ours:
            stats = Capture(settings, once=True, progress=False).run()
        ours_rate = stats.snapshot_rows / ours[0]
        anchor_rate = rows / anchor[0]
        print(f"rows={rows} snapshot_rows={stats.snapshot_rows}")
        print(f"snapshot into the log: {ours_rate:>12,.0f} rows/s ({ours[0]:.1f} s)")
        print(f"COPY to /dev/null    : {anchor_rate:>12,.0f} rows/s ({anchor[0]:.1f} s)")
        print(f"ratio                : {ours_rate / anchor_rate:.2f} (target >= 0.5)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000)
