"""DDL mixed with changes, step by step through the whole pipeline, every table verified after each step.

The script is the kind of history a production schema goes through: columns added, renamed, retyped,
dropped and added again under the same name, replica identity switched to FULL and to an index while
changes stream, a key update rolled back inside a subtransaction, keys stored out of line, a table
renamed while published, truncates. After every step capture reads what the source committed, the
warehouse syncs, and ``verify`` compares every table (current state and the history's current versions)
with the source in one snapshot.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.derived_views.pipeline import context, execute, rows, settings_for, sync, through, verify_views

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from derived_views.write.context import ViewContext

pytestmark = [pytest.mark.pg, pytest.mark.spark, pytest.mark.slow]

LONG = "(SELECT string_agg(md5(g::text || '{seed}'), '') FROM generate_series(1, 70) g)"

#: The tables the script changes (conf_k's key is stored out of line)
TABLES = (
    "CREATE TABLE conf_a (id int PRIMARY KEY, name text, qty int, price numeric(8, 2), tags text[], doc jsonb, body text)",
    "CREATE TABLE conf_b (id bigint PRIMARY KEY, a_id int, note varchar(20))",
    "CREATE TABLE conf_k (k text PRIMARY KEY, v int)",
    "ALTER TABLE conf_k ALTER COLUMN k SET STORAGE EXTERNAL",
)

#: (what the step does, its statements); each step ends with capture, a sync and a verify
SCRIPT: list[tuple[str, list[str]]] = [
    (
        "rows, and a key update rolled back in a subtransaction",
        [
            "INSERT INTO conf_a SELECT g, 'name ' || g, g, g * 1.25, ARRAY['t' || g], jsonb_build_object('g', g), "
            "repeat('body', 10) FROM generate_series(1, 6) g",
            "INSERT INTO conf_b SELECT g, g % 3 + 1, 'note ' || g FROM generate_series(1, 5) g",
            f"INSERT INTO conf_k SELECT {LONG.format(seed='k')} || g, g FROM generate_series(1, 3) g",
            "BEGIN; UPDATE conf_a SET qty = 100 WHERE id = 1; SAVEPOINT s; UPDATE conf_a SET id = 1001 WHERE id = 1; "
            "UPDATE conf_b SET id = 1001 WHERE id = 1; ROLLBACK TO SAVEPOINT s; UPDATE conf_a SET id = 2002 WHERE id = 2; "
            "COMMIT",
        ],
    ),
    (
        "a column added, then renamed, while rows change",
        [
            "ALTER TABLE conf_a ADD COLUMN added int",
            "UPDATE conf_a SET added = id * 10 WHERE id <= 3",
            "ALTER TABLE conf_a RENAME COLUMN name TO title",
            "UPDATE conf_a SET title = 'renamed' WHERE id = 3",
        ],
    ),
    (
        "columns retyped: a widening, a scale change, text to integer with USING",
        [
            "ALTER TABLE conf_a ALTER COLUMN qty TYPE bigint",
            "UPDATE conf_a SET qty = 9000000000 WHERE id = 4",
            "ALTER TABLE conf_a ALTER COLUMN price TYPE numeric(12, 4)",
            "ALTER TABLE conf_b ALTER COLUMN note TYPE text",
            "ALTER TABLE conf_b ADD COLUMN code varchar(10)",
            "UPDATE conf_b SET code = id::text",
            "ALTER TABLE conf_b ALTER COLUMN code TYPE int USING code::int",
            "UPDATE conf_b SET code = code + 100 WHERE id = 2",
        ],
    ),
    (
        "a column dropped and added again under the same name, after a change capture has not read yet",
        [
            "UPDATE conf_a SET qty = qty + 1 WHERE id = 6",
            "ALTER TABLE conf_a DROP COLUMN added",
            "ALTER TABLE conf_a ADD COLUMN added text",
            "UPDATE conf_a SET added = 'again' WHERE id = 4",
        ],
    ),
    (
        "replica identity FULL, then an index, while rows change",
        [
            "ALTER TABLE conf_b REPLICA IDENTITY FULL",
            "UPDATE conf_b SET note = 'full' WHERE id = 3",
            "DELETE FROM conf_b WHERE id = 4",
            "ALTER TABLE conf_b ALTER COLUMN a_id SET NOT NULL",
            "CREATE UNIQUE INDEX conf_b_identity ON conf_b (id, a_id)",
            "ALTER TABLE conf_b REPLICA IDENTITY USING INDEX conf_b_identity",
            "UPDATE conf_b SET note = 'index' WHERE id = 2",
            "UPDATE conf_b SET a_id = 9 WHERE id = 3",
            "DELETE FROM conf_b WHERE id = 5",
            "INSERT INTO conf_b (id, a_id, note, code) VALUES (6, 1, 'new', 6)",
        ],
    ),
    (
        "changes before and after a rename and a type change inside one transaction",
        [
            "BEGIN; UPDATE conf_a SET title = 'before' WHERE id = 5; ALTER TABLE conf_a RENAME COLUMN title TO headline; "
            "ALTER TABLE conf_a ALTER COLUMN qty TYPE numeric(20, 0); UPDATE conf_a SET headline = 'after', qty = 1 "
            "WHERE id = 6; COMMIT",
        ],
    ),
    (
        "TOASTed keys: updates that leave them unchanged, a key change, a delete",
        [
            "UPDATE conf_k SET v = v + 10",
            f"UPDATE conf_k SET k = {LONG.format(seed='changed')} WHERE v = 11",
            "DELETE FROM conf_k WHERE v = 12",
            "UPDATE conf_a SET qty = qty + 1 WHERE id = 5",  # leaves body unchanged
        ],
    ),
    (
        "a published table renamed, and a truncate",
        [
            "ALTER TABLE conf_b RENAME TO conf_b2",
            "UPDATE conf_b2 SET note = 'after rename' WHERE id = 2",
            "TRUNCATE conf_k",
            "INSERT INTO conf_k VALUES ('short', 1)",
        ],
    ),
]


def test_a_mixed_ddl_and_dml_script_keeps_every_table_exact_after_every_step(
    spark: SparkSession, pg_url: str, tmp_path: Path
) -> None:
    from derived_views.views import warehouse

    execute(pg_url, *TABLES, "CREATE PUBLICATION cdc_publication FOR ALL TABLES")
    settings = settings_for(pg_url, tmp_path)
    ctx = context(spark, settings)
    compared = through(settings, ctx)
    for what, statements in SCRIPT:
        execute(pg_url, *statements)
        try:
            compared += through(settings, ctx)
        except AssertionError as exc:
            raise AssertionError(f"after the step '{what}': {exc}") from exc
    assert compared > 40
    # versions from before the renames hold their value under the newest name
    assert all(row["headline"] for row in rows(spark, warehouse.history_path(ctx, "public.conf_a"), "_cdc_op <> 'd'"))
    kept = {row["id"]: row["added"] for row in rows(spark, warehouse.current_path(ctx, "public.conf_a"))}
    assert kept == {1: None, 3: None, 4: "again", 5: None, 6: None, 2002: None}
    # a rename and a retype rewrite a history table whole, and keep its partitioning
    assert _history_partitions(ctx) == HISTORY_PARTITIONS
    # a rebuild by replay reads every event with the columns of its own position and verifies too
    sync(ctx, ["warehouse"], replace=True)
    verify_views(ctx, pg_url, ["warehouse"])
    assert _history_partitions(ctx) == HISTORY_PARTITIONS


#: The partition columns of the history tables the script renames and retypes columns of.
HISTORY_PARTITIONS = {"public.conf_a": ["_cdc_is_current"], "public.conf_b": ["_cdc_is_current"]}


def _history_partitions(ctx: ViewContext) -> dict[str, list[str]]:
    """The partition columns of the history tables of :data:`HISTORY_PARTITIONS`, by source table."""
    from deltalake import DeltaTable

    from derived_views.views import warehouse

    return {name: DeltaTable(warehouse.history_path(ctx, name)).metadata().partition_columns for name in HISTORY_PARTITIONS}
