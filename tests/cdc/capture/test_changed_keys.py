"""A table whose events are keyed by other columns since its snapshot (a new primary key, another replica
identity index, a renamed key column) is read again: no row stays in the log under its old key, neither
for a consumer applying the events nor for compaction (every old key gets a tombstone)."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import orjson
import psycopg
import pytest

from cdc.capture.snapshot_writer import held_keys
from cdc.config.settings import Settings
from cdc.observe.lag import measure
from cdc.observe.lag_report import JSON_SCHEMA
from cdc.run.coordinator import Capture
from log_store import LogStore
from tests.cdc.helpers import execute, replay, settings_for

pytestmark = pytest.mark.pg

TABLES = ("pk", "ident", "renamed")


def _source(url: str, table: str, key: str) -> dict[bytes | None, dict[str, object]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(f"SELECT to_jsonb(t) FROM {table} t").fetchall()  # noqa: S608 - a test's own names
    return {orjson.dumps({key: row[0][key]}): row[0] for row in rows}


def _held(data_dir: Path, table: str) -> list[bytes]:
    """The keys compaction keeps a row of (their latest record is not a tombstone)."""
    with LogStore.open(data_dir / "log") as log:
        return sorted(held_keys(log, f"cdc.public.{table}"))


def _owed(settings: Settings) -> tuple[list[str], int]:
    """The tables `cdc lag` names as read again for a key change (``log.key_changed``), and its warnings of them."""
    report = measure(settings)
    jsonschema.validate(report.to_dict(), JSON_SCHEMA)
    warned = [w for w in report.warnings if "primary key or replica identity index changed" in w]
    assert [w.split(":")[0] for w in warned] == report.log.key_changed, warned
    return report.log.key_changed, len(warned)


def test_a_new_primary_key_or_identity_index_leaves_no_row_under_the_old_key(pg_url: str, tmp_path: Path) -> None:
    execute(
        pg_url,
        "CREATE TABLE pk (a int PRIMARY KEY, b int NOT NULL UNIQUE, v text)",
        "CREATE TABLE ident (a int NOT NULL, b int NOT NULL, v text)",
        "CREATE UNIQUE INDEX ident_a ON ident (a)",
        "CREATE UNIQUE INDEX ident_b ON ident (b)",
        "ALTER TABLE ident REPLICA IDENTITY USING INDEX ident_a",
        "CREATE TABLE renamed (id int PRIMARY KEY, v text)",
        *(f"INSERT INTO {t} SELECT g, 100 + g, 'v' || g FROM generate_series(1, 5) g" for t in ("pk", "ident")),
        "INSERT INTO renamed SELECT g, 'v' || g FROM generate_series(1, 5) g",
        "CREATE PUBLICATION cdc_publication FOR TABLE pk, ident, renamed",
    )
    settings = settings_for(pg_url, tmp_path)
    Capture(settings, once=True).run()
    assert replay(tmp_path, "cdc.public.pk") == _source(pg_url, "pk", "a")

    execute(
        pg_url,
        "ALTER TABLE pk DROP CONSTRAINT pk_pkey, ADD PRIMARY KEY (b)",
        "ALTER TABLE ident REPLICA IDENTITY USING INDEX ident_b",
        "ALTER TABLE renamed RENAME COLUMN id TO ident",
        *(f"UPDATE {t} SET v = 'changed' WHERE a = 1" for t in ("pk", "ident")),
        *(f"DELETE FROM {t} WHERE a = 2" for t in ("pk", "ident")),
        "UPDATE renamed SET v = 'changed' WHERE ident = 1",
        "DELETE FROM renamed WHERE ident = 2",
    )
    assert _owed(settings) == ([f"public.{t}" for t in sorted(TABLES)], 3)  # cdc lag says why they are read again
    stats = Capture(settings, once=True).run()
    for table, key in (("pk", "b"), ("ident", "b"), ("renamed", "ident")):
        source = _source(pg_url, table, key)
        assert replay(tmp_path, f"cdc.public.{table}", strict=False) == source, table
        assert _held(tmp_path, table) == sorted(source), table
    assert stats.tables_added == len(TABLES)
    assert _owed(settings) == ([], 0)

    # another replica identity that keeps the primary key as the events' key reads nothing again
    execute(pg_url, "ALTER TABLE pk REPLICA IDENTITY FULL", "UPDATE pk SET v = 'again' WHERE b = 103")
    assert _owed(settings) == ([], 0)
    assert Capture(settings, once=True).run().tables_added == 0


def test_verify_reports_a_row_the_view_holds_under_an_old_key_too() -> None:
    from derived_views.events.schema import Column, TableSchema
    from tests.rows import compare_rows

    schema = TableSchema("public", "pk", "cdc.public.pk", (Column("a", "int4"), Column("b", "int4", key=True)))
    source = [{"a": 1, "b": 101}]
    assert compare_rows("public.pk", schema, source, source) == []
    # the row under its old key {"a": 1} and under its new key {"b": 101}: the same values twice
    assert compare_rows("public.pk", schema, source, source * 2) == ["public.pk: key ('101',) is in the view 2 times"]
