"""Streaming throughput on PostgreSQL 15 and 18: capture into the durable log beside pg_recvlogical, same workload.

Usage: .venv/bin/python -m bench.capture_versions [rows] [--versions 15,18]   (default 300,000 rows as
1,000-row transactions of single-row INSERT rows, on each version; ``--versions`` picks any of 14 to 18,
side by side in the order given). Each version runs on a server of its own (15: Debian's; 18:
the build set-up fetched, ``local_servers.pg_builds``), and its anchor is that version's own pg_recvlogical
decoding the same WAL range with pgoutput into /dev/null: the walsender's ceiling on that version.
The figures are printed side by side, per version and as the ratio of capture to its anchor.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import psycopg

from bench.capture_common import bench_database, insert_rows, recvlogical_seconds, timed
from cdc.run.coordinator import Capture
from local_servers import pg_builds
from local_servers.postgres import LocalPostgres, find_server_bindir

VERSIONS = (15, 18)


@dataclass(frozen=True)
class Run:
    version: str
    events: int
    capture_seconds: float
    anchor_seconds: float

    @property
    def capture_rate(self) -> float:
        return self.events / self.capture_seconds

    @property
    def anchor_rate(self) -> float:
        return self.events / self.anchor_seconds


def _recvlogical(major: int, server: LocalPostgres) -> Path:
    """That version's pg_recvlogical: beside Debian's server, or among the client programs set-up fetched."""
    beside = server.bindir / "pg_recvlogical"
    if beside.exists():
        return beside
    fetched = pg_builds.installed_client_bindir(major)
    if fetched is None:
        raise SystemExit(f"no pg_recvlogical of PostgreSQL {major}: run scripts/setup (python -m local_servers.pg_builds)")
    return fetched / "pg_recvlogical"


def run(major: int, rows: int) -> Run:
    server = LocalPostgres(bindir=find_server_bindir(major))
    with bench_database(server) as (server, url, settings):
        with psycopg.connect(url) as conn:
            number = conn.info.server_version
        version = f"{number // 10000}.{number % 10000}"
        Capture(settings, once=True).run()  # empty snapshot; the slot now sits before the workload
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT pg_create_logical_replication_slot('anchor', 'pgoutput')")
        insert_rows(url, rows, 1000)
        anchor = recvlogical_seconds(server, url, "anchor", _recvlogical(major, server))
        with timed() as ours:
            stats = Capture(settings, once=True).run()
        assert stats.events == rows, f"captured {stats.events} events of {rows} rows"
        return Run(version, stats.events, ours[0], anchor)


def main(rows: int, versions: tuple[int, ...] = VERSIONS) -> None:
    runs = [run(major, rows) for major in versions]
    width = 22
    print(f"rows={rows} as 1,000-row transactions, each version on its own server")
    print(f"{'':<26}" + "".join(f"{'PostgreSQL ' + r.version:>{width}}" for r in runs))
    print(f"{'capture into the log':<26}" + "".join(f"{f'{r.capture_rate:,.0f} ev/s':>{width}}" for r in runs))
    print(f"{'  seconds':<26}" + "".join(f"{r.capture_seconds:>{width}.1f}" for r in runs))
    print(f"{'pg_recvlogical anchor':<26}" + "".join(f"{f'{r.anchor_rate:,.0f} rows/s':>{width}}" for r in runs))
    print(f"{'  seconds':<26}" + "".join(f"{r.anchor_seconds:>{width}.1f}" for r in runs))
    print(f"{'ratio capture / anchor':<26}" + "".join(f"{r.capture_rate / r.anchor_rate:>{width}.2f}" for r in runs))


def _arguments(argv: list[str]) -> tuple[int, tuple[int, ...]]:
    parser = argparse.ArgumentParser(prog="python -m bench.capture_versions", description=__doc__.splitlines()[0])
    parser.add_argument("rows", nargs="?", type=int, default=300_000)
    parser.add_argument("--versions", default=",".join(map(str, VERSIONS)), help="major versions, e.g. 15,18 or 14,16,17")
    arguments = parser.parse_args(argv)
    versions = tuple(int(v) for v in arguments.versions.split(",") if v.strip())
    if not versions or any(v not in range(14, 19) for v in versions):
        parser.error(f"--versions {arguments.versions!r}: give major versions from 14 to 18, comma-separated")
    return arguments.rows, versions


if __name__ == "__main__":
    main(*_arguments(sys.argv[1:]))
