"""A column added with values for the rows already there (a default, a volatile default that rewrites the
table, an identity column) reaches those rows without a change event: capture reads the table again,
superseding what the log held. A column added without a default leaves them null and needs nothing."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from cdc.coordinator import Capture, Tuning
from cdc.settings import Settings
from tests.cdc.helpers import execute, replay, settings_for, source_table, wait_for

pytestmark = pytest.mark.pg


def _captured(url: str, data_dir: Path, table: str) -> Settings:
    execute(url, f"CREATE TABLE {table} (id int PRIMARY KEY, v text)",
            f"INSERT INTO {table} SELECT g, 'v' || g FROM generate_series(1, 20) g",
            f"ALTER PUBLICATION cdc_publication ADD TABLE {table}")
    settings = settings_for(url, data_dir, tables=f"public.{table}")
    Capture(settings, once=True).run()
    assert replay(data_dir, f"cdc.public.{table}") == source_table(url, table)
    return settings


@pytest.mark.parametrize(("column", "read_again"), [
    ("status text NOT NULL DEFAULT 'new'", True),
    ("n int DEFAULT (random() * 1000)::int", True),  # volatile: the table is rewritten
    ("seq int GENERATED ALWAYS AS IDENTITY", True),
    ("note text", False),
])
def test_existing_rows_of_an_added_column_reach_the_log(reference_db: str, tmp_path: Path, column: str,
                                                         read_again: bool) -> None:
    settings = _captured(reference_db, tmp_path, "widened")
    execute(reference_db, f"ALTER TABLE widened ADD COLUMN {column}",
            "UPDATE widened SET v = 'after' WHERE id = 1", "INSERT INTO widened (id, v) VALUES (21, 'new row')")
    stats = Capture(settings, once=True).run()
    assert stats.tables_added == (1 if read_again else 0)
    source = source_table(reference_db, "widened")
    # an event from before the column existed does not name it: a consumer reads that as null
    assert {key: {"note": None, **row} for key, row in replay(tmp_path, "cdc.public.widened").items()} == \
        {key: {"note": None, **row} for key, row in source.items()}
    # once read again, the table is not read on every start
    assert Capture(settings, once=True).run().tables_added == 0


def test_a_column_added_while_capture_streams_has_the_table_read_again(reference_db: str, tmp_path: Path) -> None:
    settings = _captured(reference_db, tmp_path, "streamed")
    stop = threading.Event()
    # no periodic discovery: only the column change the stream carries can start the new snapshot
    capture = Capture(settings, stop=stop, tuning=Tuning(discover_seconds=3600))
    running = threading.Thread(target=capture.run)
    running.start()
    try:
        execute(reference_db, "INSERT INTO streamed VALUES (21, 'streamed')")
        wait_for(lambda: 21 in {row["id"] for row in replay(tmp_path, "cdc.public.streamed").values()},
                 what="the insert before the column")
        execute(reference_db, "ALTER TABLE streamed ADD COLUMN status text NOT NULL DEFAULT 'new'",
                "UPDATE streamed SET v = 'after' WHERE id = 1")
        wait_for(lambda: replay(tmp_path, "cdc.public.streamed") == source_table(reference_db, "streamed"),
                 what="every row with the added column")
    finally:
        stop.set()
        running.join(60)
    assert capture.stats.tables_added == 1
