"""A real PostgreSQL with ``wal_level=logical`` for tests, and one fresh database per test.

The server comes from, in order: ``CDC_TEST_DATABASE_URL``; a testcontainers PostgreSQL when a Docker
engine answers; a throwaway cluster started from local binaries (:class:`local_servers.postgres.LocalPostgres`).
``CDC_TEST_PG_VERSION`` (14 to 18) picks the major version of the last two; without it they run Debian's
(15 here). Tests marked ``pgversions`` start a server of each version themselves (:func:`local_server`).
Every test that asks for :func:`pg_url` gets a database of its own, so replication slots and
publications of different tests never collide; its slots are dropped with it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest
from psycopg import sql

from local_servers.postgres import LocalPostgres, find_server_bindir

#: The major versions the project supports, each run by the ``pgversions`` tests.
PG_VERSIONS = (14, 15, 16, 17, 18)


def _docker_engine_answers() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=3)
        client.ping()
        return True
    except Exception:
        return False


def _with_database(url: str, database: str) -> str:
    """``url`` with its database name replaced."""
    base, _, _ = url.rpartition("/")
    query = ""
    if "?" in url.rpartition("/")[2]:
        query = "?" + url.rpartition("?")[2]
    return f"{base}/{database}{query}"


def chosen_pg_version() -> int | None:
    """``CDC_TEST_PG_VERSION`` as a major version (None when unset); a bad value fails the run with its fix."""
    text = os.environ.get("CDC_TEST_PG_VERSION", "").strip()
    if not text:
        return None
    if not text.isdigit() or int(text) not in PG_VERSIONS:
        raise pytest.UsageError(
            f"CDC_TEST_PG_VERSION={text!r} is not a supported PostgreSQL major version: set one of "
            f"{', '.join(map(str, PG_VERSIONS))} or unset it for this machine's own (Debian's)"
        )
    return int(text)


def pytest_configure(config: pytest.Config) -> None:
    """A bad ``CDC_TEST_PG_VERSION`` stops the run before any test, with its fix."""
    chosen_pg_version()


def local_server(major: int | None, **settings: str) -> LocalPostgres:
    """A throwaway cluster of PostgreSQL ``major`` (Debian's when None), not started yet."""
    return LocalPostgres(bindir=find_server_bindir(major), settings=settings)


@dataclass(frozen=True)
class PgServer:
    """The test server: its superuser URL, and the local cluster when tests may restart it."""

    url: str
    local: LocalPostgres | None = None


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """A PostgreSQL server configured for logical decoding, for the whole test session."""
    explicit = os.environ.get("CDC_TEST_DATABASE_URL")
    major = chosen_pg_version()
    if explicit:
        yield PgServer(explicit)
        return
    if _docker_engine_answers():
        from testcontainers.postgres import PostgresContainer

        container = PostgresContainer(f"postgres:{major or 16}", driver=None).with_command(
            "postgres -c wal_level=logical -c max_replication_slots=64 -c max_wal_senders=64 -c fsync=off"
        )
        with container:
            yield PgServer(container.get_connection_url())
        return
    server = local_server(major)
    server.start()
    try:
        yield PgServer(server.url(), server)
    finally:
        server.stop()


def _drop_database(admin_url: str, database: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = %s AND active_pid IS NOT NULL",
            (database,),
        )
        for (slot,) in admin.execute("SELECT slot_name FROM pg_replication_slots WHERE database = %s", (database,)).fetchall():
            try:
                admin.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            except psycopg.errors.ObjectInUse:
                admin.execute(
                    "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = %s",
                    (slot,),
                )
                admin.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database)))


@pytest.fixture
def pg_url(pg_server: PgServer) -> Iterator[str]:
    """Superuser URL of a new, empty database that is dropped (with its slots) after the test."""
    database = f"cdc_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server.url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    try:
        yield _with_database(pg_server.url, database)
    finally:
        _drop_database(pg_server.url, database)


@pytest.fixture
def reference_db(pg_url: str) -> str:
    """A database migrated to the reference schema with the CDC bootstrap (publication and role)."""
    from cdc.setup import migrate

    migrate.upgrade(pg_url)
    return pg_url
