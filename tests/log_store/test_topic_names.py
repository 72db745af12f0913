"""The name mapping of :mod:`log_store.topic_names`: each step reads back, so the whole is injective."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from log_store.topic import validate_topic_name
from log_store.topic_names import (
    KEPT,
    MAX_LENGTH,
    dir_name,
    escape,
    fit,
    log_name,
    parse_log_name,
    topic_name,
    unescape,
)
from tests.cdc.config.test_topic_for import IDENTIFIERS


@settings(max_examples=300, deadline=None)
@given(IDENTIFIERS)
def test_escaping_reads_back_and_uses_only_plain_characters(name: str) -> None:
    escaped = escape(name)
    assert re.fullmatch(r"[A-Za-z0-9_-]+", escaped)
    assert unescape(escaped) == name


@settings(max_examples=300, deadline=None)
@given(IDENTIFIERS, IDENTIFIERS)
def test_a_log_name_reads_back_to_its_table(schema: str, table: str) -> None:
    assert parse_log_name(log_name(schema, table)) == (schema, table)


@pytest.mark.parametrize("text", ["_2", "_2E", "_41", "a.b", "_", "_ff", "x_zz"])
def test_text_no_name_escapes_to_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not an escaped name"):
        unescape(text)


@pytest.mark.parametrize("text", ["public", "public.x.y", "a..b..c", "..b", "a..", "a. b", "public.._2e.x", "public..x"])
def test_text_that_is_no_log_name_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not the log name of a table"):
        parse_log_name(text)


def test_an_empty_name_is_refused() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        log_name("public", "")


def test_fitting_keeps_short_names_and_hashes_long_ones_to_exactly_249() -> None:
    assert fit("x" * KEPT) == "x" * KEPT
    long = fit("x" * (KEPT + 1))
    assert len(long) == MAX_LENGTH and long.startswith("x" * 232 + "-")
    assert fit("x" * (KEPT + 1)) == long != fit("x" * (KEPT + 2))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(IDENTIFIERS, IDENTIFIERS), min_size=2, max_size=30, unique=True))
def test_topics_and_directories_are_legal_and_one_per_table(tables: list[tuple[str, str]]) -> None:
    topics = [topic_name("cdc", schema, table) for schema, table in tables]
    dirs = [dir_name(log_name(schema, table)) for schema, table in tables]
    assert len(set(topics)) == len(set(dirs)) == len(tables)
    for topic in topics:
        assert validate_topic_name(topic) == topic
    for name in dirs:
        assert "/" not in name and not name.startswith(".") and len(name) <= MAX_LENGTH


def test_directories_stay_inside_their_parent(tmp_path: Path) -> None:
    for schema, table in [("..", ".."), ("public", "../../etc"), ("a/b", "c"), ("public", "."), ("é" * 31, "ü" * 31)]:
        path = tmp_path / dir_name(log_name(schema, table))
        path.mkdir()
        assert path.resolve().parent == tmp_path.resolve()


def test_a_prefix_that_a_topic_name_cannot_hold_is_refused() -> None:
    with pytest.raises(ValueError, match="topic prefix"):
        topic_name("c.dc", "public", "products")
