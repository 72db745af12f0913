"""Streaming throughput: events/s from WAL into the durable log, beside pg_recvlogical on the same WAL.

Usage: python bench/capture_streaming.py [rows]   (default 1,000,000 single-row inserts... as
1,000-row transactions of single-row INSERT rows). The anchor is pg_recvlogical decoding the same WAL
range with pgoutput into /dev/null: the walsender's own ceiling. Target: ratio >= 0.6.
"""

from __future__ import annotations

import subprocess
import sys

import psycopg

from bench.capture_common import bench_database, insert_rows, timed
from cdc.coordinator import Capture
from cdc.lsn import Lsn


def main(rows: int) -> None:
    with bench_database() as (server, url, settings):
        Capture(settings, once=True).run()  # empty snapshot; the slot now sits before the workload
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT pg_create_logical_replication_slot('anchor', 'pgoutput')")
        insert_rows(url, rows, 1000)
        with psycopg.connect(url, autocommit=True) as conn:
            end = Lsn.parse(str(conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]))  # type: ignore[index]
            conn.execute("CHECKPOINT")
        with timed() as anchor:
            subprocess.run(
                [str(server.bindir / "pg_recvlogical"), "-d", url, "--slot", "anchor", "--start", "--no-loop",
                 "-o", "proto_version=1", "-o", "publication_names=cdc_publication", "-E", str(end), "-f", "/dev/null"],
                check=True, capture_output=True,
            )
        with timed() as ours:
            stats = Capture(settings, once=True).run()
        ours_rate = stats.events / ours[0]
        anchor_rate = rows / anchor[0]
        print(f"rows={rows} transactions={stats.transactions} events={stats.events}")
        print(f"capture into the log : {ours_rate:>12,.0f} events/s ({ours[0]:.1f} s)")
        print(f"pg_recvlogical anchor: {anchor_rate:>12,.0f} rows/s   ({anchor[0]:.1f} s)")
        print(f"ratio                : {ours_rate / anchor_rate:.2f} (target >= 0.6)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000)
