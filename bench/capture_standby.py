"""Capture from a hot standby beside capture from its primary, on the same workload in one run.

Usage: .venv/bin/python -m bench.capture_standby [rows]   (default 500,000; PostgreSQL 16)

A primary and its physical standby (:mod:`local_servers.standby_pair`); table ``bench`` in the publication;
two slots made before the workload, one on the primary and one on the standby, each with a log of its
own. The workload inserts ``rows`` rows on the primary in transactions of 1,000; once the standby has
replayed them, ``capture --once`` drains each slot in turn, timed from its start to its exit.

Prints events per second of each, the ratio standby / primary (goal >= 0.9), and the CPU seconds the
primary's processes spent meanwhile (its postmaster's children, the walsender decoding for capture
among them: from /proc, the live ones' and the reaped ones' alike): decoding on the standby should take
it off the primary.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import psycopg

from bench.capture_common import TABLE, insert_rows, timed
from cdc.config.settings import Settings, load_settings
from cdc.run.coordinator import Capture
from cdc.setup.source_objects import ensure_publication, ensure_slot
from local_servers.standby_pair import StandbyPair

PER_TRANSACTION = 1000
TICKS = os.sysconf("SC_CLK_TCK")


def cluster_cpu_seconds(postmaster_pid: int) -> float:
    """CPU seconds of a cluster: its postmaster's own and reaped children's, and its live children's."""
    total = _times(postmaster_pid, reaped=True)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == postmaster_pid:
                    total += _times(int(entry.name), reaped=False)
            except (OSError, ValueError, IndexError):
                continue  # a process that ended meanwhile
    return total


def _times(pid: int, *, reaped: bool) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if reaped else 0)
    return ticks / TICKS


def _postmaster(data_dir: Path) -> int:
    return int((data_dir / "postmaster.pid").read_text().split()[0])


def _settings(url: str, data_dir: Path, primary_url: str = "") -> Settings:
    return load_settings(database_url=url, data_dir=str(data_dir), tables="public.bench", primary_url=primary_url)


def main(rows: int) -> None:
    scratch = Path(tempfile.mkdtemp(prefix="cdc-bench-standby-"))
    try:
        with StandbyPair(16) as pair:
            pair.start("bench")
            primary, standby = pair.primary.url("bench"), pair.standby.url("bench")
            with psycopg.connect(primary, autocommit=True) as conn:
                conn.execute(TABLE)
            from_primary = _settings(primary, scratch / "primary", "")
            from_standby = _settings(standby, scratch / "standby", primary).model_copy(update={"slot": "cdc_standby"})
            ensure_publication(from_primary)
            for settings in (from_primary, from_standby):
                ensure_slot(settings)
                Capture(settings, once=True).run()  # the (empty) first read; the slot then sits before the workload
            insert_rows(primary, rows, PER_TRANSACTION)
            with psycopg.connect(primary, autocommit=True) as conn:
                end = str(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])  # type: ignore[index]
            with psycopg.connect(standby, autocommit=True) as conn:
                while conn.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (end,)).fetchone() != (True,):
                    time.sleep(0.05)
            figures = {}
            for name, settings in (("from the primary", from_primary), ("from the standby", from_standby)):
                cpu = cluster_cpu_seconds(_postmaster(pair.primary.data_dir))
                with timed() as seconds:
                    stats = Capture(settings, once=True).run()
                assert stats.events == rows, f"{name}: captured {stats.events} events of {rows}"
                figures[name] = (seconds[0], cluster_cpu_seconds(_postmaster(pair.primary.data_dir)) - cpu)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"rows={rows:,} inserted on the primary in transactions of {PER_TRANSACTION:,}; capture --once per slot")
    for name, (seconds, cpu) in figures.items():
        print(f"{name:<20}{rows / seconds:>12,.0f} ev/s{seconds:>9.2f} s   primary CPU {cpu:>6.2f} s")
    primary_s, standby_s = figures["from the primary"][0], figures["from the standby"][0]
    print(f"{'ratio standby / primary':<20}{primary_s / standby_s:>12.2f}   (goal >= 0.9)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 500_000)
