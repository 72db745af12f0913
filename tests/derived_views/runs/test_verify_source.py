"""derived_views.runs.verify reads every value PostgreSQL holds: dates and timestamps Python cannot hold
(``infinity``, BC, years past 9999), in columns and arrays, come back as the server's text."""

from __future__ import annotations

from datetime import UTC, date, datetime

import psycopg
import pytest

from derived_views.events.schema import Column, TableSchema
from derived_views.runs.verify_values import SESSION_OPTIONS, read_every_value
from tests.cdc.helpers import execute
from tests.rows import compare_rows, source_rows

pytestmark = pytest.mark.pg

TYPES = {"id": "int4", "d": "date", "ds": "_date", "ts": "timestamp", "tz": "timestamptz", "tzs": "_timestamptz"}


SCHEMA = TableSchema("public", "edges", "cdc.public.edges", tuple(Column(n, t, key=n == "id") for n, t in TYPES.items()))


def test_dates_and_timestamps_python_cannot_hold_are_read_as_text(pg_url: str) -> None:
    execute(
        pg_url,
        "CREATE TABLE edges (id int PRIMARY KEY, d date, ds date[], ts timestamp, tz timestamptz, tzs timestamptz[])",
        "INSERT INTO edges VALUES (1, '2020-01-02', '{2020-01-02,NULL}', '2020-01-02 03:04:05.5', "
        "'2020-01-02 03:04:05+02', '{2020-01-02 01:04:05+00}')",
        "INSERT INTO edges VALUES (2, 'infinity', '{infinity,-infinity,2020-01-02}', '-infinity', 'infinity', "
        "'{-infinity,infinity}')",
        "INSERT INTO edges VALUES (3, '0044-03-15 BC', '{0044-03-15 BC,10000-01-01}', '10000-01-01 00:00:00', "
        "'0044-03-15 12:00:00+00 BC', '{12000-06-01 00:00:00+00}')",
    )
    with psycopg.connect(pg_url, options=SESSION_OPTIONS) as conn:
        read_every_value(conn)
        rows = {row["id"]: row for row in source_rows(conn, SCHEMA)}
    assert rows[1] == {
        "id": 1,
        "d": date(2020, 1, 2),
        "ds": [date(2020, 1, 2), None],
        "ts": datetime(2020, 1, 2, 3, 4, 5, 500000),
        "tz": datetime(2020, 1, 2, 1, 4, 5, tzinfo=UTC),
        "tzs": [datetime(2020, 1, 2, 1, 4, 5, tzinfo=UTC)],
    }
    assert rows[2] == {
        "id": 2,
        "d": "infinity",
        "ds": ["infinity", "-infinity", date(2020, 1, 2)],
        "ts": "-infinity",
        "tz": "infinity",
        "tzs": ["-infinity", "infinity"],
    }
    assert rows[3] == {
        "id": 3,
        "d": "0044-03-15 BC",
        "ds": ["0044-03-15 BC", "10000-01-01"],
        "ts": "10000-01-01 00:00:00",
        "tz": "0044-03-15 12:00:00+00 BC",
        "tzs": ["12000-06-01 00:00:00+00"],
    }
    # a view holding the same text (a string column) or the same values compares equal; another value does not
    view = [
        dict(rows[1]),
        {**rows[2], "ds": '["infinity","-infinity","2020-01-02"]'},
        {**rows[3], "ts": "infinity"},
    ]
    assert compare_rows("edges", SCHEMA, list(rows.values()), view[:2]) == [
        "edges: key ('3',) is in the source but not in the view"
    ]
    differences = compare_rows("edges", SCHEMA, list(rows.values()), view)
    assert differences == ["edges: key ('3',) column ts: source '10000-01-01 00:00:00' != view 'infinity'"]


def test_string_arrays_keep_their_padding_and_citext_arrays_their_elements(pg_url: str) -> None:
    """A ``character(n)[]`` is read with its padding (as the events carry it: a cast to ``text[]`` would cut
    it), and a ``citext[]``, an array type psycopg does not know, as a list of its elements."""
    execute(
        pg_url,
        "CREATE EXTENSION IF NOT EXISTS citext",
        "CREATE TABLE strings (id int PRIMARY KEY, bp character(3)[], ci citext[], vc varchar(5)[])",
        "INSERT INTO strings VALUES (1, '{a,bc}', '{Ab,cD}', '{\"x \",y}')",
    )
    types = {"id": "int4", "bp": "_bpchar", "ci": "_citext", "vc": "_varchar"}
    schema = TableSchema("public", "strings", "cdc.public.strings", tuple(Column(n, t, key=n == "id") for n, t in types.items()))
    with psycopg.connect(pg_url, options=SESSION_OPTIONS) as conn:
        read_every_value(conn)
        rows = source_rows(conn, schema)
    assert rows == [{"id": 1, "bp": ["a  ", "bc "], "ci": ["Ab", "cD"], "vc": ["x ", "y"]}]


