"""Type mapping, BM25 scoring and progress metadata, without Spark."""

from __future__ import annotations

import math

import pytest

from derived_views.engine.progress import Progress, min_offsets
from derived_views.events.schema import TableSchema, numeric_precision_scale, spark_type
from derived_views.views.bm25 import Posting, idf, rank, term_score, tokenize
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


def test_tokenize_splits_on_non_alphanumerics() -> None:
    assert tokenize("Desk-Lamp, 60W (brass)_x") == ["desk", "lamp", "60w", "brass", "x"]
    assert tokenize(None) == []


def test_bm25_prefers_rare_terms_and_shorter_documents() -> None:
    assert idf(100, 1) > idf(100, 50) > 0
    assert term_score(1, 5, 100, 10, 20.0) > term_score(1, 5, 100, 40, 20.0)
    assert term_score(3, 5, 100, 20, 20.0) > term_score(1, 5, 100, 20, 20.0)
    expected = math.log(1 + (10 - 1 + 0.5) / 1.5) * 2.2 / (1 + 1.2)
    assert term_score(1, 1, 10, 20, 20.0) == pytest.approx(expected)


def test_rank_sums_terms_and_orders_best_first() -> None:
    postings = [Posting(1, "lamp", 1, 10), Posting(2, "lamp", 1, 10), Posting(2, "brass", 1, 10)]
    ranked = rank(postings, n_docs=10, avg_len=10.0, limit=5)
    assert [doc for doc, _ in ranked] == [2, 1]
    assert rank(postings, 10, 10.0, limit=1)[0][0] == 2


def test_progress_round_trips_and_ignores_foreign_metadata() -> None:
    progress = Progress({"cdc.public.products": {"0": 3, "1": 9}}, "0000000000001A00", 123)
    assert Progress.from_json(progress.to_json()) == progress
    assert progress.lsn == 0x1A00
    assert Progress.from_json("nightly OPTIMIZE") is None and Progress.from_json(None) is None
    other = Progress({"cdc.public.products": {"0": 1, "1": 12}})
    assert min_offsets([progress, other], ["cdc.public.products"]) == {"cdc.public.products": {"0": 1, "1": 9}}
