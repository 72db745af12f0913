"""A column added with a constant default, end to end: capture reads nothing again, the views give every
older row the value in the commit of the batch that reaches the fact (current, history, search, cache),
``cdc verify`` agrees, a rebuild by replay gives the same tables, and a batch applied again changes
nothing. A volatile default is still read again, and verifies too."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import pytest

from cdc.run.coordinator import Capture
from tests.cdc.helpers import execute, settings_for
from tests.derived_views.pipeline import context, read_every_view_table, rows, sync, verify_views

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.pg, pytest.mark.spark]

VIEWS = """
[search.stock]
root = "public.stock"
text = ["v"]
stored = ["v"]

[cache.stock]
root = "public.stock"
"""
ALL = ["warehouse", "search.stock", "cache.stock"]
ADDED = (
    "ALTER TABLE stock ADD COLUMN flag int DEFAULT 7",
    "ALTER TABLE stock ADD COLUMN label text DEFAULT 'plain label'",
    "ALTER TABLE stock ADD COLUMN price numeric(10,2) DEFAULT 12.345",
    "ALTER TABLE stock ADD COLUMN at timestamptz DEFAULT '2020-01-01 12:00:00.123456+02'",
    "ALTER TABLE stock ADD COLUMN ok bool DEFAULT true",
    "ALTER TABLE stock ADD COLUMN tags text[] DEFAULT '{x,\"y z\"}'",
    "ALTER TABLE stock ADD COLUMN doc jsonb DEFAULT '{\"k\": [1, 2.50]}'",
    "ALTER TABLE stock ADD COLUMN since date DEFAULT 'infinity'",  # a value Spark's date cannot hold: text
)


def _by_id(found: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {int(row["id"]): row for row in found}


def _data(row: dict[str, Any]) -> dict[str, Any]:
    """A row's data columns (no metadata)."""
    return {name: value for name, value in row.items() if not name.startswith("_cdc")}


