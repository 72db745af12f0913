"""What a ``cdc snapshot --where`` condition may hold, and how its request is signed (pure logic)."""

from __future__ import annotations

import pytest

from cdc.capture.reads.read_conditions import ConditionError, read_condition, with_row_filter
from cdc.capture.reads.snapshot_requests import FRESH_MS, SnapshotRequest

COLUMNS = ("id", "name", "Mixed", "ts")
KEY = b"k" * 32


@pytest.mark.parametrize(
    ("text", "printed"),
    [
        ("id % 10 = 0", "id OPERATOR(pg_catalog.%) 10 OPERATOR(pg_catalog.=) 0"),
        ("lower(name) LIKE 'a%' AND id IN (1, 2)", "pg_catalog.lower(name) LIKE 'a%' AND id IN (1, 2)"),
        ('"Mixed" IS NULL OR ts > now()', '"Mixed" IS NULL OR ts OPERATOR(pg_catalog.>) pg_catalog.now()'),
        ("id BETWEEN 1 AND 5", "id BETWEEN 1 AND 5"),
        ("CAST(name AS evil) IS NULL", "CAST(name AS pg_catalog.evil) IS NULL"),
        ("ts > '2026-01-01'::timestamptz", "ts OPERATOR(pg_catalog.>) CAST('2026-01-01' AS timestamp with time zone)"),
    ],
)
def test_a_condition_is_printed_back_from_its_parse_tree_with_catalog_names(text: str, printed: str) -> None:
    assert read_condition(text, COLUMNS).sql == printed


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("true) OR (true", "is not an SQL condition"),
        ("id = 1; DELETE FROM t", "without other clauses"),
        ("id = 1 UNION SELECT 1", "without other clauses"),
        ("id = 1 ORDER BY 1", "without other clauses"),
        ("secret = 1", "secret is not a column the publication publishes"),
        ("mixed = 1", "mixed is not a column the publication publishes"),
        ("t.id = 1", "by their own name alone"),
        ("EXISTS (SELECT 1 FROM other)", "a subquery"),
        ("id IN (SELECT id FROM other)", "a subquery"),
        ("public.f(id)", "a function outside pg_catalog (public.f)"),
        ("id::public.t = 1", "a type outside pg_catalog (public.t)"),
        ("id OPERATOR(public.=) 1", "an operator outside pg_catalog"),
        ("count(*) > 1", "an aggregate or window function"),
        ("name COLLATE public.x = 'a'", "a collation outside pg_catalog (public.x)"),
        ("   ", "needs a condition"),
    ],
)
def test_a_condition_that_could_reach_beyond_the_row_is_refused(text: str, problem: str) -> None:
    with pytest.raises(ConditionError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        read_condition(text, COLUMNS)


def test_the_condition_is_anded_with_the_publications_row_filter() -> None:
    assert with_row_filter("(id > 5)", "id < 9") == "((id > 5)) AND (id < 9)"
    assert with_row_filter(None, "id < 9") == "id < 9"
    assert with_row_filter("(id > 5)", None) == "(id > 5)"


def test_only_a_fresh_request_signed_with_the_key_is_taken() -> None:
    at = 1_800_000_000_000
    request = SnapshotRequest(("public.big",), where="id OPERATOR(pg_catalog.=) 1").signed(KEY, at)
    parsed = SnapshotRequest.parse(request.content())
    assert parsed == request and parsed.signed_by(KEY, at + 1000)
    assert not parsed.signed_by(b"x" * 32, at), "another key"
    assert not parsed.signed_by(None, at), "capture without CDC_REQUEST_KEY"
    assert not parsed.signed_by(KEY, at + FRESH_MS + 1), "sent again later"
    tampered = SnapshotRequest(("public.big",), where="true", at=at, signature=request.signature)
    assert not tampered.signed_by(KEY, at), "another condition under the same signature"
    other_table = SnapshotRequest(("public.busy",), where=request.where, at=at, signature=request.signature)
    assert not other_table.signed_by(KEY, at)
    assert not SnapshotRequest(("public.big",), where=request.where, at=at).signed_by(KEY, at), "unsigned"
