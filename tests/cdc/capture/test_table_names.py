"""Tables with any names are captured side by side, each into a topic of its own, under its real names."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from cdc.config.settings import Settings
from cdc.run.coordinator import Capture
from cdc.setup.source_checks import run_checks
from cdc.setup.source_objects import ensure_publication
from event_format import fold_after
from log_store import LogConfig, LogStore
from log_store.topic_names import log_name
from tests.cdc.helpers import events, execute, read_topic, replay, settings_for

pytestmark = pytest.mark.pg

#: ``(schema, table)``: a dot in the schema and a dot in the table giving the same ``schema.table`` text,
#: upper case, a space, quotes, non-ASCII letters, a path climbing up, and 63-byte names (hashed topic).
PAIR = [("public.x", "y"), ("public", "x.y")]
AWKWARD = [
    *PAIR,
    ("Sales", "Q1"),
    ("public", "Order Items"),
    ("public", 'say "hi"'),
    ("public", "naïve"),
    ("public", "../up"),
    ("é" * 31 + "x", "ü" * 31 + "y"),
]


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _create(url: str, tables: list[tuple[str, str]]) -> None:
    schemas = sorted({schema for schema, _ in tables} - {"public"})
    execute(
        url,
        *[f"CREATE SCHEMA {_quoted(s)}" for s in schemas],
        *[f"CREATE TABLE {_quoted(s)}.{_quoted(t)} (id int PRIMARY KEY, v text)" for s, t in tables],
    )


def _insert(url: str, schema: str, table: str, *ids: int) -> None:
    values = ", ".join(f"({i}, '{(schema + '/' + table).replace(chr(39), chr(39) * 2)}#{i}')" for i in ids)
    execute(url, f"INSERT INTO {_quoted(schema)}.{_quoted(table)} VALUES {values}")


def _rows(schema: str, table: str, *ids: int) -> dict[bytes | None, dict[str, object]]:
    return {orjson.dumps({"id": i}): {"id": i, "v": f"{schema}/{table}#{i}"} for i in ids}


def _setup(url: str, data_dir: Path, tables: list[tuple[str, str]]) -> Settings:
    _create(url, tables)
    settings = settings_for(url, data_dir)
    assert all(check.ok for check in run_checks(settings) if not check.warning)
    ensure_publication(settings)
    return settings


def test_a_dot_in_the_schema_and_one_in_the_table_name_two_topics(pg_url: str, tmp_path: Path) -> None:
    """``"public.x".y`` and ``public."x.y"``: the same key in both, and a truncate of one, stay apart."""
    settings = _setup(pg_url, tmp_path, PAIR)
    for schema, table in PAIR:
        _insert(pg_url, schema, table, 1, 2)
    Capture(settings, once=True).run()
    execute(pg_url, 'TRUNCATE "public.x".y')
    _insert(pg_url, "public.x", "y", 3)
    _insert(pg_url, "public", "x.y", 3)
    Capture(settings, once=True).run()

    topics = [settings.topic_for(schema, table) for schema, table in PAIR]
    assert len(set(topics)) == 2
    assert replay(tmp_path, topics[0]) == _rows("public.x", "y", 3)
    assert replay(tmp_path, topics[1]) == _rows("public", "x.y", 1, 2, 3)
    # compaction keeps every row of the table that was not truncated
    with LogStore.open(tmp_path / "log", LogConfig(fold=fold_after), writer=True) as log:
        log.roll()
        log.compact()
    assert replay(tmp_path, topics[1], strict=False) == _rows("public", "x.y", 1, 2, 3)


def test_tables_with_any_names_are_captured_each_into_its_own_topic(pg_url: str, tmp_path: Path) -> None:
    settings = _setup(pg_url, tmp_path, AWKWARD)
    for schema, table in AWKWARD:
        _insert(pg_url, schema, table, 1)
    Capture(settings, once=True).run()  # snapshot
    for schema, table in AWKWARD:
        _insert(pg_url, schema, table, 2)
    Capture(settings, once=True).run()  # stream

    with LogStore.open(tmp_path / "log") as log:
        present = set(log.topics())
    topics = {}
    for schema, table in AWKWARD:
        topic = settings.topic_for(schema, table)
        assert topic in present
        topics[topic] = (schema, table)
        got = events(tmp_path, topic)
        assert [e["op"] for e in got] == ["r", "c"]
        assert {(e["source"]["schema"], e["source"]["table"]) for e in got} == {(schema, table)}  # type: ignore[index]
        assert replay(tmp_path, topic) == _rows(schema, table, 1, 2)
    assert len(topics) == len(AWKWARD)
    assert topics[settings.topic_for("Sales", "Q1")] == ("Sales", "Q1")
    assert "cdc.Sales.Q1" in present and "cdc.public_2ex..y" in present and "cdc.public..x_2ey" in present

    # the schema topic and the ledger: one record per table, keyed by its log name, holding its real names
    # (the ledger's progress records of the reads, keyed ["read", name], are tombstoned at their end; its
    # ["timeline"] record names the source's timeline, cdc.capture.timelines)
    for internal in ("cdc.__schemas", "cdc.__snapshots"):
        stored = [(orjson.loads(r.key or b""), r.value) for r in read_topic(tmp_path, internal)]
        records = {key: orjson.loads(value) for key, value in stored if isinstance(key, str) and value is not None}
        assert {key[1] for key, _ in stored if isinstance(key, list) and key != ["timeline"]} <= records.keys()
        assert records.keys() == {log_name(schema, table) for schema, table in AWKWARD}
        for name, value in records.items():
            assert (value["schema"], value["table"]) == topics[value["topic"]]
            assert log_name(value["schema"], value["table"]) == name


def test_setup_judges_each_table_of_the_pair_by_its_own_names(pg_url: str, tmp_path: Path) -> None:
    """``"public.x".y`` without a key beside ``public."x.y"`` with one: setup names the right table."""
    execute(
        pg_url,
        'CREATE SCHEMA "public.x"',
        'CREATE TABLE "public.x".y (id int, v text)',
        'CREATE TABLE public."x.y" (id int PRIMARY KEY, v text)',
    )
    settings = settings_for(pg_url, tmp_path)
    checks = {check.name: check for check in run_checks(settings)}
    assert checks['table public."x.y" key'].ok
    broken = checks['table "public.x".y key']
    assert not broken.ok and 'ALTER TABLE "public.x".y REPLICA IDENTITY FULL' in broken.message
