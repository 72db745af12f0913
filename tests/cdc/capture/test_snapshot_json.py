"""Snapshot reads built by the server's JSON equal what the stream builds for the same rows, for every type."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from cdc.run.coordinator import Capture
from migrations.sample_data import insert_sample_data
from tests.cdc.all_types import COLUMNS, ROWS, TYPES
from tests.cdc.helpers import execute, read_topic, settings_for

pytestmark = pytest.mark.pg


def _reads_and_changes(data_dir: Path, topic: str) -> tuple[list[tuple[bytes | None, dict]], list[tuple[bytes | None, dict]]]:  # type: ignore[type-arg]
    reads, changes = [], []
    for record in read_topic(data_dir, topic):
        if record.value is None:
            continue
        value = orjson.loads(record.value)
        (reads if value["op"] == "r" else changes).append((record.key, value["after"]))
    return sorted(reads, key=repr), sorted(changes, key=repr)


def test_snapshot_reads_equal_streamed_events_for_every_type(reference_db: str, tmp_path: Path) -> None:
    insert_sample_data(reference_db)
    execute(
        reference_db,
        *TYPES,
        f"CREATE TABLE alltypes (id int PRIMARY KEY, {COLUMNS})",
        f"INSERT INTO alltypes VALUES {', '.join(ROWS)}",
        # keys of several types, one the server cannot write byte-exactly (float), and no key at all
        "CREATE TABLE text_keys (k text, at timestamptz, u uuid, v int, PRIMARY KEY (k, at, u))",
        "INSERT INTO text_keys VALUES (E'a\\tb\\n\"c\\\\ \\x01 é', '2026-11-21 13:45:00.25+00', "
        "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', 1), ('plain', '-infinity', "
        "'00000000-0000-0000-0000-000000000000', 2)",
        "CREATE TABLE float_keys (k float8 PRIMARY KEY, v int[])",
        "INSERT INTO float_keys VALUES (1e+20, '{1}'), (0.1, NULL), ('NaN', '{}')",
        "CREATE TABLE keyless (v text, a numeric[])",
        "INSERT INTO keyless VALUES ('one', '{1.50,NULL}'), (NULL, NULL)",
        "ALTER PUBLICATION cdc_publication ADD TABLE alltypes, text_keys, float_keys, keyless",
    )
    settings = settings_for(reference_db, tmp_path)
    stats = Capture(settings, once=True).run()
    assert stats.snapshot_rows > 100
    # the same rows again, through the stream: an update that changes nothing carries the whole row
    updates = [
        f"UPDATE {table} SET {key} = {key}"
        for table, key in (
            ("customers", "id"),
            ("categories", "id"),
            ("products", "id"),
            ("orders", "id"),
            ("order_items", "line_no"),
            ("alltypes", "id"),
            ("text_keys", "v"),
            ("float_keys", "v"),
        )
    ]
    execute(reference_db, *updates, "INSERT INTO keyless SELECT * FROM keyless")
    Capture(settings, once=True).run()
    for table in (
        "customers",
        "categories",
        "products",
        "orders",
        "order_items",
        "alltypes",
        "text_keys",
        "float_keys",
        "keyless",
    ):
        reads, changes = _reads_and_changes(tmp_path, f"cdc.public.{table}")
        assert reads, table
        assert reads == changes, table  # keys byte for byte, values equal once parsed
