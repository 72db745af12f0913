"""Names that differ only in case, end to end: PostgreSQL -> capture -> log -> Spark -> Delta -> verify.

PostgreSQL tells ``duration`` from ``"Duration"``; Spark and Delta compare names without case. Columns
with such twins (from the start, added while streaming, made by a rename) and tables with such twins
each keep their own values, read back by ``deltalake`` under the stored names of
:mod:`derived_views.events.column_names`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from derived_views.events.column_names import source_columns
from tests.derived_views.pipeline import capture, context, execute, settings_for, sync, through, verify_views

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.pg, pytest.mark.spark, pytest.mark.slow]

#: A search index and a cache entity over the table with twins from the start, naming each twin.
VIEWS = """
[search.twins]
root = "public.twins"
text = ["Duration"]
stored = ["duration", "Duration", "DURATION"]
filter = "duration > 0 AND `DURATION` > 0"

[cache.twin]
root = "public.twins"
"""


def delta_rows(path: str, names: list[str]) -> list[dict[str, Any]]:
    """The rows of the Delta table at ``path`` read by ``deltalake``, keyed by source ``names`` (and sorted)."""
    from deltalake import DeltaTable

    frame = DeltaTable(path).to_pandas()
    held = source_columns(names, list(frame.columns))
    assert set(held) == set(names), (list(frame.columns), names)
    out = [{name: _plain(row[stored]) for name, stored in held.items()} for _, row in frame.iterrows()]
    return sorted(out, key=repr)


def _plain(value: Any) -> Any:
    """A pandas cell as a plain Python value (``None`` for a missing one)."""
    import pandas as pd

    if value is None or (not isinstance(value, (list, dict)) and pd.isna(value)):
        return None
    return value.item() if hasattr(value, "item") else value


def test_columns_differing_only_in_case_keep_their_own_values(spark: SparkSession, pg_url: str, tmp_path: Path) -> None:
    """Twins from the start, added by ADD COLUMN and made by RENAME COLUMN while streaming, with updates
    and deletes after each: every value sits in its own column of the current and history tables, verify
    passes (a search index and a cache entity naming the twins too), ``cdc views`` names each stored
    column's source, and a rebuild by replay gives the same tables."""
    from cdc.config.view_arguments import location_from_settings
    from derived_views.runs.listing import captured_tables, view_tables
    from derived_views.views import cache, search, warehouse

    execute(
        pg_url,
        'CREATE TABLE twins (id int PRIMARY KEY, duration int, "Duration" text, "DURATION" bigint)',
        "CREATE TABLE grown (id int PRIMARY KEY, duration int)",
        'CREATE TABLE grown_upper (id int PRIMARY KEY, "Duration" text)',
        "CREATE TABLE renamed (id int PRIMARY KEY, duration int, other text)",
        "CREATE PUBLICATION cdc_publication FOR ALL TABLES",
        "INSERT INTO twins VALUES (1, 10, 'ten', 100), (2, 20, 'twenty', 200), (3, 30, 'thirty', 300)",
        "INSERT INTO grown VALUES (1, 10), (2, 20), (3, 30)",
        "INSERT INTO grown_upper VALUES (1, 'ten'), (2, 'twenty'), (3, 'thirty')",
        "INSERT INTO renamed VALUES (1, 10, 'ten'), (2, 20, 'twenty'), (3, 30, 'thirty')",
    )
    views_file = tmp_path / "views.toml"
    views_file.write_text(VIEWS)
    settings = settings_for(pg_url, tmp_path, views_file=str(views_file))
    ctx = context(spark, settings)
    every_view = ["warehouse", "search.twins", "cache.twin"]
    assert through(settings, ctx, every_view) == 12 + 3 + 3
    execute(
        pg_url,
        "UPDATE twins SET \"Duration\" = 'eleven' WHERE id = 1",
        "UPDATE twins SET duration = 22 WHERE id = 2",
        "DELETE FROM twins WHERE id = 3",
        'ALTER TABLE grown ADD COLUMN "Duration" text',
        "UPDATE grown SET \"Duration\" = 'ten' WHERE id = 1",
        "INSERT INTO grown VALUES (4, 40, 'forty')",
        'ALTER TABLE grown_upper ADD COLUMN duration int, ADD COLUMN "DURATION" bigint',
        'UPDATE grown_upper SET duration = 10, "DURATION" = 100 WHERE id = 1',
        "INSERT INTO grown_upper VALUES (4, 'forty', 40, 400)",
        'ALTER TABLE renamed RENAME COLUMN other TO "Duration"',
        "UPDATE renamed SET \"Duration\" = 'eleven' WHERE id = 1",
        "INSERT INTO renamed VALUES (4, 40, 'forty')",
    )
    assert through(settings, ctx, every_view) == 2 + 4 + 4 + 4 + 2 + 2
    execute(
        pg_url,
        'UPDATE twins SET "DURATION" = 111, duration = 11 WHERE id = 1',
        "DELETE FROM grown WHERE id = 2",
        "UPDATE grown SET \"Duration\" = 'forty!', duration = 41 WHERE id = 4",
        "DELETE FROM grown_upper WHERE id = 3",
        "UPDATE grown_upper SET \"Duration\" = 'ten!' WHERE id = 1",
        "DELETE FROM renamed WHERE id = 2",
        "UPDATE renamed SET duration = 41, \"Duration\" = 'forty!' WHERE id = 4",
    )
    assert through(settings, ctx, every_view) == 2 + 3 + 3 + 3 + 2 + 2
    hits = search.query(ctx.views_dir, "twins", "eleven", stored=["duration", "Duration", "DURATION"])
    assert [(hit.key, hit.fields) for hit in hits] == [({"id": 1}, {"duration": 11, "Duration": "eleven", "DURATION": 111})]
    assert cache.get(ctx.views_dir, "twin", "2") == {"id": 2, "duration": 22, "Duration": "twenty", "DURATION": 200}

    names = ["id", "duration", "Duration", "DURATION"]
    expected = {
        "twins": [(1, 11, "eleven", 111), (2, 22, "twenty", 200)],
        "grown": [(1, 10, "ten", None), (3, 30, None, None), (4, 41, "forty!", None)],
        "grown_upper": [(1, 10, "ten!", 100), (2, None, "twenty", None), (4, 40, "forty", 400)],
        "renamed": [(1, 10, "eleven", None), (3, 30, "thirty", None), (4, 41, "forty!", None)],
    }
    for table, values in expected.items():
        columns = names if table in ("twins", "grown_upper") else names[:3]
        want = sorted(({n: v for n, v in zip(names, row, strict=True) if n in columns} for row in values), key=repr)
        assert delta_rows(warehouse.current_path(ctx, f"public.{table}"), columns) == want, table
        history = delta_rows(warehouse.history_path(ctx, f"public.{table}"), [*columns, "_cdc_is_current"])
        assert sorted(({n: row[n] for n in columns} for row in history if row["_cdc_is_current"]), key=repr) == want
    history = delta_rows(warehouse.history_path(ctx, "public.renamed"), ["id", "duration", "Duration"])
    assert {"id": 1, "duration": 10, "Duration": "ten"} in history  # the renamed column's old value
    assert {"id": 1, "duration": 10, "Duration": "eleven"} in history

    captured = captured_tables(location_from_settings(settings), settings.topic_prefix)
    listed = {entry.holds: entry.stored_columns for entry in view_tables(Path(ctx.views_dir), captured, ctx.definitions)}
    every_letter = "%64%75%72%61%74%69%6F%6E"  # duration added beside a stored Duration
    assert listed["public.grown_upper (current)"] == {"duration": every_letter, "DURATION": "%44%55%52%41%54%49%4F%4E"}
    assert listed["public.twins (history)"] == {"Duration": "%44uration", "DURATION": "%44%55%52%41%54%49%4F%4E"}
    assert listed["public.renamed (current)"] == listed["public.grown (current)"] == {"Duration": "%44uration"}

    paths = [warehouse.current_path(ctx, f"public.{t}") for t in expected] + [
        warehouse.history_path(ctx, f"public.{t}") for t in expected
    ]

    def table_of(path: str) -> tuple[list[str], list[str]]:
        from deltalake import DeltaTable

        frame = DeltaTable(path).to_pandas()
        return sorted(frame.columns), sorted(repr(sorted(row.items())) for row in frame.astype(str).to_dict("records"))

    incremental = [table_of(path) for path in paths]
    sync(ctx, ["warehouse"], replace=True)
    verify_views(ctx, pg_url, ["warehouse"])
    assert [table_of(path) for path in paths] == incremental


