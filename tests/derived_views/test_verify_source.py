"""derived_views.views.verify reads every value PostgreSQL holds: dates and timestamps Python cannot hold
(``infinity``, BC, years past 9999), in columns and arrays, come back as the server's text."""

from __future__ import annotations

from datetime import UTC, date, datetime

import psycopg
import pytest

from derived_views.events.schema import Column, TableSchema
from derived_views.views.verify_values import SESSION_OPTIONS, read_every_value
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
