"""Tables with any names, end to end: PostgreSQL -> capture -> log -> warehouse, each table on its own."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.cdc.capture.test_table_names import AWKWARD, _insert, _setup
from tests.cdc.helpers import execute

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.pg, pytest.mark.spark, pytest.mark.slow]


def test_tables_with_any_names_reach_warehouse_tables_of_their_own(spark: SparkSession, pg_url: str, tmp_path: Path) -> None:
    from cdc.config.view_arguments import context_from_settings
    from cdc.run.coordinator import Capture
    from derived_views.runs import runner
    from derived_views.runs.verify import verify
    from derived_views.views import warehouse
    from log_store.topic_names import log_name

    settings = _setup(pg_url, tmp_path, AWKWARD)
    for schema, table in AWKWARD:
        _insert(pg_url, schema, table, 1, 2)
    Capture(settings, once=True).run()
    ctx = context_from_settings(settings, spark)
    runner.step(ctx, ["warehouse"])

    # the same key in both tables of the pair, a truncate of one of them, and an update of every table
    execute(pg_url, 'TRUNCATE "public.x".y')
    for schema, table in AWKWARD:
        _insert(pg_url, schema, table, 3)
        quoted = '"' + schema.replace('"', '""') + '"."' + table.replace('"', '""') + '"'
        execute(pg_url, f"UPDATE {quoted} SET v = v || '!' WHERE id = 3")
    Capture(settings, once=True).run()
    runner.step(ctx, ["warehouse"])

    watermark = runner.latest(ctx)
    assert watermark is not None
    report = verify(ctx, "warehouse", pg_url, watermark)
    assert report.ok, report.differences[:10]
    assert report.compared == 3 * (len(AWKWARD) - 1) + 1

    schemas = ctx.schemas(watermark)
    assert {(s.schema, s.table) for s in schemas.values()} == set(AWKWARD)
    current_dir = (tmp_path / "warehouse" / "current").resolve()
    paths = set()
    for schema, table in AWKWARD:
        name = log_name(schema, table)
        assert schemas[name].topic == settings.topic_for(schema, table)
        path = warehouse.current_path(ctx, name)
        assert Path(path).resolve().parent == current_dir
        paths.add(path)
        ids = [1, 2] if (schema, table) != ("public.x", "y") else []
        rows = spark.read.format("delta").load(path).select("id", "v").orderBy("id").collect()
        assert [(r["id"], r["v"]) for r in rows] == [*((i, f"{schema}/{table}#{i}") for i in ids), (3, f"{schema}/{table}#3!")]
        history = spark.read.format("delta").load(warehouse.history_path(ctx, name))
        assert history.filter("_cdc_is_current").count() == len(rows)
    assert len(paths) == len(AWKWARD)
    assert sorted(p.name for p in current_dir.iterdir()) == sorted(Path(p).name for p in paths)
