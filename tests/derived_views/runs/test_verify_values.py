"""How verify compares one value: the source's form (psycopg, or the server's text for what Python
cannot hold) against the view's (Delta's types, or the text a column holds when its type cannot)."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pytest

from derived_views.runs.verify_values import normalize

SAME = [
    # (type, source value, view value)
    ("date", "infinity", "infinity"),
    ("date", "4713-01-01 BC", "4713-01-01 BC"),
    ("date", "5874897-12-31", "5874897-12-31"),
    ("date", date(2020, 2, 29), "2020-02-29"),
    ("timestamp", "294276-12-31 23:59:59.999999", "294276-12-31T23:59:59.999999"),
    ("timestamp", "0044-03-15 12:00:00 BC", "0044-03-15 12:00:00 BC"),
    ("timestamp", datetime(2020, 1, 1, 12, 0, 0, 500000), "2020-01-01T12:00:00.5"),
    ("timestamptz", "294276-12-31 23:59:59.999999+00", "294276-12-31T23:59:59.999999Z"),
    ("timestamptz", "-infinity", "-infinity"),
    ("timestamptz", datetime(2020, 1, 1, tzinfo=UTC), "2020-01-01T00:00:00Z"),
    ("numeric", Decimal("NaN"), "NaN"),
    ("numeric", Decimal("-Infinity"), "-Infinity"),
    ("numeric", Decimal("19.90"), "19.90"),
    ("float8", float("nan"), float("nan")),
    ("float8", -0.0, -0.0),
    ("float4", float("-inf"), float("-inf")),
    ("timetz", "12:00:00+02", "12:00:00+02:00"),
    ("timetz", "24:00:00-15:59", "24:00:00-15:59"),
    ("timetz", "23:59:59+05:30:15", "23:59:59+05:30:15"),
    ("inet", "::ffff:1.2.3.4/128", "::ffff:1.2.3.4"),
    ("inet", "10.0.0.1/8", "10.0.0.1/8"),
    ("cidr", "2001:db8::/32", "2001:db8::/32"),
    ("_date", [date(2020, 1, 1), "infinity", "0044-03-15 BC"], '["2020-01-01","infinity","0044-03-15 BC"]'),
    ("_numeric", [Decimal("NaN"), Decimal("1.50")], '["NaN","1.50"]'),
    ("_float8", [float("nan"), -0.0], '["NaN",-0.0]'),
    ("_timestamptz", ["infinity", datetime(2020, 1, 1, tzinfo=UTC)], '["infinity","2020-01-01T00:00:00Z"]'),
]

DIFFERENT = [
    ("date", "4713-01-01 BC", date(4713, 1, 1)),
    ("date", "infinity", "-infinity"),
    ("timestamp", "0001-01-01 00:00:00 BC", datetime(1, 1, 1)),
    ("numeric", Decimal("NaN"), "0"),
    ("float8", -0.0, 0.0),
    ("float4", float("nan"), 0.0),
    ("timetz", "12:00:00+02", "12:00:00+03:00"),
    ("_date", ["infinity"], '["-infinity"]'),
    ("inet", "10.0.0.1/8", "10.0.0.1"),
]


@pytest.mark.parametrize(("type_name", "source", "view"), SAME)
def test_a_value_and_its_view_form_compare_equal(type_name: str, source: Any, view: Any) -> None:
    assert normalize(source, type_name) == normalize(view, type_name)


@pytest.mark.parametrize(("type_name", "source", "view"), DIFFERENT)
def test_a_changed_value_compares_different(type_name: str, source: Any, view: Any) -> None:
    """NaN, negative zero, a BC date's era and an offset are part of the value."""
    assert normalize(source, type_name) != normalize(view, type_name)
