"""Generated columns: on PostgreSQL 18 ``cdc setup`` never creates a publication that makes the server refuse
the application's writes (it publishes stored generated columns, and refuses a replica identity holding a
virtual one), and capture carries stored generated columns to the log exactly, in the snapshot, the stream
and a re-read; before 18 no generated column is published, and none reaches the log."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import psycopg
import pytest

from cdc.run.coordinator import Capture
from derived_views.events.schema import Column, TableSchema
from derived_views.runs.verify_values import SESSION_OPTIONS
from tests.cdc.helpers import execute, read_topic, replay, run_cdc, settings_for
from tests.fix_pg import local_server
from tests.rows import compare_rows, source_rows

pytestmark = pytest.mark.pg


@pytest.fixture(scope="module")
def pg18() -> Iterator[str]:
    """A PostgreSQL 18 server's superuser URL (its ``postgres`` database)."""
    server = local_server(18)
    url = server.start()
    try:
        yield url
    finally:
        server.stop()


@pytest.fixture
def url18(pg18: str) -> Iterator[str]:
    """A fresh database on the PostgreSQL 18 server (dropped with its slots afterwards)."""
    base = pg18.rsplit("/", 1)[0]
    with psycopg.connect(pg18, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS cdc_gen WITH (FORCE)")
        admin.execute("CREATE DATABASE cdc_gen")
    yield f"{base}/cdc_gen"
    with psycopg.connect(pg18, autocommit=True) as admin:
        for (slot,) in admin.execute("SELECT slot_name FROM pg_replication_slots WHERE database = 'cdc_gen'").fetchall():
            admin.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        admin.execute("DROP DATABASE cdc_gen WITH (FORCE)")


def _setup_errors(url: str, data_dir: Path, *args: str) -> list[str]:
    result = run_cdc(url, data_dir, "setup", *args)
    assert result.returncode == 3, result.stdout + result.stderr
    return result.stderr.strip().splitlines()


def _rows(url: str, table: str) -> dict[bytes | None, dict[str, object]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(f"SELECT to_jsonb(t) FROM {table} t").fetchall()  # noqa: S608 - a test's own names
    return {orjson.dumps({"id": row[0]["id"]}): row[0] for row in rows}


def test_setup_on_18_publishes_stored_generated_columns_and_refuses_virtual_ones_in_the_identity(
    url18: str, tmp_path: Path
) -> None:
    execute(
        url18,
        "CREATE TABLE g (a int, b int GENERATED ALWAYS AS (a * 2) STORED)",
        "ALTER TABLE g REPLICA IDENTITY FULL",
        "CREATE TABLE k (id int PRIMARY KEY, a int, b int GENERATED ALWAYS AS (a * 2) STORED, "
        "v int GENERATED ALWAYS AS (a + 1) VIRTUAL)",
        "CREATE TABLE virt (a int, b int GENERATED ALWAYS AS (a * 3) VIRTUAL)",
        "ALTER TABLE virt REPLICA IDENTITY FULL",
        "INSERT INTO g VALUES (1), (2)",
        "INSERT INTO k (id, a) VALUES (1, 10), (2, 20)",
    )
    # a virtual generated column in a replica identity: no publication lets the application update it
    (error,) = _setup_errors(url18, tmp_path)
    assert error.startswith(
        "error: the replica identity of public.virt holds the virtual generated column b, which publication "
        "cdc_publication does not publish"
    ), error
    assert "REPLICA IDENTITY DEFAULT" in error, error
    with psycopg.connect(url18) as conn:
        assert conn.execute("SELECT count(*) FROM pg_publication").fetchone() == (0,)

    # an existing publication that leaves stored generated columns out is refused with the option that fixes it
    execute(url18, "DROP TABLE virt", "CREATE PUBLICATION cdc_publication FOR ALL TABLES")
    (error,) = _setup_errors(url18, tmp_path, "--check-only")
    assert "the replica identity of public.g holds the stored generated column b" in error, error
    assert "ALTER PUBLICATION cdc_publication SET (publish_generated_columns = stored)" in error, error

    # the publication setup creates publishes them: the application's writes go on
    execute(url18, "DROP PUBLICATION cdc_publication")
    result = run_cdc(url18, tmp_path, "setup")
    assert result.returncode == 0, result.stdout + result.stderr
    execute(url18, "DELETE FROM g WHERE a = 2", "UPDATE g SET a = a + 1 WHERE a = 1")

    # and capture carries them: snapshot, stream, and a stored generated column added later (a rewrite)
    settings = settings_for(url18, tmp_path)
    Capture(settings, once=True).run()
    published = ("id", "a", "b")  # the virtual column is never published
    assert replay(tmp_path, "cdc.public.k") == {key: {n: row[n] for n in published} for key, row in _rows(url18, "k").items()}
    execute(url18, "UPDATE k SET a = 11 WHERE id = 1", "INSERT INTO k (id, a) VALUES (3, 30)", "UPDATE g SET a = 5")
    Capture(settings, once=True).run()
    execute(url18, "ALTER TABLE k ADD COLUMN c int GENERATED ALWAYS AS (a * 5) STORED")
    assert Capture(settings, once=True).run().tables_added == 1
    expected = {key: {n: row[n] for n in ("id", "a", "b", "c")} for key, row in _rows(url18, "k").items()}
    assert replay(tmp_path, "cdc.public.k", strict=False) == expected
    assert sorted(row["b"] for row in expected.values()) == [22, 40, 60]
    keyless = [orjson.loads(r.value) for r in read_topic(tmp_path, "cdc.public.g") if r.value is not None]
    assert [(value["op"], value["after"]) for value in keyless] == [("r", {"a": 2, "b": 4}), ("u", {"a": 5, "b": 10})]

    # a publication that stops publishing them is a changed rule: its tables are read again without them
    execute(url18, "ALTER PUBLICATION cdc_publication SET (publish_generated_columns = none)")
    assert Capture(settings, once=True).run().tables_added == 2
    assert replay(tmp_path, "cdc.public.k", strict=False) == {
        key: {n: row[n] for n in ("id", "a")} for key, row in _rows(url18, "k").items()
    }


def test_before_18_no_generated_column_reaches_the_log_and_verify_agrees(pg_url: str, tmp_path: Path) -> None:
    execute(
        pg_url,
        "CREATE TABLE k (id int PRIMARY KEY, a int, b int GENERATED ALWAYS AS (a * 2) STORED)",
        "ALTER TABLE k REPLICA IDENTITY FULL",
        "INSERT INTO k (id, a) VALUES (1, 10)",
    )
    with psycopg.connect(pg_url) as conn:
        if conn.info.server_version >= 180000:
            pytest.skip("PostgreSQL 18 publishes stored generated columns when asked")
    result = run_cdc(pg_url, tmp_path, "setup")
    assert result.returncode == 0, result.stdout + result.stderr
    execute(pg_url, "UPDATE k SET a = 11")  # never refused before 18
    Capture(settings_for(pg_url, tmp_path), once=True).run()
    view = list(replay(tmp_path, "cdc.public.k").values())
    assert view == [{"id": 1, "a": 11}]
    schema = TableSchema("public", "k", "cdc.public.k", (Column("id", "int4", key=True), Column("a", "int4")))
    with psycopg.connect(pg_url, options=SESSION_OPTIONS) as conn:
        assert compare_rows("public.k", schema, source_rows(conn, schema), view) == []
