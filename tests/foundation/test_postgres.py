"""The PostgreSQL fixtures and the reference migrations, against a real server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from cdc.setup import migrate
from tests.fix_pg import PgServer, chosen_pg_version

ROOT = Path(__file__).resolve().parents[2]


def test_server_is_configured_for_logical_decoding(pg_url: str) -> None:
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SHOW wal_level").fetchone() == ("logical",)
        assert int(conn.execute("SHOW max_replication_slots").fetchone()[0]) >= 10


def test_each_test_gets_its_own_database(pg_url: str, pg_server: object) -> None:
    with psycopg.connect(pg_url) as conn:
        name = conn.execute("SELECT current_database()").fetchone()[0]
    assert name.startswith("cdc_test_")
    assert pg_url.endswith("/" + name)


def test_reference_schema_and_bootstrap(reference_db: str) -> None:
    with psycopg.connect(reference_db) as conn:
        published = {
            row[0] for row in conn.execute("SELECT tablename FROM pg_publication_tables WHERE pubname = 'cdc_publication'")
        }
        assert published == {"customers", "categories", "products", "orders", "order_items"}
        assert conn.execute("SELECT pubviaroot FROM pg_publication WHERE pubname = 'cdc_publication'").fetchone() == (True,)
        role = conn.execute("SELECT rolreplication, rolcanlogin, rolsuper FROM pg_roles WHERE rolname = 'cdc_reader'").fetchone()
        assert role == (True, True, False)
        for table in published:
            assert conn.execute(
                "SELECT has_table_privilege('cdc_reader', %s, 'SELECT'), has_table_privilege('cdc_reader', %s, 'INSERT')",
                (f"public.{table}", f"public.{table}"),
            ).fetchone() == (True, False)
        types = dict(
            conn.execute("SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'products'").fetchall()
        )
        assert types["price"] == "numeric"
        assert types["attributes"] == "jsonb"
        assert types["tags"] == "ARRAY"


def test_capture_role_can_read_a_published_table(reference_db: str) -> None:
    user_url = reference_db.replace("postgres@", "cdc_reader@", 1)
    with psycopg.connect(reference_db, autocommit=True) as admin:
        admin.execute("INSERT INTO categories (name) VALUES ('books')")
    with psycopg.connect(user_url) as conn:
        assert conn.execute("SELECT name FROM categories").fetchall() == [("books",)]
        try:
            conn.execute("INSERT INTO categories (name) VALUES ('nope')")
        except psycopg.errors.InsufficientPrivilege:
            pass
        else:  # pragma: no cover - would mean the role is not least-privilege
            raise AssertionError("the capture role could write to a source table")


def test_migrations_are_idempotent_and_reversible(pg_url: str) -> None:
    migrate.upgrade(pg_url)
    migrate.upgrade(pg_url)
    migrate.downgrade(pg_url, "base")
    with psycopg.connect(pg_url) as conn:
        assert conn.execute(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename <> 'alembic_version'"
        ).fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM pg_publication").fetchone() == (0,)


def test_tables_created_later_are_readable_by_the_capture_role(reference_db: str) -> None:
    with psycopg.connect(reference_db, autocommit=True) as admin:
        admin.execute("CREATE TABLE later (id int PRIMARY KEY)")
        assert admin.execute("SELECT has_table_privilege('cdc_reader', 'public.later', 'SELECT')").fetchone() == (True,)


def test_the_server_runs_the_chosen_major_version(pg_url: str, pg_server: PgServer) -> None:
    """``CDC_TEST_PG_VERSION`` picks the server; without it the tests' own cluster runs Debian's version."""
    expected = chosen_pg_version()
    if expected is None:
        if pg_server.local is None:
            pytest.skip("the server was not started by the tests (CDC_TEST_DATABASE_URL or a container)")
        expected = int(pg_server.local.bindir.parent.name)  # .../<major>/bin, Debian's or a fetched build
    with psycopg.connect(pg_url) as conn:
        assert conn.info.server_version // 10000 == expected


@pytest.mark.parametrize("major", [14, 18])
def test_cdc_test_pg_version_runs_the_suite_on_that_version(major: int) -> None:
    result = _pytest_with_version(str(major), "tests/foundation/test_postgres.py::test_the_server_runs_the_chosen_major_version")
    assert result.returncode == 0, result.stdout[-2000:]
    assert "1 passed" in result.stdout


def test_a_bad_cdc_test_pg_version_stops_the_run_with_its_fix() -> None:
    result = _pytest_with_version("13", "tests/foundation/test_postgres.py::test_server_is_configured_for_logical_decoding")
    assert result.returncode == 4
    assert "CDC_TEST_PG_VERSION='13' is not a supported PostgreSQL major version: set one of 14, 15, 16, 17, 18" in (
        result.stdout + result.stderr
    )


def _pytest_with_version(version: str, test: str) -> subprocess.CompletedProcess[str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("CDC_")}
    env["CDC_TEST_PG_VERSION"] = version
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