def test_a_stored_default_reaches_every_view_in_one_batch(
    spark: SparkSession, reference_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deltalake import DeltaTable

    from derived_views.runs.runner import latest
    from derived_views.source import pending
    from derived_views.source.as_of import LogAsOf
    from derived_views.source.table_step import TableStep
    from derived_views.views import warehouse
    from derived_views.write.steps import apply_state

    views = tmp_path / "views.toml"
    views.write_text(VIEWS)
    execute(
        reference_db,
        "CREATE TABLE stock (id int PRIMARY KEY, v text)",
        "INSERT INTO stock SELECT g, 'item ' || g FROM generate_series(1, 300) g",
        "ALTER PUBLICATION cdc_publication ADD TABLE stock",
    )
    settings = settings_for(reference_db, tmp_path / "data", tables="public.stock", views_file=str(views))
    Capture(settings, once=True).run()
    ctx = context(spark, settings)
    sync(ctx, ALL)
    # a batch before the column: its rows' versions end before it
    execute(reference_db, "UPDATE stock SET v = 'early' WHERE id IN (1, 2)")
    Capture(settings, once=True).run()
    sync(ctx, ALL)
    # the same batch holds changes before the column, the column and changes after it, and a transaction
    # that changes a row, adds a column and changes another row
    execute(
        reference_db,
        "UPDATE stock SET v = 'before' WHERE id IN (2, 3)",
        "DELETE FROM stock WHERE id = 4",
        *ADDED,
    )
    with psycopg.connect(reference_db, autocommit=True) as conn, conn.transaction():
        conn.execute("UPDATE stock SET v = 'same transaction, before' WHERE id = 5")
        conn.execute("ALTER TABLE stock ADD COLUMN late int DEFAULT 42")
        conn.execute("UPDATE stock SET v = 'same transaction, after', late = 43 WHERE id = 6")
    execute(
        reference_db,
        "UPDATE stock SET flag = 8, label = 'changed', tags = NULL WHERE id IN (3, 10)",
        "INSERT INTO stock (id, v) VALUES (1000, 'new')",
        "UPDATE stock SET v = 'after' WHERE id = 11",
    )
    assert Capture(settings, once=True).run().tables_added == 0
    current = warehouse.current_path(ctx, "public.stock")
    history = warehouse.history_path(ctx, "public.stock")
    before = {current: ctx.progress(current)}
    sync(ctx, ALL)
    assert verify_views(ctx, reference_db, ALL) > 0

    # deltalake reads the value on the rows older than the column
    table = DeltaTable(current.removeprefix("file://")).to_pandas().set_index("id")
    assert len(table) == 300
    assert table.loc[100, "flag"] == 7 and table.loc[100, "label"] == "plain label" and str(table.loc[100, "price"]) == "12.35"
    assert table.loc[5, "late"] == 42 and table.loc[6, "late"] == 43 and table.loc[3, "flag"] == 8
    assert list(table.loc[100, "tags"]) == ["x", "y z"] and table.loc[3, "tags"] is None
    assert table.loc[1000, "flag"] == 7  # an insert after the column carries the default itself
    assert set(table["since"]) == {"infinity"}

    # history: a version current at the column's position holds the value, one ended before it null
    versions = _by_id(rows(spark, history, "id = 2 AND v = 'item 2'")), _by_id(rows(spark, history, "id = 2 AND v = 'early'"))
    assert versions[0][2]["flag"] is None and versions[1][2]["flag"] is None  # both ended before the column
    now = _by_id(rows(spark, history, "_cdc_is_current"))
    assert {now[i]["flag"] for i in (1, 2, 100)} == {7} and now[3]["flag"] == 8
    (old_3,) = rows(spark, history, "id = 3 AND v = 'before' AND NOT _cdc_is_current")
    assert old_3["flag"] == 7 and old_3["_cdc_valid_to_lsn"] is not None  # current at the column, ended after it
    assert [r["late"] for r in rows(spark, history, "id = 5 AND _cdc_is_current")] == [42]
    # row 6's first version ends at the column's position (the change after the ALTER in its transaction):
    # current at it, so it holds the value; its next version carries its own
    assert sorted(r["late"] for r in rows(spark, history, "id = 6")) == [42, 43]

    # search documents and cache entries carry the value too
    docs = _by_id(rows(spark, ctx.path("search", "stock", "documents")))
    assert docs[100]["flag"] == 7 and docs[3]["flag"] == 8
    entries = rows(spark, ctx.path("cache", "stock", "entries"))
    assert all('"flag":7' in e["value"] or '"flag":8' in e["value"] for e in entries) and len(entries) == 300

    # the batch applied again to the current table (as if its progress were lost) changes nothing (a
    # history table's progress is in the commit that inserts its versions, so it never applies one twice)
    kept = {path: sorted(map(_data, rows(spark, path)), key=str) for path in (current, history)}
    watermark = latest(ctx)
    assert watermark is not None
    ctx.set_progress(current, before[current])
    schema = ctx.schemas(watermark)["public.stock"]
    apply_state(ctx, TableStep(LogAsOf(ctx.log, watermark), [schema.topic], current), schema, warehouse.dead_letter_path(ctx))
    assert sorted(map(_data, rows(spark, current)), key=str) == kept[current]

    # a rebuild by replay (cdc rebuild) gives the same tables, read in the driver or written by one Spark
    # job (rebuild_in_one_pass), and verify still agrees
    sync(ctx, ["warehouse"], replace=True)
    assert {path: sorted(map(_data, rows(spark, path)), key=str) for path in (current, history)} == kept
    with monkeypatch.context() as patched:
        patched.setattr(pending, "DRIVER_READ_LIMIT", 0)
        sync(ctx, ["warehouse"], replace=True)
    assert {path: sorted(map(_data, rows(spark, path)), key=str) for path in (current, history)} == kept
    assert verify_views(ctx, reference_db, ["warehouse"]) > 0
    assert read_every_view_table(tmp_path / "data")


def test_a_volatile_default_is_read_again_and_verifies(spark: SparkSession, reference_db: str, tmp_path: Path) -> None:
    from derived_views.views import warehouse

    execute(
        reference_db,
        "CREATE TABLE stamped (id int PRIMARY KEY, v text)",
        "INSERT INTO stamped SELECT g, 'item ' || g FROM generate_series(1, 50) g",
        "ALTER PUBLICATION cdc_publication ADD TABLE stamped",
    )
    settings = settings_for(reference_db, tmp_path, tables="public.stamped")
    Capture(settings, once=True).run()
    ctx = context(spark, settings)
    sync(ctx, ["warehouse"])
    execute(
        reference_db,
        "ALTER TABLE stamped ADD COLUMN at timestamptz DEFAULT clock_timestamp()",
        "ALTER TABLE stamped ADD COLUMN u uuid DEFAULT gen_random_uuid()",
        "UPDATE stamped SET v = 'after' WHERE id = 1",
    )
    assert Capture(settings, once=True).run().tables_added == 1
    sync(ctx, ["warehouse"])
    assert verify_views(ctx, reference_db, ["warehouse"]) > 0
    found = rows(spark, warehouse.current_path(ctx, "public.stamped"))
    assert len(found) == 50 and all(row["at"] is not None and row["u"] is not None for row in found)
