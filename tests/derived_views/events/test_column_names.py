"""Stored column names (pure): names Delta refuses are percent-encoded, reversibly, case-only twins are
stored apart without renaming a column a table holds, and nothing else changes."""

from __future__ import annotations

import re
from urllib.parse import unquote

import pytest

from derived_views.errors import ColumnNameClashError
from derived_views.events.column_names import REFUSED, folded, forms, source_columns, stored_columns, stored_name, stored_names
from derived_views.events.schema import Column, SchemaVersion, TableSchema


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


def test_names_stored_alike_are_stored_apart_and_a_name_without_a_free_form_is_refused() -> None:
    assert stored_names(["id", "order date", "x%41"]) == {"order date": "order%20date"}
    assert stored_names(["a%20b", "a b"]) == {"a b": "a%20b", "a%20b": "a%2520b"}
    with pytest.raises(ColumnNameClashError, match="'a' and 'A' of public.t would both be stored as 'A'"):
        stored_names(["a", "%41", "A"], "public.t")


EVERY_LETTER = "%64%75%72%61%74%69%6F%6E"  # duration, every letter encoded


@pytest.mark.parametrize(
    ("names", "stored"),
    [
        (["id", "duration", "Duration"], ["id", "duration", "%44uration"]),
        (["Duration", "duration"], ["%44uration", "duration"]),
        (["DURATION", "Duration"], ["%44%55%52%41%54%49%4F%4E", "Duration"]),
        (["duration", "Duration", "DURATION"], ["duration", "%44uration", "%44%55%52%41%54%49%4F%4E"]),
        (["Öl", "öl"], ["%C3%96l", "öl"]),
        (["A b", "a b"], ["%41%20b", "a%20b"]),
        (["Title", "id"], ["Title", "id"]),
    ],
)
def test_case_only_twins_in_a_new_table_are_stored_apart_and_decode_back(names: list[str], stored: list[str]) -> None:
    assert list(stored_columns(names).values()) == stored
    assert len({folded(name) for name in stored}) == len(stored)
    assert [unquote(name) for name in stored] == names
    assert source_columns(names, stored) == dict(zip(names, stored, strict=True))


@pytest.mark.parametrize(
    ("existing", "names", "stored"),
    [
        (["id", "duration"], ["id", "duration", "Duration"], ["id", "duration", "%44uration"]),
        (["id", "Duration"], ["id", "Duration", "duration"], ["id", "Duration", EVERY_LETTER]),
        (["Duration"], ["DURATION", "Duration", "duration"], ["%44%55%52%41%54%49%4F%4E", "Duration", EVERY_LETTER]),
        (["%44uration", "duration"], ["Duration", "duration", "x"], ["%44uration", "duration", "x"]),
        (["Duration"], ["duration"], [EVERY_LETTER]),  # a dropped Duration the table still holds
    ],
)
def test_a_twin_that_appears_later_never_renames_a_column_the_table_holds(
    existing: list[str], names: list[str], stored: list[str]
) -> None:
    assert list(stored_columns(names, existing).values()) == stored
    assert all(column in stored for column in existing if folded(column) in {folded(s) for s in stored})
    assert len({folded(name) for name in [*stored, *(c for c in existing if c not in stored)]}) == len(
        set(stored) | set(existing)
    )
    assert source_columns(names, [*stored, *existing]) == dict(zip(names, stored, strict=True))
    # the table written with those names keeps them: the next sync, and a rebuild, store the same
    assert stored_columns(names, stored) == dict(zip(names, stored, strict=True))


@pytest.mark.parametrize("name", ["duration", "Duration", "DURATION", "a b", "Ünï côde", "50%", "x%41"])
def test_every_form_decodes_back(name: str) -> None:
    plain, upper, every = forms(name)
    assert plain == stored_name(name)
    assert unquote(upper) == unquote(every) == name
    unescaped = re.sub("%[0-9A-F]{2}", "", every)
    assert unescaped.lower() == unescaped.upper()  # no letter with a case is left


def test_a_rename_into_a_twin_renames_the_column_to_a_name_of_its_own() -> None:
    old = (Column("id", "int4", key=True, attnum=1), Column("duration", "int4", attnum=2), Column("other", "text", attnum=3))
    schema = TableSchema(
        "public",
        "t",
        "cdc.public.t",
        (Column("id", "int4", key=True, attnum=1), Column("duration", "int4", attnum=2), Column("Duration", "text", attnum=3)),
        lsn=20,
        versions=(SchemaVersion(10, old),),
    )
    existing = {"id": "int", "duration": "int", "other": "string"}
    assert schema.renames(existing) == {"other": "Duration"}
    assert schema.stored_renames(existing) == {"other": "%44uration"}
    assert schema.view_columns(existing) == [("id", "int"), ("duration", "int"), ("Duration", "string")]
    renamed = {"id": "int", "duration": "int", "%44uration": "string"}
    assert schema.renames(renamed) == {}
    assert schema.stored_columns(renamed) == {"id": "id", "duration": "duration", "Duration": "%44uration"}


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
