"""A publication's column list and row filter, end to end: PostgreSQL -> capture -> log -> warehouse ->
verify. No byte of an unpublished column or row reaches a file under the data directory (log segments,
Delta files, dead letters), the warehouse holds exactly the published rows and columns, and verify
compares with those and fails when one leaks into the view."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.cdc.capture.test_publication_rules import create_tables, files_holding, insert_person, published_people, secret
from tests.derived_views.pipeline import (
    capture,
    context,
    data_files_on_disk,
    dead_letters,
    execute,
    in_process,
    rows,
    settings_for,
    sync,
    verify_views,
    view_files_holding,
    view_versions,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from derived_views.write.context import ViewContext

pytestmark = [pytest.mark.pg, pytest.mark.spark, pytest.mark.slow]


def _every_version(path: str) -> list[dict[str, Any]]:
    """The rows of every version of the Delta table at ``path``, decoded (not as compressed bytes)."""
    from deltalake import DeltaTable

    latest = DeltaTable(path).version()
    return [row for version in range(latest + 1) for row in DeltaTable(path, version=version).to_pyarrow_table().to_pylist()]


def _decoded_values(data_dir: Path) -> str:
    """Every value of every version of every Delta table under ``data_dir``, as one text."""
    tables = sorted(str(log.parent) for log in data_dir.rglob("_delta_log"))
    assert tables, "no Delta table to search"
    return repr([_every_version(path) for path in tables])


def _warehouse_people(ctx: ViewContext) -> dict[bytes, dict[str, Any]]:
    """The warehouse's current ``people`` rows, keyed as :func:`published_people` keys them, with the
    columns ``published_people`` has."""
    import orjson
    from deltalake import DeltaTable

    from derived_views.views import warehouse

    rows = DeltaTable(warehouse.current_path(ctx, "public.people")).to_pyarrow_table().to_pylist()
    return {
        orjson.dumps({"id": row["id"], "region": row["region"]}): {k: v for k, v in row.items() if not k.startswith("_cdc")}
        for row in rows
    }


def test_only_published_columns_and_rows_reach_the_warehouse(spark: SparkSession, pg_url: str, tmp_path: Path) -> None:
    from derived_views.runs import runner
    from derived_views.runs.verify import verify
    from derived_views.views import warehouse

    create_tables(pg_url)
    settings = settings_for(pg_url, tmp_path)
    ctx = context(spark, settings)
    capture(settings)
    sync(ctx, ["warehouse"])
    assert _warehouse_people(ctx) == published_people(pg_url)
    assert verify_views(ctx, pg_url, ["warehouse"]) == 3 + 3

    # inserts, updates and a delete inside and outside the filter; rows crossing it both ways
    for n, region in ((7, "eu"), (8, "us")):
        insert_person(pg_url, n, region)
    execute(
        pg_url,
        f"UPDATE people SET name = '{secret('renamed', 1)}', ssn = '{secret('ssn', 101)}' WHERE id = 1",
        f"UPDATE people SET name = '{secret('renamed', 2)}', ssn = '{secret('ssn', 102)}' WHERE id = 2",
        "UPDATE people SET region = 'us' WHERE id = 3",
        "UPDATE people SET region = 'eu' WHERE id = 4",
        "DELETE FROM people WHERE id IN (5, 6)",
        "TRUNCATE plain",
        "INSERT INTO plain VALUES (9, 'after the truncate')",
    )
    capture(settings)
    sync(ctx, ["warehouse"])
    assert sorted(row["id"] for row in _warehouse_people(ctx).values()) == [1, 4, 7]
    assert _warehouse_people(ctx) == published_people(pg_url)
    # the row that left the filter is a delete in the history too: no current version of it remains
    history = spark.read.format("delta").load(warehouse.history_path(ctx, "public.people")).filter("_cdc_is_current")
    assert sorted(row["id"] for row in history.collect()) == [1, 4, 7]

    # a column added with a volatile default: the table is read again, under the same rule (which does not list it)
    execute(pg_url, "ALTER TABLE people ADD COLUMN added int NOT NULL DEFAULT (7 + random() * 0)::int")
    insert_person(pg_url, 10, "us")
    capture(settings)
    sync(ctx, ["warehouse"])
    assert _warehouse_people(ctx) == published_people(pg_url)
    assert verify_views(ctx, pg_url, ["warehouse"]) == 3 + 1

    # a rebuild by replay reads the same published rows and columns back
    sync(ctx, ["warehouse"], replace=True)
    assert _warehouse_people(ctx) == published_people(pg_url)
    assert verify_views(ctx, pg_url, ["warehouse"]) == 3 + 1
    assert dead_letters(spark, ctx) == []

    leaked = [secret("ssn", n) for n in (*range(1, 11), 101, 102)] + [secret("name", n) for n in (2, 6, 8, 10)]
    leaked += [secret("renamed", 2)]
    assert files_holding(tmp_path, leaked) == {}
    decoded = _decoded_values(tmp_path)
    assert [value for value in leaked if value in decoded] == []
    assert secret("name", 7) in decoded  # the published values are there: the search would find a leak
    assert files_holding(tmp_path, [secret("name", 7)]) != {}

    # verify reads the published rows and columns: a row or a column that leaked into the view fails it
    watermark = runner.latest(ctx)
    assert watermark is not None
    current = warehouse.current_path(ctx, "public.people")
    from pyspark.sql import functions as F

    leaked_row = spark.read.format("delta").load(current).filter("id = 7")
    leaked_row = leaked_row.withColumn("id", F.lit(8).cast("int")).withColumn("region", F.lit("us"))
    leaked_row.write.format("delta").mode("append").save(current)
    report = verify(ctx, "warehouse", pg_url, watermark)
    assert [line for line in report.differences if "in the view but not in the source" in line] == [
        "public.people: key ('8', \"'us'\") is in the view but not in the source"
    ], report.differences
    spark.sql(f"DELETE FROM delta.`{current}` WHERE id = 8")
    assert verify(ctx, "warehouse", pg_url, watermark).ok
    spark.sql(f"ALTER TABLE delta.`{current}` ADD COLUMNS (ssn string)")
    spark.sql(f"UPDATE delta.`{current}` SET ssn = 'leaked' WHERE id = 7")
    assert verify(ctx, "warehouse", pg_url, watermark).differences == [
        "public.people: column ssn is in the view but publication cdc_publication does not publish it"
    ]


def test_a_column_the_list_stops_publishing_keeps_no_value_in_the_current_tables_and_a_purge_none_anywhere(
    spark: SparkSession, pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ALTER PUBLICATION ... SET TABLE`` leaves ``name`` out and row 5 out of the filter while the table is
    captured: the table is read again, and afterwards no current row, nor any current version of the
    history, holds a ``name`` published before (the column stays, NULL), and row 5 is gone from them; the
    history's closed versions keep theirs, as do the tables' earlier versions. Verify agrees, and reports
    a value left in the column.

    Then ``cdc views purge``: refused without its confirmation or for a table not captured, changing
    nothing; with it, the rule reaches every version of the history (``name`` NULL, row 5's versions
    gone) and every earlier version is dropped: no byte of a value the rule leaves out stays in any file
    of any view table, their Delta logs included, and the views still equal the source."""
    from deltalake import DeltaTable

    from derived_views.runs import runner
    from derived_views.runs.verify import verify
    from derived_views.views import warehouse

    create_tables(pg_url)
    settings = settings_for(pg_url, tmp_path)
    ctx = context(spark, settings)
    capture(settings)
    sync(ctx, ["warehouse"])
    current, history = warehouse.current_path(ctx, "public.people"), warehouse.history_path(ctx, "public.people")
    assert {row["name"] for row in rows(spark, current)} == {secret("name", n) for n in (1, 3, 5)}

    execute(
        pg_url, "ALTER PUBLICATION cdc_publication SET TABLE people (id, region) WHERE (region = 'eu' AND id <> 5), TABLE plain"
    )
    capture(settings)
    sync(ctx, ["warehouse"])
    assert sorted((row["id"], row["name"]) for row in rows(spark, current)) == [(1, None), (3, None)]
    assert sorted((row["id"], row["name"]) for row in rows(spark, history, "_cdc_is_current")) == [(1, None), (3, None)]
    assert {row["name"] for row in rows(spark, history, "NOT _cdc_is_current AND name IS NOT NULL")} == {
        secret("name", n) for n in (1, 3, 5)
    }
    assert verify_views(ctx, pg_url, ["warehouse"]) == 2 + 3

    # the purge: bad input first, one error each and nothing changed
    left_out = [secret("name", n) for n in (1, 3, 5)]
    held = view_files_holding(tmp_path, left_out)
    assert any("history" in path for path in held) and any("_delta_log" in path for path in held), held
    versions = view_versions(tmp_path)
    status, _, err = in_process(monkeypatch, capsys, settings, "views", "purge", "public.people")
    assert (status, err.count("error:")) == (2, 1) and "--yes-drop-history" in err, err
    status, _, err = in_process(monkeypatch, capsys, settings, "views", "purge", "public.nobody", "--yes-drop-history")
    assert (status, err.count("error:")) == (2, 1) and "unknown table 'public.nobody'" in err, err
    assert view_versions(tmp_path) == versions and view_files_holding(tmp_path, left_out) == held

    status, out, err = in_process(monkeypatch, capsys, settings, "views", "purge", "public.people", "--yes-drop-history")
    assert status == 0, err
    purged = {line.split(",")[0].removeprefix("purged ") for line in out.splitlines()}
    assert purged == {"warehouse/current/public.people", "warehouse/history/public.people"}, out
    assert "name (not published) set to NULL" in out and "rows the row filter leaves out removed" in out, out
    assert view_files_holding(tmp_path, left_out) == {}
    versions_left = rows(spark, history)  # every version of rows 1 and 3 (closed ones included), none of row 5
    assert {row["id"] for row in versions_left} == {1, 3} and {row["name"] for row in versions_left} == {None}
    assert len(versions_left) > 2, versions_left
    assert sorted((row["id"], row["name"]) for row in rows(spark, current)) == [(1, None), (3, None)]
    for path in (current, history):  # the newest version alone, and no file it does not need
        table = DeltaTable(path)
        oldest = min(int(commit["version"]) for commit in table.history())
        assert oldest > versions[str(Path(path).relative_to(tmp_path))], table.history()
        assert {Path(uri).name for uri in table.file_uris()} == {file.name for file in data_files_on_disk(path)}
    assert verify_views(ctx, pg_url, ["warehouse"]) == 2 + 3

    spark.sql(f"UPDATE delta.`{current}` SET name = 'left over' WHERE id = 3")
    watermark = runner.latest(ctx)
    assert watermark is not None
    assert verify(ctx, "warehouse", pg_url, watermark).differences == [
        "public.people: column name is in the view but publication cdc_publication does not publish it"
    ]
