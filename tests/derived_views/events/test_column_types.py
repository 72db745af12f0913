"""Pure rules of view column types: supertypes, the types and names each schema version parses with."""

from __future__ import annotations

import re

import pytest

from derived_views.events.column_types import MISREAD_DATE, out_of_range, supertype, widest
from derived_views.events.schema import Column, SchemaVersion, TableSchema
from derived_views.write.table_evolution import features_of


@pytest.mark.parametrize(
    ("left", "right", "expected"),
    [
        ("int", "int", "int"),
        ("int", "bigint", "bigint"),
        ("smallint", "int", "int"),
        ("float", "double", "double"),
        ("int", "double", "double"),
        ("bigint", "double", "string"),  # a bigint does not fit a double exactly
        ("decimal(10,2)", "decimal(12,3)", "decimal(12,3)"),
        ("decimal(10,2)", "decimal(10,5)", "decimal(13,5)"),
        ("int", "decimal(10,2)", "decimal(12,2)"),
        ("bigint", "decimal(30,20)", "string"),  # 19 integer digits and 20 of scale exceed 38
        ("string", "int", "string"),
        ("array<int>", "array<bigint>", "string"),
        ("timestamp", "timestamp_ntz", "string"),
        ("date", "timestamp", "string"),
    ],
)
def test_supertype_holds_both_types_exactly(left: str, right: str, expected: str) -> None:
    assert supertype(left, right) == expected
    assert supertype(right, left) == expected


def test_widest_never_narrows() -> None:
    assert widest(["int", "bigint", "int"]) == "bigint"
    assert widest(["string", "int"]) == "string"


@pytest.mark.parametrize(
    ("spark_type", "text", "expected"),
    [
        ("date", "infinity", True),
        ("date", "-infinity", True),
        ("date", "0044-03-15 BC", True),
        ("date", "5874897-12-31", True),
        ("date", "2020-02-29", False),
        ("date", "not a date", False),  # no value PostgreSQL writes: poison
        ("timestamp_ntz", "4713-01-01 00:00:00 BC", True),
        ("timestamp_ntz", "294276-12-31T23:59:59.999999", True),
        ("timestamp", "4713-01-01 00:00:00+00 BC", True),
        ("timestamp", "294276-12-31T23:59:59.999999Z", True),
        ("timestamp", "2020-01-01T00:00:00Z", False),
        ("decimal(10,2)", "NaN", True),
        ("decimal(10,2)", "-Infinity", True),
        ("decimal(10,2)", "not a number", False),
        ("array<date>", '["2020-01-01","infinity"]', True),
        ("array<timestamp>", '["2020-01-01T00:00:00Z",null,"0001-01-01 00:00:00+00 BC"]', True),
        ("array<decimal(6,2)>", '["1.50","NaN"]', True),
        ("array<decimal(6,2)>", '["1.50"]', False),
    ],
)
def test_a_value_postgresql_holds_and_spark_does_not_turns_the_column_into_text(
    spark_type: str, text: str, expected: bool
) -> None:
    """Dates, timestamps and decimals are narrower than PostgreSQL's: infinity, BC, years past 9999, NaN."""
    pattern = out_of_range(spark_type)
    assert pattern is not None and bool(re.search(pattern, text)) is expected


@pytest.mark.parametrize("spark_type", ["int", "double", "string", "binary", "array<int>", "boolean"])
def test_other_types_hold_every_value_postgresql_writes_for_them(spark_type: str) -> None:
    """A misfit in any other type is poison (an ``int[]`` turns into text for a multi-dimensional array only)."""
    assert out_of_range(spark_type) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [("4713-01-01 BC", True), ("10000-01-01", True), ('["2020-01-01","0044-03-15 BC"]', True), ("2020-01-01", False)],
)
def test_dates_spark_reads_as_other_dates_are_recognised(text: str, expected: bool) -> None:
    assert bool(re.search(MISREAD_DATE, text)) is expected


