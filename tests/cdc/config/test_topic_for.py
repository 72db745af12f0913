"""The topic of a source table: legal for Kafka, one per table, stable, and unchanged for plain names."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from cdc.config.settings import Settings, load_settings
from cdc.errors import ConfigError

_KAFKA = re.compile(r"[A-Za-z0-9._-]{1,249}")

#: Characters that break a naive mapping: dots, quotes, spaces, escapes, non-ASCII letters, case.
_AWKWARD = st.sampled_from(list("aZ09_-.\" '$/\\%é€ß日😀") + ["_2e", "__", ".."])
#: PostgreSQL identifiers: any characters but NUL, 1 to 63 bytes of UTF-8.
IDENTIFIERS = st.one_of(
    st.lists(_AWKWARD, min_size=1, max_size=12).map("".join),
    st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), min_size=1, max_size=63),
).filter(lambda name: len(name.encode()) <= 63)


def _settings(prefix: str = "cdc") -> Settings:
    return load_settings(topic_prefix=prefix)


def legal(topic: str) -> bool:
    return _KAFKA.fullmatch(topic) is not None and topic not in (".", "..")


@pytest.mark.parametrize(
    ("schema", "table"),
    [
        ("public", "products"),
        ("public", "order_items"),
        ("public", "categories"),
        ("Sales", "Order-Lines"),
        ("s_1", "t_2"),
        ("_", "-"),
    ],
)
def test_plain_names_keep_their_topic(schema: str, table: str) -> None:
    assert _settings().topic_for(schema, table) == f"cdc.{schema}.{table}"
    assert _settings("shop_prod").topic_for(schema, table) == f"shop_prod.{schema}.{table}"


def test_a_dot_in_a_schema_and_a_dot_in_a_table_give_two_topics() -> None:
    s = _settings()
    assert s.topic_for("public.x", "y") != s.topic_for("public", "x.y")
    assert s.topic_for("public.x", "y") == "cdc.public_2ex..y"
    assert s.topic_for("public", "x.y") == "cdc.public..x_2ey"


@pytest.mark.parametrize(
    ("schema", "table", "topic"),
    [
        ("public", "Order Items", "cdc.public..Order_20Items"),
        ("public", 'say "hi"', "cdc.public..say_20_22hi_22"),
        ("public", "naïve", "cdc.public..na_c3_afve"),
        ("public", "a_b.c", "cdc.public..a__b_2ec"),
        ("public", "a__b_2ec", "cdc.public.a__b_2ec"),
        ("my schema", "t", "cdc.my_20schema..t"),
        ("public", "../etc", "cdc.public.._2e_2e_2fetc"),
        ("public", "日本", "cdc.public.._e6_97_a5_e6_9c_ac"),
    ],
)
def test_other_names_are_escaped_as_documented(schema: str, table: str, topic: str) -> None:
    assert _settings().topic_for(schema, table) == topic
    assert legal(topic)


def test_63_byte_names_fit_with_a_hash() -> None:
    s = _settings()
    schema, table = "é" * 31 + "x", "ü" * 31 + "y"  # 63 bytes each, 187 characters each once escaped
    topic = s.topic_for(schema, table)
    assert legal(topic) and len(topic) == 249
    assert topic.startswith("cdc._c3_a9_c3_a9")
    assert topic != s.topic_for(schema, "ü" * 31 + "z")
    assert topic == s.topic_for(schema, table)
    plain = "a" * 63
    assert s.topic_for(plain, plain) == f"cdc.{plain}.{plain}"  # a plain 63-character pair keeps its name


@hypothesis_settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(IDENTIFIERS, IDENTIFIERS), min_size=2, max_size=40, unique=True))
def test_topics_are_legal_and_one_per_table(tables: list[tuple[str, str]]) -> None:
    s = _settings()
    topics = [s.topic_for(schema, table) for schema, table in tables]
    assert all(legal(topic) for topic in topics), topics
    assert len(set(topics)) == len(tables)


@hypothesis_settings(max_examples=200, deadline=None)
@given(IDENTIFIERS, IDENTIFIERS)
def test_a_topic_is_stable_and_plain_names_are_unchanged(schema: str, table: str) -> None:
    first = _settings().topic_for(schema, table)
    assert _settings().topic_for(schema, table) == first
    plain = re.compile(r"[A-Za-z0-9_-]+")
    if plain.fullmatch(schema) and plain.fullmatch(table):
        assert first == f"cdc.{schema}.{table}"
    else:
        assert first.startswith("cdc.") and (".." in first or len(first) == 249)


def test_a_prefix_longer_than_100_characters_is_refused() -> None:
    with pytest.raises(ConfigError, match="CDC_TOPIC_PREFIX"):
        _settings("p" * 101)
    assert _settings("p" * 100).topic_for("public", "products") == "p" * 100 + ".public.products"
