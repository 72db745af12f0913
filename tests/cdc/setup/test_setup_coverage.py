"""``cdc setup`` judges every table the publication covers or would cover before it creates anything."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from tests.cdc.helpers import execute, run_cdc, slot_names

pytestmark = pytest.mark.pg


def _publication(url: str) -> list[str] | None:
    """The tables of ``cdc_publication``, or None when it does not exist."""
    with psycopg.connect(url, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_publication WHERE pubname = 'cdc_publication'").fetchone() is None:
            return None
        rows = conn.execute(
            "SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = 'cdc_publication' ORDER BY 1"
        ).fetchall()
    return [str(row[0]) for row in rows]


def test_a_new_publication_for_all_tables_is_judged_before_it_breaks_the_applications_writes(pg_url: str, tmp_path: Path) -> None:
    execute(
        pg_url,
        "CREATE TABLE keyed (id int PRIMARY KEY, v text)",
        "CREATE TABLE nokey (a int)",
        "CREATE TABLE lines (line text)",
        "INSERT INTO nokey VALUES (1)",
    )
    for args in (("setup", "--check-only"), ("setup",)):
        result = run_cdc(pg_url, tmp_path, *args)
        assert result.returncode == 3, result.stdout + result.stderr
        errors = result.stderr.strip().splitlines()
        assert [line.split(" has ", 1)[0] for line in errors] == ["error: table public.lines", "error: table public.nokey"]
        for line in errors:
            assert "no primary key or replica identity" in line and "REPLICA IDENTITY FULL" in line
            assert "CDC_TABLES" in line, "the fix of limiting the tables should be named"
    assert _publication(pg_url) is None and slot_names(pg_url) == []
    execute(pg_url, "UPDATE nokey SET a = 2", "DELETE FROM lines")  # the application's writes still work

    # limited to CDC_TABLES, the publication covers only those tables and the others keep working
    result = run_cdc(pg_url, tmp_path, "setup", tables="public.keyed")
    assert result.returncode == 0, result.stderr
    assert _publication(pg_url) == ["public.keyed"] and slot_names(pg_url) == ["cdc_slot"]
    execute(pg_url, "UPDATE nokey SET a = 3", "DELETE FROM lines")


def test_a_table_without_a_key_passes_once_it_has_replica_identity_full(pg_url: str, tmp_path: Path) -> None:
    execute(
        pg_url,
        "CREATE TABLE keyed (id int PRIMARY KEY)",
        "CREATE TABLE nokey (a int)",
        "INSERT INTO nokey VALUES (1)",
        "ALTER TABLE nokey REPLICA IDENTITY FULL",
    )
    result = run_cdc(pg_url, tmp_path, "setup")
    assert result.returncode == 0, result.stderr
    assert "warn table public.nokey key" in result.stdout
    assert _publication(pg_url) == ["public.keyed", "public.nokey"]
    execute(pg_url, "UPDATE nokey SET a = 2")


def test_a_partition_without_a_key_is_judged_through_its_root(pg_url: str, tmp_path: Path) -> None:
    execute(
        pg_url,
        "CREATE TABLE readings (at date, v int) PARTITION BY RANGE (at)",
        "ALTER TABLE readings REPLICA IDENTITY FULL",
        "CREATE TABLE readings_2026 PARTITION OF readings FOR VALUES FROM ('2026-01-01') TO ('2027-01-01')",
    )
    result = run_cdc(pg_url, tmp_path, "setup", "--check-only")
    assert result.returncode == 3, result.stdout + result.stderr
    (error,) = result.stderr.strip().splitlines()
    assert error.startswith("error: table public.readings_2026 (a partition of public.readings) has no primary key")
    assert "ALTER TABLE public.readings_2026 REPLICA IDENTITY FULL" in error


def test_cdc_tables_that_would_capture_nothing_are_refused_before_a_slot_exists(reference_db: str, tmp_path: Path) -> None:
    execute(reference_db, "CREATE TABLE extra (id int PRIMARY KEY)")
    result = run_cdc(reference_db, tmp_path, "setup", tables="public.orders,public.extra,public.nosuch")
    assert result.returncode == 3, result.stdout + result.stderr
    extra, nosuch = result.stderr.strip().splitlines()
    assert extra.startswith("error: CDC_TABLES names public.extra, which publication cdc_publication does not publish")
    assert "ALTER PUBLICATION cdc_publication ADD TABLE public.extra" in extra
    assert nosuch.startswith("error: CDC_TABLES names public.nosuch, which is not a table")
    assert slot_names(reference_db) == []
