"""Streaming throughput: events/s from WAL into the durable log, beside pg_recvlogical on the same WAL.

Usage: python bench/capture_streaming.py [rows]   (default 1,000,000 single-row inserts... as
1,000-row transactions of single-row INSERT rows). The anchor is pg_recvlogical decoding the same WAL
range with pgoutput into /dev/null: the walsender's own ceiling. Target: ratio >= 0.6.
"""

from __future__ import annotations

import sys

import psycopg

from bench.capture_common import bench_database, insert_rows, recvlogical_seconds, timed
from cdc.run.coordinator import Capture


def main(rows: int) -> None:
    with bench_database() as (server, url, settings):
        Capture(settings, once=True).run()  # empty snapshot; the slot now sits before the workload
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT pg_create_logical_replication_slot('anchor', 'pgoutput')")
        insert_rows(url, rows, 1000)
        anchor = recvlogical_seconds(server, url, "anchor")
        with timed() as ours:
            stats = Capture(settings, once=True).run()
        ours_rate = stats.events / ours[0]
        anchor_rate = rows / anchor
        print(f"rows={rows} transactions={stats.transactions} events={stats.events}")
        print(f"capture into the log : {ours_rate:>12,.0f} events/s ({ours[0]:.1f} s)")
        print(f"pg_recvlogical anchor: {anchor_rate:>12,.0f} rows/s   ({anchor:.1f} s)")
        print(f"ratio                : {ours_rate / anchor_rate:.2f} (target >= 0.6)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000)
