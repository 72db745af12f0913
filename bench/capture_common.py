"""Shared set-up of the capture benchmarks: a throwaway cluster, a database, a table, a timer."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

import bench.ordinary_pages  # noqa: F401 - before anything loads pyarrow (see that module)
from cdc.config.settings import Settings, load_settings
from cdc.setup import migrate
from local_servers.postgres import LocalPostgres

TABLE = "CREATE TABLE bench (id bigint PRIMARY KEY, name text NOT NULL, amount numeric(12,2), at timestamptz DEFAULT now())"


@contextmanager
def bench_cluster(server: LocalPostgres | None = None) -> Iterator[tuple[LocalPostgres, str, Path]]:
    """A throwaway cluster (``server``, not started yet, or one of this machine's newest PostgreSQL) with
    database ``bench`` migrated to the reference schema, and a data directory.

    Yields the server, the database URL and the directory; both are removed afterwards.
    """
    server = server or LocalPostgres()
    server.start()
    data_dir = Path(tempfile.mkdtemp(prefix="cdc-bench-"))
    try:
        with psycopg.connect(server.url(), autocommit=True) as admin:
            admin.execute("CREATE DATABASE bench")
        url = server.url("bench")
        migrate.upgrade(url)
        yield server, url, data_dir
    finally:
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


@contextmanager
def bench_database(server: LocalPostgres | None = None) -> Iterator[tuple[LocalPostgres, str, Settings]]:
    """A local cluster (as for :func:`bench_cluster`), a migrated database with table ``bench`` in the
    publication, and settings."""
    with bench_cluster(server) as (server, url, data_dir):
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(TABLE)
            conn.execute("ALTER PUBLICATION cdc_publication ADD TABLE bench")
        yield server, url, load_settings(database_url=url, data_dir=str(data_dir), tables="public.bench")


@contextmanager
def timed() -> Iterator[list[float]]:
    """Yields a list that holds the elapsed seconds once the block ends."""
    box: list[float] = []
    start = time.perf_counter()
    yield box
    box.append(time.perf_counter() - start)


def recvlogical_seconds(server: LocalPostgres, url: str, slot: str, program: Path | None = None) -> float:
    """Seconds ``pg_recvlogical`` (``program``, else the one beside the server's) takes to decode slot ``slot``
    with pgoutput, up to the WAL position current now, into /dev/null: the walsender's own ceiling, the
    capture benchmarks' anchor."""
    import subprocess

    from cdc.capture.lsn import Lsn

    with psycopg.connect(url, autocommit=True) as conn:
        end = Lsn.parse(str(conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]))  # type: ignore[index]
        conn.execute("CHECKPOINT")
    with timed() as anchor:
        subprocess.run(
            [
                str(program or server.bindir / "pg_recvlogical"),
                "-d",
                url,
                "--slot",
                slot,
                "--start",
                "--no-loop",
                "-o",
                "proto_version=1",
                "-o",
                "publication_names=cdc_publication",
                "-E",
                str(end),
                "-f",
                "/dev/null",
            ],
            check=True,
            capture_output=True,
        )
    return anchor[0]


def insert_rows(url: str, rows: int, per_transaction: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for first in range(1, rows + 1, per_transaction):
            conn.execute(
                "INSERT INTO bench (id, name, amount) SELECT g, 'name ' || g, g * 1.25 "
                "FROM generate_series(%s::bigint, %s::bigint) g",
                (first, min(first + per_transaction - 1, rows)),
            )
