"""A column added with values for the rows already there reaches those rows without a change event. A
constant default (stored once, the table not rewritten) reaches the log as a fact of the table's schema
record, the value every row before a position holds (tests/cdc/capture/test_stored_defaults.py); a volatile
default, an identity column or a domain with a constraint rewrite the table, and capture reads it again,
superseding what the log held. A column added without a default leaves them null and needs nothing, nor
does a generated column, which is not published."""

from __future__ import annotations

import threading
from pathlib import Path

import psycopg
import pytest

from cdc.config.settings import Settings
from cdc.run.coordinator import Capture
from cdc.run.tuning import Tuning
from tests.cdc.helpers import execute, replay, settings_for, source_table, wait_for

pytestmark = pytest.mark.pg


def _captured(url: str, data_dir: Path, table: str) -> Settings:
    execute(
        url,
        f"CREATE TABLE {table} (id int PRIMARY KEY, v text)",
        f"INSERT INTO {table} SELECT g, 'v' || g FROM generate_series(1, 20) g",
        f"ALTER PUBLICATION cdc_publication ADD TABLE {table}",
    )
    settings = settings_for(url, data_dir, tables=f"public.{table}")
    Capture(settings, once=True).run()
    assert replay(data_dir, f"cdc.public.{table}") == source_table(url, table)
    return settings


@pytest.mark.parametrize(
    ("statements", "read_again"),
    [
        (["ALTER TABLE widened ADD COLUMN status text NOT NULL DEFAULT 'new'"], False),  # carried by the schema record
        (["ALTER TABLE widened ADD COLUMN n int DEFAULT (random() * 1000)::int"], True),  # volatile: rewritten
        # the rewrite stays when the default goes
        (
            [
                "ALTER TABLE widened ADD COLUMN n int DEFAULT (random() * 1000)::int",
                "ALTER TABLE widened ALTER COLUMN n DROP DEFAULT",
            ],
            True,
        ),
        (["ALTER TABLE widened ADD COLUMN seq int GENERATED ALWAYS AS IDENTITY"], True),
        (["CREATE DOMAIN rating AS int DEFAULT 3", "ALTER TABLE widened ADD COLUMN stars rating"], False),
        (["CREATE DOMAIN grade AS int DEFAULT 3 CHECK (VALUE > 0)", "ALTER TABLE widened ADD COLUMN g grade"], True),
        (["ALTER TABLE widened ADD COLUMN note text"], False),
        # existing rows keep their null: a default set afterwards is for later inserts
        (["ALTER TABLE widened ADD COLUMN note text", "ALTER TABLE widened ALTER COLUMN note SET DEFAULT 'x'"], False),
        # generated columns are not published (pgoutput sends none), so the rows in the log are whole
        (["ALTER TABLE widened ADD COLUMN twice int GENERATED ALWAYS AS (id * 2) STORED"], False),
    ],
    ids=[
        "default",
        "volatile",
        "volatile-dropped",
        "identity",
        "domain",
        "checked-domain",
        "plain",
        "plain-then-default",
        "generated",
    ],  # fmt: skip
)
def test_existing_rows_of_an_added_column_reach_the_log(
    reference_db: str, tmp_path: Path, statements: list[str], read_again: bool
) -> None:
    settings = _captured(reference_db, tmp_path, "widened")
    execute(
        reference_db,
        *statements,
        "UPDATE widened SET v = 'after' WHERE id = 1",
        "INSERT INTO widened (id, v) VALUES (21, 'new row')",
    )
    stats = Capture(settings, once=True).run()
    assert stats.tables_added == (1 if read_again else 0)
    published = _published_columns(reference_db, "widened")
    # an event from before a column existed does not name it: a consumer reads that as null
    assert {key: {**dict.fromkeys(published), **row} for key, row in replay(tmp_path, "cdc.public.widened").items()} == {
        key: {name: row[name] for name in published} for key, row in source_table(reference_db, "widened").items()
    }
    # once read again (or carried), the table is not read on every start
    assert Capture(settings, once=True).run().tables_added == 0


def _published_columns(url: str, table: str) -> list[str]:
    """The table's columns that pgoutput publishes (generated ones are not)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
            "AND NOT attisdropped AND attgenerated = '' ORDER BY attnum",
            (table,),
        ).fetchall()
    return [str(row[0]) for row in rows]


def test_a_volatile_column_added_while_capture_streams_has_the_table_read_again(reference_db: str, tmp_path: Path) -> None:
    settings = _captured(reference_db, tmp_path, "streamed")
    stop = threading.Event()
    # no periodic discovery: only the column change the stream carries can start the new snapshot
    capture = Capture(settings, stop=stop, tuning=Tuning(discover_seconds=3600))
    running = threading.Thread(target=capture.run)
    running.start()
    try:
        execute(reference_db, "INSERT INTO streamed VALUES (21, 'streamed')")
        wait_for(
            lambda: 21 in {row["id"] for row in replay(tmp_path, "cdc.public.streamed").values()},
            what="the insert before the column",
        )
        execute(
            reference_db,
            "ALTER TABLE streamed ADD COLUMN status text NOT NULL DEFAULT gen_random_uuid()::text",
            "UPDATE streamed SET v = 'after' WHERE id = 1",
        )
        wait_for(
            lambda: replay(tmp_path, "cdc.public.streamed") == source_table(reference_db, "streamed"),
            what="every row with the added column",
        )
    finally:
        stop.set()
        running.join(60)
    assert capture.stats.tables_added == 1


def test_a_column_added_to_a_partitioned_root_reaches_the_rows_of_every_partition(reference_db: str, tmp_path: Path) -> None:
    execute(
        reference_db,
        "CREATE TABLE parted (id int PRIMARY KEY, v text) PARTITION BY RANGE (id)",
        "CREATE TABLE parted_1 PARTITION OF parted FOR VALUES FROM (0) TO (100)",
        "CREATE TABLE parted_2 PARTITION OF parted FOR VALUES FROM (100) TO (200)",
        "INSERT INTO parted SELECT g, 'v' || g FROM generate_series(1, 199, 7) g",
        "ALTER PUBLICATION cdc_publication ADD TABLE parted",
    )
    settings = settings_for(reference_db, tmp_path, tables="public.parted")
    Capture(settings, once=True).run()
    assert replay(tmp_path, "cdc.public.parted") == source_table(reference_db, "parted")
    execute(reference_db, "ALTER TABLE parted ADD COLUMN status text NOT NULL DEFAULT 'new'")
    assert Capture(settings, once=True).run().tables_added == 1
    assert replay(tmp_path, "cdc.public.parted") == source_table(reference_db, "parted")
    assert {row["status"] for row in replay(tmp_path, "cdc.public.parted").values()} == {"new"}