def test_tables_differing_only_in_case_keep_their_own_rows(spark: SparkSession, pg_url: str, tmp_path: Path) -> None:
    """``public.t`` and ``public."T"`` land in view tables of their own, each verified."""
    from cdc.config.view_arguments import location_from_settings
    from derived_views.runs.listing import captured_tables, view_tables
    from derived_views.views import warehouse

    execute(
        pg_url,
        "CREATE TABLE t (id int PRIMARY KEY, v text)",
        'CREATE TABLE "T" (id int PRIMARY KEY, v text, "V" text)',
        "CREATE PUBLICATION cdc_publication FOR ALL TABLES",
        "INSERT INTO t VALUES (1, 'lower 1'), (2, 'lower 2')",
        """INSERT INTO "T" VALUES (1, 'upper 1', 'UPPER 1'), (3, 'upper 3', 'UPPER 3')""",
    )
    settings = settings_for(pg_url, tmp_path)
    ctx = context(spark, settings)
    assert through(settings, ctx) == 4
    execute(pg_url, "UPDATE t SET v = 'lower 1!' WHERE id = 1", 'DELETE FROM "T" WHERE id = 3')
    capture(settings)
    sync(ctx, ["warehouse"])
    assert verify_views(ctx, pg_url, ["warehouse"]) == 3
    lower, upper = warehouse.current_path(ctx, "public.t"), warehouse.current_path(ctx, "public.T")
    assert Path(lower).resolve() != Path(upper).resolve()
    assert delta_rows(lower, ["id", "v"]) == [{"id": 1, "v": "lower 1!"}, {"id": 2, "v": "lower 2"}]
    assert delta_rows(upper, ["id", "v", "V"]) == [{"id": 1, "v": "upper 1", "V": "UPPER 1"}]
    captured = captured_tables(location_from_settings(settings), settings.topic_prefix)
    listed = {entry.holds: entry for entry in view_tables(Path(ctx.views_dir), captured, ctx.definitions)}
    assert Path(listed["public.t (current)"].path).resolve() == Path(lower).resolve()
    assert Path(listed["public.T (current)"].path).resolve() == Path(upper).resolve()
    assert listed["public.T (current)"].stored_columns == {"V": "%56"}
