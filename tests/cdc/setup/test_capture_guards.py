"""``cdc capture`` refuses a source it cannot capture with setup's hints, before it makes a slot."""

from __future__ import annotations

from pathlib import Path

import pytest

from local_servers.postgres import LocalPostgres
from tests.cdc.helpers import execute, run_cdc, slot_names

pytestmark = pytest.mark.pg


def test_cdc_tables_that_would_capture_nothing_are_refused(reference_db: str, tmp_path: Path) -> None:
    execute(reference_db, "CREATE TABLE extra (id int PRIMARY KEY)")
    result = run_cdc(reference_db, tmp_path, "capture", "--once", tables="public.orders,public.extra")
    assert result.returncode == 3, result.stderr
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert error.startswith("error: CDC_TABLES names public.extra, which publication cdc_publication does not publish")
    assert "ALTER PUBLICATION cdc_publication ADD TABLE public.extra" in error
    result = run_cdc(reference_db, tmp_path, "capture", "--once", tables="public.nosuch")
    assert result.returncode == 3, result.stderr
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert error.startswith("error: CDC_TABLES names public.nosuch, which is not a table")
    assert slot_names(reference_db) == []


def test_missing_replication_privilege_gets_setups_hint(reference_db: str, tmp_path: Path) -> None:
    execute(
        reference_db,
        "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'plain') THEN CREATE ROLE plain LOGIN; END IF; END $$",
        "GRANT SELECT ON ALL TABLES IN SCHEMA public TO plain",
    )
    result = run_cdc(reference_db.replace("postgres@", "plain@", 1), tmp_path, "capture", "--once")
    assert result.returncode == 3, result.stderr
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "role plain lacks the REPLICATION privilege; run ALTER ROLE plain REPLICATION" in error
    assert "cdc setup" in error
    assert slot_names(reference_db) == []


def test_a_dropped_publication_gets_setups_hint(reference_db: str, tmp_path: Path) -> None:
    assert run_cdc(reference_db, tmp_path, "capture", "--once").returncode == 0
    execute(reference_db, "DROP PUBLICATION cdc_publication", "INSERT INTO categories (name) VALUES ('lost')")
    result = run_cdc(reference_db, tmp_path, "capture", "--once")
    assert result.returncode == 3, result.stderr
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert error.startswith("error: publication cdc_publication does not exist") and "run `cdc setup`" in error


def test_wal_level_replica_gets_setups_hint(tmp_path: Path) -> None:
    server = LocalPostgres(settings={"wal_level": "replica"})
    try:
        url = server.start()
        execute(url, "CREATE TABLE t (id int PRIMARY KEY)", "CREATE PUBLICATION cdc_publication FOR TABLE t")
        result = run_cdc(url, tmp_path, "capture", "--once")
    finally:
        server.stop()
    assert result.returncode == 3, result.stderr
    assert [line for line in result.stderr.splitlines() if line.startswith("error:")] == [
        "error: wal_level is replica, logical decoding needs logical; set wal_level = logical in postgresql.conf "
        "(or ALTER SYSTEM SET wal_level = logical) and restart PostgreSQL; `cdc setup --check-only` checks every "
        "prerequisite of capture"
    ]
