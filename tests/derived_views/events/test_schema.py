"""Source columns' faithful Spark types, a numeric's precision and scale, and a schema record parsed, without Spark."""

from __future__ import annotations

import pytest

from derived_views.events.schema import TableSchema, numeric_precision_scale, spark_type
from tests.derived_views.log_builder import REFERENCE, numeric_typmod


@pytest.mark.parametrize(
    ("type_name", "typmod", "expected"),
    [
        ("int2", -1, "smallint"),
        ("int4", -1, "int"),
        ("int8", -1, "bigint"),
        ("float8", -1, "double"),
        ("numeric", numeric_typmod(12, 2), "decimal(12,2)"),
        ("numeric", -1, "string"),
        ("numeric", numeric_typmod(60, 4), "string"),
        ("numeric", numeric_typmod(38, 38), "decimal(38,38)"),
        ("numeric", numeric_typmod(3, 5), "decimal(5,5)"),  # scale above the precision (PostgreSQL 15)
        ("numeric", numeric_typmod(5, -2), "decimal(7,0)"),  # negative scale (PostgreSQL 15)
        ("numeric", numeric_typmod(37, -2), "string"),
        ("numeric", numeric_typmod(10, 1000), "string"),
        ("timestamptz", -1, "timestamp"),
        ("timestamp", 6, "timestamp_ntz"),
        ("jsonb", -1, "string"),
        ("_text", -1, "array<string>"),
        ("_numeric", numeric_typmod(10, 3), "array<decimal(10,3)>"),
        ("uuid", -1, "string"),
        ("bytea", -1, "binary"),
        ("date", -1, "date"),
        ("order_status", -1, "string"),
        ("bool", -1, "boolean"),
    ],
)
def test_spark_type_is_faithful(type_name: str, typmod: int, expected: str) -> None:
    assert spark_type(type_name, typmod) == expected


def test_numeric_typmod_decodes_precision_and_scale() -> None:
    assert numeric_precision_scale(numeric_typmod(14, 2)) == (14, 2)
    assert numeric_precision_scale(numeric_typmod(5, -2)) == (5, -2)
    assert numeric_precision_scale(numeric_typmod(1000, -1000)) == (1000, -1000)
    assert numeric_precision_scale(numeric_typmod(3, 1000)) == (3, 1000)
    assert numeric_precision_scale(-1) is None


def test_schema_record_parses_keys_and_ddl() -> None:
    record = {
        "schema": "public",
        "table": "order_items",
        "topic": "cdc.public.order_items",
        "columns": REFERENCE["public.order_items"],
        "lsn": 5,
    }
    schema = TableSchema.from_record(record)
    assert [c.name for c in schema.key_columns] == ["order_id", "line_no"]
    assert "`unit_price` decimal(12,2)" in schema.ddl()