KINDS = {
    "id": "int4",
    "i": "int8",
    "f": "float8",
    "r": "float4",
    "n": "numeric",
    "u": "numeric",
    "d": "date",
    "ts": "timestamp",
    "tz": "timestamptz",
    "b": "bool",
    "t": "text",
    "c": "bpchar",
    "v": "varchar",
    "g": "uuid",
    "by": "bytea",
    "j": "jsonb",
    "iv": "interval",
    "ia": "_int4",
    "ta": "_text",
    "da": "_date",
    "secret": "text",
}


def test_a_copy_of_a_table_hashes_as_its_rows_read_by_a_cursor_do(pg_url: str) -> None:
    """Each value of a table read through COPY as text (what verify hashes a large table from) hashes as
    the value a cursor loads (what it compares row by row, and finds a row's bucket again from): NULLs,
    empty strings, quotes and newlines, NaN and -0, infinite and BC dates, decimals of any scale, arrays,
    JSON, bytes, a masked column."""
    import pyarrow as pa

    from derived_views.runs.verify_hashes import columns_of
    from derived_views.runs.verify_reads import copied_batches, source_batches
    from derived_views.runs.verify_values import copied

    execute(
        pg_url,
        "CREATE TABLE kinds (id int PRIMARY KEY, i int8, f float8, r real, n numeric(12,2), u numeric, d date, "
        "ts timestamp, tz timestamptz, b bool, t text, c char(3), v varchar(5), g uuid, by bytea, j jsonb, "
        "iv interval, ia int[], ta text[], da date[], secret text)",
        "INSERT INTO kinds VALUES (1, -9223372036854775808, 'NaN', 0.1, 12.30, 1.5000, 'infinity', '-infinity', "
        "'0044-03-15 12:00:00+00 BC', true, '', 'a', 'x\"y', '9c8b3c4e-3f1a-4d6e-9d2b-1f0e5a7c6b8d', '\\x00ff', "
        "'{\"b\": [1, 2.50], \"a\": null}', '1 day 02:03:04', "
        "'{1,NULL,3}', '{\"a,b\",\"\",NULL}', '{infinity,2020-01-02}', 'hidden')",
        "INSERT INTO kinds VALUES (2, 5, '-0', 'Infinity', -0.5, 123456789012345678901234567890.123456789, '2020-02-29', "
        "'2020-01-01 12:00:00.5', '2020-01-01 00:00:00+02', false, E'line\\none, \"two\"', NULL, NULL, NULL, '', "
        "'[]', NULL, '{}', '{}', NULL, '')",
        "INSERT INTO kinds (id) VALUES (3)",
    )
    schema = TableSchema("public", "kinds", "cdc.public.kinds", tuple(Column(n, t, key=n == "id") for n, t in KINDS.items()))
    masks = {"secret": str.upper}
    with psycopg.connect(pg_url, options=SESSION_OPTIONS) as conn:
        read_every_value(conn)
        rows = sorted((row for batch in source_batches(conn, schema, None, masks, as_text=True) for row in batch), key=str)
        copy = copied_batches(conn, schema, None, masks)
        assert copy is not None
        table = pa.Table.from_batches(list(copy()))
    table = table.sort_by([("c0", "ascending")])  # ids 1 to 3, as text
    assert [row[0] for row in rows] == [1, 2, 3] and table.column(0).to_pylist() == ["1", "2", "3"]
    for (name, type_name), column, values in zip(KINDS.items(), columns_of(list(KINDS.values())), zip(*rows), strict=True):
        from_copy = column.hashes(table.column(list(KINDS).index(name)).combine_chunks()).tolist()
        assert from_copy == column.hashes(list(values)).tolist(), (name, type_name, values)
    # arrays whose JSON is not read back alike (a decimal's digits, a float's -0, bytes) leave COPY out
    assert [copied('"a"', t) for t in ("_numeric", "_float8", "_bytea")] == [None, None, None]
