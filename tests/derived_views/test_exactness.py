"""Exact through DDL, TOASTed keys and edge values: PostgreSQL -> capture -> log -> Spark -> Delta -> verify.

Each test is one way a real workload used to stop the pipeline or lose rows: a key stored out of line,
a column that changes type, old events read with a newer schema, values at the edges of their types.
Verify compares the source with the current-state table and with the history table's current versions.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
import pytest

from tests.cdc.helpers import read_topic
from tests.derived_views.pipeline import (
    capture,
    context,
    dead_letters,
    execute,
    rows,
    settings_for,
    sync,
    through,
    verify_views,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.pg, pytest.mark.spark, pytest.mark.slow]

#: ~2.2 kB of md5 text: incompressible, and stored out of line with STORAGE EXTERNAL, yet short enough
#: for a btree key
LONG_KEY = "(SELECT string_agg(md5(g::text || '{seed}'), '') FROM generate_series(1, 70) g)"
#: 100 kB that compresses to about 2.2 kB: stored out of line (compressed), and small enough for the index
HUGE_KEY = "(SELECT string_agg(md5(g::text || '{seed}'), '') FROM generate_series(1, 30) g) || repeat('x', 99040)"


def test_a_toasted_key_keeps_its_key_through_updates_key_changes_and_deletes(
    spark: SparkSession, pg_url: str, tmp_path: Path
) -> None:
    """An update that leaves a TOASTed key unchanged gets the key from the old tuple (never null), so a
    later key change and delete find the row; a 100 kB key under REPLICA IDENTITY FULL too."""
    from derived_views.views import warehouse

    execute(
        pg_url,
        "CREATE TABLE tk (k text PRIMARY KEY, other int)",
        "ALTER TABLE tk ALTER COLUMN k SET STORAGE EXTERNAL",
        "CREATE TABLE big_key (k text PRIMARY KEY, other int)",
        "ALTER TABLE big_key REPLICA IDENTITY FULL",
        "CREATE PUBLICATION cdc_publication FOR ALL TABLES",
        f"INSERT INTO tk SELECT {LONG_KEY.format(seed='a')} || g, g FROM generate_series(1, 3) g",
        f"INSERT INTO big_key SELECT {HUGE_KEY.format(seed='a')} || g, g FROM generate_series(1, 2) g",
    )
    settings = settings_for(pg_url, tmp_path)
    ctx = context(spark, settings)
    through(settings, ctx)
    execute(pg_url, "UPDATE tk SET other = other + 10", "UPDATE big_key SET other = other + 10")
    assert through(settings, ctx) == 5
    execute(
        pg_url,
        f"UPDATE tk SET k = {LONG_KEY.format(seed='b')} WHERE other = 11",  # the key changes: found in the log
        "DELETE FROM tk WHERE other = 12",
        f"UPDATE big_key SET k = {HUGE_KEY.format(seed='b')} WHERE other = 11",
        "DELETE FROM big_key WHERE other = 12",
    )
    assert through(settings, ctx) == 3
    for topic in ("cdc.public.tk", "cdc.public.big_key"):
        keys = [orjson.loads(r.key) for r in read_topic(tmp_path, topic) if r.key is not None]
        assert keys and all(isinstance(key["k"], str) and len(key["k"]) > 2000 for key in keys), topic
    # versions: the reads, the updates, the key change (a delete and a create), the delete
    for table, versions, current in (("public.tk", 3 + 3 + 2 + 1, 2), ("public.big_key", 2 + 2 + 2 + 1, 1)):
        history = rows(spark, warehouse.history_path(ctx, table))
        assert all(row["k"] is not None for row in history) and len(history) == versions
        assert len(rows(spark, warehouse.current_path(ctx, table))) == current


def test_a_column_type_change_keeps_every_table_syncing_and_a_failing_table_fails_alone(
    spark: SparkSession, pg_url: str, tmp_path: Path
) -> None:
    """``ALTER COLUMN ... TYPE`` (widenings, a change to another family, a ``USING`` that rewrites values)
    is followed by the views; a table whose batch fails anyway stops alone, says so in ``cdc lag``, and
    catches up once the cause is gone."""
    from cdc.observe.lag import measure
    from derived_views.views import warehouse

    execute(
        pg_url,
        "CREATE TABLE ty (id int PRIMARY KEY, n int, s varchar(10), price numeric(10, 2), f real, d int)",
        "CREATE TABLE other (id int PRIMARY KEY, v text)",
        "CREATE PUBLICATION cdc_publication FOR ALL TABLES",
        "INSERT INTO ty VALUES (1, 1, '1', 1.50, 1.5, 7), (2, 2, '2', 2.25, 2.5, 8)",
        "INSERT INTO other VALUES (1, 'a')",
    )
    settings = settings_for(pg_url, tmp_path)
    ctx = context(spark, settings)
    through(settings, ctx)
    execute(
        pg_url,
        "ALTER TABLE ty ALTER COLUMN n TYPE bigint",
        "UPDATE ty SET n = 5000000000 WHERE id = 1",
        "ALTER TABLE ty ALTER COLUMN s TYPE int USING s::int",
        "UPDATE ty SET s = 7 WHERE id = 1",
        "ALTER TABLE ty ALTER COLUMN price TYPE numeric(12, 3)",
        "ALTER TABLE ty ALTER COLUMN f TYPE double precision",
        "ALTER TABLE ty ALTER COLUMN d TYPE bigint USING d * 100",  # stored values change without events
        "INSERT INTO ty VALUES (3, 3, 3, 3.125, 3.5, 9)",
        "INSERT INTO other VALUES (2, 'b')",
    )
    through(settings, ctx)
    current = spark.read.format("delta").load(warehouse.current_path(ctx, "public.ty"))
    types = {field.name: field.dataType.simpleString() for field in current.schema.fields}
    assert (types["n"], types["s"], types["price"], types["f"]) == ("bigint", "string", "decimal(12,3)", "double")
    assert {row["id"]: row["d"] for row in current.collect()} == {1: 700, 2: 800, 3: 9}
    versions = rows(spark, warehouse.history_path(ctx, "public.ty"), "id = 1")
    assert {row["s"] for row in versions} == {"1", "7"} and {row["n"] for row in versions} == {1, 5000000000}
    assert not dead_letters(spark, ctx)

    # a table that cannot be written (a corrupt commit in its Delta log) fails alone
    broken = Path(warehouse.current_path(ctx, "public.other")) / "_delta_log"
    commits = sorted(broken.glob("*.json"))
    garbage = broken / f"{int(commits[-1].stem) + 1:020d}.json"
    garbage.write_text("not a commit\n")
    execute(pg_url, "INSERT INTO other VALUES (3, 'c')", "INSERT INTO ty VALUES (4, 4, 4, 4, 4, 4)")
    capture(settings)
    from derived_views.runs import runner

    ctx.forget()
    report = runner.step(ctx, ["warehouse"])
    assert [failure.table for failure in report.failures] == ["warehouse/current/public.other"]
    assert len(rows(spark, warehouse.current_path(ctx, "public.ty"))) == 4  # the other tables moved on
    assert len(rows(spark, warehouse.history_path(ctx, "public.other"))) == 3
    lag = measure(settings)
    assert any("warehouse/current/public.other" in line for line in lag.violations)
    garbage.unlink()
    ctx.forget()
    sync(ctx, ["warehouse"])
    verify_views(ctx, pg_url, ["warehouse"])
    assert not any("public.other" in line for line in measure(settings).violations)


def test_old_events_are_typed_with_the_schema_of_their_position_also_in_a_rebuild(
    spark: SparkSession, pg_url: str, tmp_path: Path
) -> None:
    """An event written before a column changed type (varchar -> int: ``"1"``, valid then) lands in the
    history table, incrementally and in a rebuild by replay, which gives the same tables."""
    from derived_views.views import warehouse

    execute(
        pg_url,
        "CREATE TABLE somenums (id int PRIMARY KEY, somenum varchar(10), note text)",
        "CREATE PUBLICATION cdc_publication FOR ALL TABLES",
        "INSERT INTO somenums VALUES (1, '1', 'a'), (2, 'x2', 'b')",
    )
    settings = settings_for(pg_url, tmp_path)
    ctx = context(spark, settings)
    through(settings, ctx)
    execute(
        pg_url,
        "UPDATE somenums SET note = 'c' WHERE id = 1",  # an event with "somenum": "1" after the snapshot
        "UPDATE somenums SET somenum = '2' WHERE id = 2",
        "ALTER TABLE somenums ALTER COLUMN somenum TYPE int USING somenum::int",
        "UPDATE somenums SET somenum = 10 WHERE id = 1",
        "ALTER TABLE somenums RENAME COLUMN note TO remark",
        "UPDATE somenums SET remark = 'd' WHERE id = 2",
    )
    through(settings, ctx)  # old and new events in one batch
    history = sorted(
        (row["id"], row["somenum"], row["remark"], row["_cdc_valid_from_lsn"])
        for row in rows(spark, warehouse.history_path(ctx, "public.somenums"))
    )
    assert [(i, n) for i, n, _, _ in history].count((2, "x2")) == 1 and (1, "10") in [(i, n) for i, n, _, _ in history]
    assert not dead_letters(spark, ctx)
    assert {r for _, _, r, _ in history} >= {"a", "c", "d"}  # the renamed column keeps its old values

    def table(path: str) -> list[str]:
        return sorted(repr(sorted(row.items())) for row in rows(spark, path))

    paths = (warehouse.current_path(ctx, "public.somenums"), warehouse.history_path(ctx, "public.somenums"))
    incremental = [table(path) for path in paths]
    sync(ctx, ["warehouse"], replace=True)
    verify_views(ctx, pg_url, ["warehouse"])
    assert [table(path) for path in paths] == incremental


EDGE_VALUES = (
    "'{{1,2},{3,4}}', 3.4e38, 1.797e308, '9999-12-31 23:59:59.999999', '2262-04-11 23:47:16.854775+00', "
    "'9999-12-31', decode(repeat('ab', 1000), 'hex'), '00:00:00.000001', '-0.000000000000000000001'"
)


def test_edge_values_land_exactly_and_a_misfit_names_its_column(spark: SparkSession, pg_url: str, tmp_path: Path) -> None:
    """Valid values at the edges of their types land in both warehouse tables; a multi-dimensional
    array in an ``int[]`` column turns that column into the arrays' JSON text, so every row lands."""
    from derived_views.views import warehouse

    execute(
        pg_url,
        "CREATE TABLE typed (id int PRIMARY KEY, a int[], r real, d double precision, ts timestamp, "
        "tz timestamptz, dt date, b bytea, iv interval, n numeric)",
        "CREATE PUBLICATION cdc_publication FOR ALL TABLES",
        "INSERT INTO typed VALUES (1, '{1,2}', 1, 1, '2020-01-01', '2020-01-01', '2020-01-01', '\\x00', '1 day', 1)",
    )
    settings = settings_for(pg_url, tmp_path)
    ctx = context(spark, settings)
    through(settings, ctx)  # the array column is an array<int> first
    execute(pg_url, f"INSERT INTO typed VALUES (2, {EDGE_VALUES})", "UPDATE typed SET a = '{5}' WHERE id = 1")
    through(settings, ctx)
    assert not dead_letters(spark, ctx)
    for path in (warehouse.current_path(ctx, "public.typed"), warehouse.history_path(ctx, "public.typed")):
        frame = spark.read.format("delta").load(path)
        assert dict(frame.dtypes)["a"] == "string"
        assert orjson.loads(frame.filter("id = 2").first()["a"]) == [[1, 2], [3, 4]]
    shutil.rmtree(warehouse.current_path(ctx, "public.typed"))
    ctx.forget()
    sync(ctx, ["warehouse"])  # built anew from the log: the same type
    assert dict(spark.read.format("delta").load(warehouse.current_path(ctx, "public.typed")).dtypes)["a"] == "string"
    verify_views(ctx, pg_url, ["warehouse"])
