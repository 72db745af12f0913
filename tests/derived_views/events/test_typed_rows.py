"""Envelopes typed by Arrow in the reduction give the rows Spark's own parse gives (real capture, real Spark).

A table with every type Arrow may type (values at their edges, and values only Spark parses:
``NaN``, ``infinity``) is captured; its events are typed both ways, in the driver and in Spark tasks,
and the typed rows must be equal, with some rows typed by Arrow and the partition holding the
values Arrow refuses left to Spark.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.derived_views.pipeline import capture, context, execute, settings_for

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = [pytest.mark.pg, pytest.mark.spark]

TABLE = (
    "CREATE TABLE typed (id int PRIMARY KEY, s smallint, b bigint, r real, d double precision, "
    "n numeric(12,3), nu numeric, ok boolean, t text, j jsonb, u uuid, dt date, ts timestamp, tz timestamptz, "
    "tags text[], ints int[], prices numeric(6,2)[], stamps timestamptz[], iv interval)"
)
ROW = (
    "INSERT INTO typed SELECT g, (g %% 3) * 16383, g * 4000000000, g / 3.0, g / 7.0, g / 8.0, "
    "repeat('9', 40)::numeric / 7, g %% 2 = 0, 'é \"q\" ' || chr(10) || g, jsonb_build_object('k', g, 'z', null), "
    "gen_random_uuid(), date '2020-02-29' + g, timestamp '2020-01-01 00:00:00.000001' + g * interval '1 hour', "
    "timestamptz '1999-12-31 23:59:59.999999+00' + g * interval '1 day', ARRAY['a', NULL, g::text], "
    "ARRAY[g, -g], ARRAY[1.5, g], ARRAY[timestamptz '2001-01-01 00:00:00+05'], interval '1 day' * g "
    "FROM generate_series(%s, %s) g"
)
EDGES = [
    (
        "INSERT INTO typed (id, s, b, n, dt, ts, tz) VALUES (1001, 32767, -9223372036854775808, -999999999.999, "
        "'0001-01-01', '0001-01-01 00:00:00', '9999-12-31 23:59:59.999999+00')"
    ),
    "INSERT INTO typed (id, r, d, dt) VALUES (1002, 'NaN', '-Infinity', 'infinity')",  # only Spark parses these
]


def _typed_frames(spark: SparkSession, ctx: Any) -> dict[str, DataFrame]:
    """The table's pending events typed four ways: in the driver and by Spark tasks, each with and
    without Arrow's typing."""
    import pyarrow.compute as pc

    from derived_views.events.driver_typed import typed_in_driver
    from derived_views.events.reduction import EVENT_DDL
    from derived_views.events.spark_typing import typed
    from derived_views.events.typed_rows import row_type, typed_ddl
    from derived_views.runs import runner
    from derived_views.source import pending
    from derived_views.source.as_of import LogAsOf
    from derived_views.source.table_step import TableStep

    watermark = runner.latest(ctx)
    schema = ctx.schemas(watermark)["public.typed"]
    columns = schema.view_columns(None, set())
    plan = schema.parse_plan(columns)
    assert pending.arrow_typed(columns, plan)
    as_of = LogAsOf(ctx.log, watermark)
    frames = {}
    for mode in ("latest", "all"):
        step = TableStep(as_of, [schema.topic], "", mode, table=schema.qualified, columns=columns, plan=plan)
        untyped = pending.pending_table(step)
        by_arrow = pending.pending_table(step, row_type(columns))
        frames[f"driver/{mode}/spark"] = typed(spark.createDataFrame(untyped, schema=EVENT_DDL), columns, schema.qualified, plan)
        frames[f"driver/{mode}/arrow"] = typed(
            spark.createDataFrame(by_arrow, schema=f"{EVENT_DDL}, {typed_ddl(columns)}"), columns, schema.qualified, plan
        )
        raw = pending.read_log(spark, as_of.log, [schema.topic], {}, watermark.offsets, reduce=mode)
        frames[f"tasks/{mode}/spark"] = typed(raw, columns, schema.qualified, plan)
        frames[f"tasks/{mode}/arrow"] = pending.typed_events(spark, step)
        frames[f"parsed/{mode}"] = pending.read_log(
            spark, as_of.log, [schema.topic], {}, watermark.offsets, reduce=mode, columns=columns
        )
        # a batch of typed events only: assembled in the driver without a Spark job, as Spark types it
        assert typed_in_driver(by_arrow, columns, schema.qualified) is None  # some events need Spark
        only_typed = by_arrow.filter(pc.fill_null(by_arrow.column("parsed"), False))
        frames[f"typed/{mode}/spark"] = typed(
            spark.createDataFrame(only_typed, schema=f"{EVENT_DDL}, {typed_ddl(columns)}"), columns, schema.qualified, plan
        )
        assembled = typed_in_driver(only_typed, columns, schema.qualified)
        assert assembled is not None
        assembled_rows, assembled_ddl = assembled
        frames[f"typed/{mode}/driver"] = spark.createDataFrame(assembled_rows, schema=assembled_ddl)
    return frames


def _rows(frame: DataFrame, *, raw: bool = False) -> list[tuple[Any, ...]]:
    """Rows in a comparable form (NaN compared as text), ``_cdc_raw`` left out unless ``raw``."""
    return sorted((tuple(repr(v) for v in row) for row in (frame if raw else frame.drop("_cdc_raw")).collect()), key=repr)


def test_rows_typed_by_arrow_equal_the_rows_spark_parses(spark: SparkSession, pg_url: str, tmp_path: Path) -> None:
    execute(pg_url, TABLE, "CREATE PUBLICATION cdc_publication FOR ALL TABLES")
    execute(pg_url, ROW % (1, 300))
    settings = settings_for(pg_url, tmp_path)
    capture(settings)
    execute(pg_url, *EDGES, "UPDATE typed SET t = 'updated' WHERE id % 10 = 0", "DELETE FROM typed WHERE id % 25 = 0")
    capture(settings)
    ctx = context(spark, settings)
    frames = _typed_frames(spark, ctx)
    for mode in ("latest", "all"):
        parsed = frames[f"parsed/{mode}"].groupBy("parsed").count().collect()
        counts = {row["parsed"]: row["count"] for row in parsed}
        assert counts.get(True, 0) > 100 and counts.get(False, 0) > 0, counts  # both kinds in one read
        expected = _rows(frames[f"driver/{mode}/spark"])
        assert len(expected) > 300 if mode == "all" else len(expected) > 250
        assert not any(row[-2] != "None" for row in expected if "1002" not in row[0]), "no poison expected"
        for way in ("driver", "tasks"):
            assert _rows(frames[f"{way}/{mode}/arrow"]) == expected, f"{way}/{mode}"
        assert _rows(frames[f"tasks/{mode}/spark"]) == expected
        by_spark, in_driver = frames[f"typed/{mode}/spark"], frames[f"typed/{mode}/driver"]
        assert [(f.name, f.dataType.simpleString()) for f in in_driver.schema] == [
            (f.name, f.dataType.simpleString()) for f in by_spark.schema
        ]
        assembled = _rows(in_driver, raw=True)
        assert len(assembled) > 200 and assembled == _rows(by_spark, raw=True), mode