def _schema(*versions: tuple[int, tuple[Column, ...]]) -> TableSchema:
    *earlier, (lsn, columns) = versions
    return TableSchema("public", "t", "cdc.public.t", columns, lsn, tuple(SchemaVersion(at, c) for at, c in earlier))


def test_a_table_whose_columns_never_changed_parses_with_one_entry() -> None:
    schema = _schema((100, (Column("id", "int4", key=True, attnum=1), Column("v", "text", attnum=2))))
    columns = schema.view_columns()
    assert columns == [("id", "int"), ("v", "string")]
    assert schema.parse_plan(columns) == [((100, 0), [("id", "int"), ("v", "string")])]


def test_a_type_change_widens_and_each_version_parses_with_its_own_types() -> None:
    schema = _schema(
        (100, (Column("id", "int4", attnum=1), Column("n", "int4", attnum=2), Column("s", "varchar", attnum=3))),
        (200, (Column("id", "int4", attnum=1), Column("n", "int8", attnum=2), Column("s", "int4", attnum=3))),
    )
    columns = schema.view_columns()
    assert columns == [("id", "int"), ("n", "bigint"), ("s", "string")]
    assert schema.parse_plan(columns) == [
        ((100, 0), [("id", "int"), ("n", "int"), ("s", "string")]),  # a string view column parses as text throughout
        ((200, 0), [("id", "int"), ("n", "bigint"), ("s", "string")]),
    ]
    # the table's own type counts too, and a multi-dimensional array column is text
    assert schema.view_columns({"n": "string"}, text={"id"}) == [("id", "string"), ("n", "string"), ("s", "string")]


def test_a_renamed_column_reads_its_old_name_and_a_re_added_one_is_another_column() -> None:
    schema = _schema(
        (100, (Column("id", "int4", attnum=1), Column("note", "text", attnum=2), Column("x", "int4", attnum=3))),
        (200, (Column("id", "int4", attnum=1), Column("remark", "text", attnum=2), Column("x", "text", attnum=4))),
    )
    columns = schema.view_columns()
    assert columns == [("id", "int"), ("remark", "string"), ("x", "string")]  # the old x's int is not counted
    first, second = schema.parse_plan(columns)
    assert first[1][1] == ("note", "string") and first[1][2][0] != "x"  # the dropped x is not read as the new one
    assert second == ((200, 0), [("id", "int"), ("remark", "string"), ("x", "string")])
    assert schema.renames({"id": "int", "note": "string", "x": "int"}) == {"note": "remark"}
    assert schema.renames({"id": "int", "remark": "string"}) == {}
    # without attribute numbers (records of an older capture) columns are known by name
    plain = _schema((100, (Column("id", "int4"), Column("x", "int4"))), (200, (Column("id", "int4"), Column("x", "int8"))))
    assert plain.view_columns() == [("id", "int"), ("x", "bigint")]


def test_a_version_that_starts_inside_a_transaction_is_bounded_by_the_sequence() -> None:
    """A shape changed inside a transaction holds from that transaction's next event: events of the same
    commit LSN before it keep the earlier version."""
    schema = TableSchema(
        "public",
        "t",
        "cdc.public.t",
        (Column("id", "int4", attnum=1), Column("n", "int8", attnum=2)),
        200,
        (SchemaVersion(100, (Column("id", "int4", attnum=1), Column("n", "int4", attnum=2))),),
        5,
    )
    assert [position for position, _ in schema.parse_plan(schema.view_columns())] == [(100, 0), (200, 5)]


def test_a_timestamp_ntz_anywhere_in_a_type_needs_the_timestampNtz_feature() -> None:
    assert features_of(["int", "timestamp_ntz"]) == {"timestampNtz"}
    assert features_of(["array<timestamp_ntz>"]) == features_of(["struct<a:timestamp_ntz>"]) == {"timestampNtz"}
    assert features_of(["timestamp", "array<timestamp>", "string", "date"]) == set()
