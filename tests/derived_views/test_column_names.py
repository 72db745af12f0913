"""Stored column names (pure): names Delta refuses are percent-encoded, reversibly, and nothing else changes."""

from __future__ import annotations

from urllib.parse import unquote

import pytest

from derived_views.column_names import REFUSED, stored_name, stored_names
from derived_views.errors import ColumnNameClashError
from derived_views.schema import Column, SchemaVersion, TableSchema


@pytest.mark.parametrize("name", ["id", "Title", "author.ref", "e-mail", "Ünïcode", 'a"b', "a`b", "it's", "50%", "x%41"])
def test_a_name_delta_accepts_is_stored_as_it_is(name: str) -> None:
    assert stored_name(name) == name


@pytest.mark.parametrize(
    ("name", "stored"),
    [
        ("order date", "order%20date"),
        ("a=b (%)", "a%3Db%20%28%25%29"),
        ("sort, order", "sort%2C%20order"),
        ("x;{y}", "x%3B%7By%7D"),
        ("tab\there", "tab%09here"),
        ("new\nline", "new%0Aline"),
        ("Ünï côde", "Ünï%20côde"),
    ],
)
def test_a_refused_name_is_percent_encoded_and_decodes_back(name: str, stored: str) -> None:
    assert stored_name(name) == stored
    assert not any(ch in REFUSED for ch in stored)
    assert unquote(stored) == name


def test_two_names_stored_alike_are_refused_with_both_named() -> None:
    assert stored_names(["id", "order date", "x%41"]) == {"order date": "order%20date"}
    with pytest.raises(ColumnNameClashError, match="'a%20b' and 'a b' of public.t would both be stored as 'a%20b'"):
        stored_names(["a%20b", "a b"], "public.t")


def test_existing_types_and_renames_are_matched_by_stored_name() -> None:
    old = (Column("id", "int4", key=True, attnum=1), Column("due date", "int4", attnum=2))
    schema = TableSchema(
        "public",
        "t",
        "cdc.public.t",
        (Column("id", "int4", key=True, attnum=1), Column("due at", "int8", attnum=2)),
        lsn=20,
        versions=(SchemaVersion(10, old),),
    )
    existing = {"id": "int", "due%20date": "int"}
    assert schema.renames(existing) == {"due date": "due at"}
    assert schema.view_columns(existing) == [("id", "int"), ("due at", "bigint")]
