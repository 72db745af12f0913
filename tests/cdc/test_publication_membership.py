"""Rows that reach a published table without a change event of it: a table added back to the
publication after changes it did not publish, and a partition attached to (or detached from) a root
published via its root. Capture takes a new snapshot of the table, superseding what the log held."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc.coordinator import Capture
from tests.cdc.helpers import execute, replay, settings_for, source_table

pytestmark = pytest.mark.pg


def test_table_added_back_to_the_publication_is_snapshotted_again(reference_db: str, tmp_path: Path) -> None:
    execute(reference_db, "CREATE TABLE flaky (id int PRIMARY KEY, v text)",
          "INSERT INTO flaky SELECT g, 'v' || g FROM generate_series(1, 20) g",
          "ALTER PUBLICATION cdc_publication ADD TABLE flaky")
    settings = settings_for(reference_db, tmp_path)
    Capture(settings, once=True).run()
    assert replay(tmp_path, "cdc.public.flaky") == source_table(reference_db, "flaky")
    # changes while the table is out of the publication are never sent by the server
    execute(reference_db, "ALTER PUBLICATION cdc_publication DROP TABLE flaky",
          "UPDATE flaky SET v = 'changed' WHERE id <= 5", "DELETE FROM flaky WHERE id > 15",
          "INSERT INTO flaky VALUES (100, 'new')",
          "ALTER PUBLICATION cdc_publication ADD TABLE flaky",
          "UPDATE flaky SET v = 'after' WHERE id = 6")
    Capture(settings, once=True).run()
    assert replay(tmp_path, "cdc.public.flaky") == source_table(reference_db, "flaky")
    # and once snapshotted again, it is not snapshotted on every start
    assert Capture(settings, once=True).run().tables_added == 0


def test_attached_and_detached_partitions_rows_follow_the_root(reference_db: str, tmp_path: Path) -> None:
    execute(reference_db,
          "CREATE TABLE readings (id int PRIMARY KEY, v text) PARTITION BY RANGE (id)",
          "CREATE TABLE readings_1 PARTITION OF readings FOR VALUES FROM (0) TO (100)",
          "INSERT INTO readings SELECT g, 'a' || g FROM generate_series(1, 10) g",
          "ALTER PUBLICATION cdc_publication ADD TABLE readings")
    settings = settings_for(reference_db, tmp_path)
    Capture(settings, once=True).run()
    assert replay(tmp_path, "cdc.public.readings") == source_table(reference_db, "readings")
    execute(reference_db, "CREATE TABLE readings_2 (id int PRIMARY KEY, v text)",
          "INSERT INTO readings_2 SELECT g, 'b' || g FROM generate_series(100, 109) g",
          "ALTER TABLE readings ATTACH PARTITION readings_2 FOR VALUES FROM (100) TO (200)")
    Capture(settings, once=True).run()
    assert len(source_table(reference_db, "readings")) == 20
    assert replay(tmp_path, "cdc.public.readings") == source_table(reference_db, "readings")
    execute(reference_db, "ALTER TABLE readings DETACH PARTITION readings_1")
    Capture(settings, once=True).run()
    assert len(source_table(reference_db, "readings")) == 10
    assert replay(tmp_path, "cdc.public.readings") == source_table(reference_db, "readings")
