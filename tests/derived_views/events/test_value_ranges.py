"""Values PostgreSQL holds and Spark's types do not: every row lands, exactly, snapshot and stream alike.

PostgreSQL's dates and timestamps reach from 4713 BC to years past 9999 and hold ``infinity``; its
``numeric(p, s)`` holds ``NaN``. Spark's ``date``, ``timestamp`` and ``decimal`` hold none of these, so
such a column becomes the values' text (``derived_views.events.column_types``): no row goes to the dead-letter
table, verify reads every value back, and a rebuild by replay gives the same tables.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import pytest

from tests.derived_views.pipeline import context, dead_letters, execute, settings_for, sync, through, verify_views

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.pg, pytest.mark.spark, pytest.mark.slow]

#: Every temporal and numeric type at its edges, scalars and arrays, and a domain over one of them.
COLUMNS = (
    "id int PRIMARY KEY, dt date, ts timestamp, tz timestamptz, n numeric(10,2), nu numeric, "
    "wide numeric(60,40), small int2, i int4, big int8, r real, d double precision, iv interval, m money, "
    "t time, ttz timetz, dd day, dts date[], tss timestamp[], tzs timestamptz[], ns numeric(10,2)[], fs float8[]"
)
NAMES = [column.split()[0] for column in COLUMNS.split(", ")]
#: An ordinary row: every column has a Spark type that holds it.
ORDINARY = (
    "'2020-02-29', '2020-02-29 12:00:00.5', '2020-02-29 12:00:00.25+01', 19.90, 1.5, 1.5, 1, 1, 1, 1, 1, "
    "'1 day', 1, '12:00', '12:00+02', '2020-02-29', '{2020-02-29}', '{2020-02-29 12:00:00.5}', "
    "'{2020-02-29 12:00:00.25+00}', '{19.90,-0.01}', '{1.5}'"
)
#: The largest and infinite values.
HIGH = (
    "'infinity', 'infinity', 'infinity', 'NaN', 'Infinity', "
    "'99999999999999999999.9999999999999999999999999999999999999999', 32767, 2147483647, 9223372036854775807, "
    "'Infinity', 'NaN', '178000000 years', '92233720368547758.07', '24:00:00', '24:00:00-15:59', '5874897-12-31', "
    "'{infinity,5874897-12-31}', '{294276-12-31 23:59:59.999999}', '{294276-12-31 23:59:59.999999+00}', "
    "'{NaN,99999999.99}', '{NaN,Infinity,-0,1.7976931348623157e308}'"
)
#: The smallest and negative-infinite values, BC dates, NaN, negative zero.
LOW = (
    "'4713-01-01 BC', '4713-01-01 00:00:00 BC', '4713-01-01 00:00:00+00 BC', 'NaN', '-Infinity', "
    "-1e-40, -32768, -2147483648, -9223372036854775808, '-0', '-Infinity', '-178000000 years', "
    "'-92233720368547758.08', '00:00:00', '00:00:00+15:59', '-infinity', '{-infinity,0044-03-15 BC}', "
    "'{-infinity,0001-01-01 00:00:00 BC}', '{-infinity}', '{-99999999.99,NaN}', '{-Infinity,5e-324,-0}'"
)
#: Years Spark holds, but before the Gregorian reform and the Unix epoch, and the smallest fractions.
OLD = (
    "'0001-01-01', '0001-01-01 00:00:00', '0001-01-01 00:00:00+00', -99999999.99, '1e-1000', 1e-40, 0, 0, 0, "
    "1.4e-45, 5e-324, '00:00:00.000001', 0.01, '23:59:59.999999', '23:59:59.999999+00', '1582-10-04', "
    "'{1582-10-04}', '{1000-01-01 00:00:00.000001}', '{1969-12-31 23:59:59.999999+00}', '{0.00}', '{-0}'"
)
KINDS = {"high": HIGH, "low": LOW, "old": OLD}


def _values(spark: SparkSession, path: str) -> list[str]:
    """The data columns of every row of the Delta table at ``path``, with its types, as comparable text."""
    frame = spark.read.format("delta").load(path)
    data = [c for c in frame.columns if not c.startswith("_cdc_") or c in ("_cdc_lsn", "_cdc_seq")]
    return [repr(dict(frame.dtypes))] + sorted(repr(row.asDict(recursive=True)) for row in frame.select(*data).collect())


def _deltalake_rows(path: str) -> dict[int, dict[str, Any]]:
    from deltalake import DeltaTable

    return {row["id"]: row for row in DeltaTable(path).to_pyarrow_table().to_pylist() if row.get("_cdc_is_current", True)}


def test_values_spark_cannot_hold_keep_their_rows_in_snapshot_stream_and_rebuild(
    spark: SparkSession, pg_url: str, tmp_path: Path
) -> None:
    """``infinity``, BC and far-future dates and timestamps, ``NaN`` in ``numeric(p, s)`` (scalars and
    arrays, and a domain over date), from the snapshot and streamed as inserts and as updates to and
    from such values: no dead letter, verify passes, ``deltalake`` reads the documented text, and a
    rebuild by replay gives the same tables."""
    from derived_views.views import warehouse

    execute(
        pg_url,
        "CREATE DOMAIN day AS date",
        f"CREATE TABLE snapped ({COLUMNS})",
        f"CREATE TABLE streamed ({COLUMNS})",
        "CREATE PUBLICATION cdc_publication FOR ALL TABLES",
        *[f"INSERT INTO snapped VALUES ({i}, {values})" for i, values in enumerate((ORDINARY, HIGH, LOW, OLD))],
        f"INSERT INTO streamed VALUES (0, {ORDINARY}), (1, {ORDINARY}), (2, {ORDINARY})",
    )
    settings = settings_for(pg_url, tmp_path)
    ctx = context(spark, settings)
    through(settings, ctx)
    paths = [
        (warehouse.current_path(ctx, f"public.{table}"), warehouse.history_path(ctx, f"public.{table}"))
        for table in ("snapped", "streamed")
    ]
    streamed_current = paths[1][0]
    assert dict(spark.read.format("delta").load(streamed_current).dtypes)["dt"] == "date"  # no such value yet
    execute(
        pg_url,
        f"INSERT INTO streamed VALUES (3, {LOW}), (4, {OLD})",
        f"UPDATE streamed SET ({', '.join(NAMES[1:])}) = ({HIGH}) WHERE id = 1",
    )
    through(settings, ctx)
    assert not dead_letters(spark, ctx)
    execute(pg_url, "UPDATE snapped SET (dt, n, dts) = ('2020-01-01', 1, '{2020-01-01}') WHERE id = 1")
    assert through(settings, ctx) == 4 + 5
    assert not dead_letters(spark, ctx)

    for current, _ in paths:
        assert dict(spark.read.format("delta").load(current).dtypes)["dt"] == "string"
    snapped = _deltalake_rows(paths[0][0])
    assert (snapped[2]["dt"], snapped[2]["ts"], snapped[2]["tz"]) == (
        "4713-01-01 BC",
        "4713-01-01 00:00:00 BC",
        "4713-01-01 00:00:00+00 BC",
    )
    assert snapped[1]["dt"] == "2020-01-01" and snapped[1]["n"] == "1.00" and orjson.loads(snapped[1]["dts"]) == ["2020-01-01"]
    assert (snapped[3]["dt"], snapped[3]["n"], snapped[2]["n"]) == ("0001-01-01", "-99999999.99", "NaN")
    streamed = _deltalake_rows(streamed_current)
    assert (streamed[1]["dt"], streamed[1]["ts"], streamed[1]["n"]) == ("infinity", "infinity", "NaN")
    assert streamed[1]["tz"] == "infinity" and streamed[1]["dd"] == "5874897-12-31"
    assert orjson.loads(streamed[1]["tss"]) == ["294276-12-31T23:59:59.999999"]
    assert orjson.loads(streamed[1]["tzs"]) == ["294276-12-31T23:59:59.999999Z"]
    assert orjson.loads(streamed[1]["ns"]) == ["NaN", "99999999.99"]
    # values written before the column became text read as the events carry them
    assert (streamed[0]["dt"], streamed[0]["ts"], streamed[0]["tz"], streamed[0]["n"]) == (
        "2020-02-29",
        "2020-02-29T12:00:00.5",
        "2020-02-29T11:00:00.25Z",
        "19.90",
    )
    assert orjson.loads(streamed[0]["tzs"]) == ["2020-02-29T12:00:00.25Z"]
    assert orjson.loads(streamed[0]["ns"]) == ["19.90", "-0.01"]
    assert orjson.loads(streamed[0]["tss"]) == ["2020-02-29T12:00:00.5"]

    incremental = [[_values(spark, path) for path in pair] for pair in paths]
    sync(ctx, ["warehouse"], replace=True)
    verify_views(ctx, pg_url, ["warehouse"])
    for pair, before in zip(paths, incremental, strict=True):
        for path, was in zip(pair, before, strict=True):
            now = _values(spark, path)
            assert now == was, (path, sorted(set(now) ^ set(was))[:4])


#: Built-in types of the type chapters that the views keep as text, with a value at an edge of each.
BUILT_IN = {
    "point": "'(1e308,-0)'",
    "line": "'{1,-1,0}'",
    "lseg": "'[(0,0),(1,1)]'",
    "box": "'(1,1),(0,0)'",
    "path": "'[(0,0),(1,1),(2,0)]'",
    "polygon": "'((0,0),(1,1),(2,0))'",
    "circle": "'<(0,0),1e-300>'",
    "inet": "'::ffff:1.2.3.4/128'",
    "cidr": "'2001:db8::/32'",
    "macaddr": "'ff:ff:ff:ff:ff:ff'",
    "macaddr8": "'08:00:2b:01:02:03:04:05'",
    "bit(3)": "B'101'",
    "varbit": "B''",
    "tsvector": "'a:1A fat cat''s'",
    "tsquery": "'fat & !rat'",
    "uuid": "'ffffffff-ffff-ffff-ffff-ffffffffffff'",
    "xml": "'<a b=\"1\">&amp;</a>'",
    "pg_lsn": "'FFFFFFFF/FFFFFFFF'",
    "int4range": "'[-2147483648,2147483647)'",
    "tstzrange": "'[-infinity,infinity]'",
    "daterange": "'(,0044-03-15 BC]'",
    "datemultirange": "'{[2020-01-01,infinity)}'",
    "numrange": "'(-1e-40,1e40]'",
    '"char"': "'\\377'",
    "bytea[]": "'{\"\\\\x00ff\",NULL}'",
    "interval[]": "'{-178000000 years,P1Y}'",
    "timetz[]": "'{24:00:00-15:59}'",
    "money[]": "'{-92233720368547758.08}'",
}
#: Contrib types the server ships, a domain over each kind of value, and arrays of them: all kept as
#: the server's text (a domain as its base type).
CONTRIB = ("hstore", "citext", "ltree", "isn", "cube", "seg")


def test_contrib_types_and_domains_land_as_their_text(spark: SparkSession, pg_url: str, tmp_path: Path) -> None:
    """hstore, citext, ltree, isn, cube and seg values (and arrays of them), domains over numeric,
    timestamptz and a contrib type, and numerics with a scale above the precision or below zero
    (PostgreSQL 15), from the snapshot and streamed: verify passes, none dead-lettered."""
    from derived_views.views import warehouse

    execute(
        pg_url,
        *[f"CREATE EXTENSION IF NOT EXISTS {name}" for name in CONTRIB],
        "CREATE DOMAIN price AS numeric(10,2) CHECK (VALUE >= 0 OR VALUE = 'NaN')",
        "CREATE DOMAIN moment AS timestamptz",
        "CREATE DOMAIN tree_path AS ltree",
        "CREATE TABLE contrib (id int PRIMARY KEY, h hstore, c citext, l ltree, b isbn13, cu cube, s seg, "
        "p price, mo moment, pa tree_path, hs hstore[], cs citext[], ls ltree[], frac numeric(3,5), hundreds numeric(5,-2), "
        f"{', '.join(f'x{i} {name}' for i, name in enumerate(BUILT_IN))})",
        "CREATE PUBLICATION cdc_publication FOR ALL TABLES",
        "INSERT INTO contrib VALUES (1, 'a=>1, \"b c\"=>NULL', 'MiXed', 'top.science.astronomy', '978-0-393-04002-9', "
        "'(1,2),(3,4)', '1.5 .. 2.5', 19.90, '2020-01-01 00:00+00', 'a.b', "
        f"ARRAY['x=>y'::hstore], '{{Ab,cD}}', '{{a.b,c}}', 0.00999, 9999949, {', '.join(BUILT_IN.values())})",
    )
    settings = settings_for(pg_url, tmp_path)
    ctx = context(spark, settings)
    through(settings, ctx)
    execute(
        pg_url,
        "INSERT INTO contrib VALUES (2, '', '', '', '979-10-90636-07-1', '(1e300)', '<1', 'NaN', 'infinity', '', "
        f"'{{}}', '{{\"\"}}', '{{}}', -0.00001, -12345, {', '.join(['NULL'] * len(BUILT_IN))})",
        "UPDATE contrib SET p = 'NaN', mo = '-infinity', h = h || 'z=>\"\\\\\"' WHERE id = 1",
    )
    assert through(settings, ctx) == 2
    assert not dead_letters(spark, ctx)
    current = _deltalake_rows(warehouse.current_path(ctx, "public.contrib"))
    assert (current[1]["p"], current[1]["mo"], current[2]["mo"]) == ("NaN", "-infinity", "infinity")
    assert current[1]["l"] == "top.science.astronomy" and current[1]["c"] == "MiXed"
    assert (current[1]["frac"], current[1]["hundreds"]) == (Decimal("0.00999"), Decimal("9999900"))
