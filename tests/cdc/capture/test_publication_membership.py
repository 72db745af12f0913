"""Rows that reach a published table without a change event of it: a table added back to the
publication after changes it did not publish, and a partition attached to (or detached from) a root
published via its root. Capture takes a new snapshot of the table, superseding what the log held."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc.capture.reads.scheduler import ReadScheduler
from cdc.config.settings import Settings
from cdc.run.coordinator import Capture
from tests.cdc.helpers import execute, replay, settings_for, source_table

pytestmark = pytest.mark.pg


def _captured_readings(url: str, data_dir: Path) -> Settings:
    """A table ``readings`` partitioned by range of ``id`` (partition 1: ids below 100, ten rows),
    added to the publication and captured once."""
    execute(
        url,
        "CREATE TABLE readings (id int PRIMARY KEY, v text) PARTITION BY RANGE (id)",
        "CREATE TABLE readings_1 PARTITION OF readings FOR VALUES FROM (0) TO (100)",
        "INSERT INTO readings SELECT g, 'a' || g FROM generate_series(1, 10) g",
        "ALTER PUBLICATION cdc_publication ADD TABLE readings",
    )
    settings = settings_for(url, data_dir)
    Capture(settings, once=True).run()
    return settings


def _attach(url: str, n: int) -> None:
    """Attach a partition ``readings_<n>`` holding ten rows with ids from ``100 * (n - 1)``."""
    low = 100 * (n - 1)
    execute(
        url,
        f"CREATE TABLE readings_{n} (id int PRIMARY KEY, v text)",
        f"INSERT INTO readings_{n} SELECT g, 'p' || g FROM generate_series({low}, {low + 9}) g",
        f"ALTER TABLE readings ATTACH PARTITION readings_{n} FOR VALUES FROM ({low}) TO ({low + 100})",
    )


def test_table_added_back_to_the_publication_is_snapshotted_again(reference_db: str, tmp_path: Path) -> None:
    execute(
        reference_db,
        "CREATE TABLE flaky (id int PRIMARY KEY, v text)",
        "INSERT INTO flaky SELECT g, 'v' || g FROM generate_series(1, 20) g",
        "ALTER PUBLICATION cdc_publication ADD TABLE flaky",
    )
    settings = settings_for(reference_db, tmp_path)
    Capture(settings, once=True).run()
    assert replay(tmp_path, "cdc.public.flaky") == source_table(reference_db, "flaky")
    # changes while the table is out of the publication are never sent by the server
    execute(
        reference_db,
        "ALTER PUBLICATION cdc_publication DROP TABLE flaky",
        "UPDATE flaky SET v = 'changed' WHERE id <= 5",
        "DELETE FROM flaky WHERE id > 15",
        "INSERT INTO flaky VALUES (100, 'new')",
        "ALTER PUBLICATION cdc_publication ADD TABLE flaky",
        "UPDATE flaky SET v = 'after' WHERE id = 6",
    )
    Capture(settings, once=True).run()
    assert replay(tmp_path, "cdc.public.flaky") == source_table(reference_db, "flaky")
    # and once snapshotted again, it is not snapshotted on every start
    assert Capture(settings, once=True).run().tables_added == 0


def test_attached_and_detached_partitions_rows_follow_the_root(reference_db: str, tmp_path: Path) -> None:
    settings = _captured_readings(reference_db, tmp_path)
    assert replay(tmp_path, "cdc.public.readings") == source_table(reference_db, "readings")
    _attach(reference_db, 2)
    Capture(settings, once=True).run()
    assert len(source_table(reference_db, "readings")) == 20
    assert replay(tmp_path, "cdc.public.readings") == source_table(reference_db, "readings")
    execute(reference_db, "ALTER TABLE readings DETACH PARTITION readings_1")
    Capture(settings, once=True).run()
    assert len(source_table(reference_db, "readings")) == 10
    assert replay(tmp_path, "cdc.public.readings") == source_table(reference_db, "readings")


def test_partition_attached_while_a_table_snapshot_waits_is_not_lost(
    reference_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ledger records the membership the snapshot saw, not one read while it waited for its boundary."""
    settings = _captured_readings(reference_db, tmp_path)
    _attach(reference_db, 2)
    write = ReadScheduler.start_read
    fired: list[bool] = []

    def attach_while_waiting(self: ReadScheduler, pending: object) -> None:
        if not fired:
            fired.append(True)
            # the snapshot (taken at discovery) waits for the stream; meanwhile a partition is attached
            # and the next periodic discovery runs
            _attach(reference_db, 3)
            self.discover()
        write(self, pending)  # type: ignore[arg-type]

    monkeypatch.setattr(ReadScheduler, "start_read", attach_while_waiting)
    Capture(settings, once=True).run()
    monkeypatch.setattr(ReadScheduler, "start_read", write)
    assert fired
    Capture(settings, once=True).run()
    assert len(source_table(reference_db, "readings")) == 30
    assert replay(tmp_path, "cdc.public.readings") == source_table(reference_db, "readings")


def test_membership_names_the_publication_entry_of_a_leaf_published_without_its_root(reference_db: str) -> None:
    """A publication without publish_via_partition_root publishes the leaves; removing and adding back
    their root changes each leaf's membership."""
    from cdc.capture.catalog import Catalog

    execute(
        reference_db,
        "CREATE TABLE parts (id int PRIMARY KEY) PARTITION BY RANGE (id)",
        "CREATE TABLE parts_1 PARTITION OF parts FOR VALUES FROM (0) TO (10)",
        "CREATE TABLE plain (id int PRIMARY KEY)",
        "CREATE PUBLICATION leaves FOR TABLE parts, plain",
    )
    catalog = Catalog(reference_db)
    try:
        before = {t.qualified: t.membership for t in catalog.published_tables("leaves")}
        assert set(before) == {"public.parts_1", "public.plain"} and all(not m.startswith("0:") for m in before.values())
        execute(reference_db, "ALTER PUBLICATION leaves DROP TABLE parts", "ALTER PUBLICATION leaves ADD TABLE parts")
        after = {t.qualified: t.membership for t in catalog.published_tables("leaves")}
        assert after["public.parts_1"] != before["public.parts_1"] and after["public.plain"] == before["public.plain"]
    finally:
        catalog.close()


def test_membership_names_the_schema_entry_of_a_partition_living_in_another_schema(reference_db: str) -> None:
    """``TABLES IN SCHEMA`` of a partitioned root's schema publishes its partitions in other schemas too;
    removing that schema and adding it back changes their membership like the root's schema tables'."""
    from cdc.capture.catalog import Catalog

    catalog = Catalog(reference_db)
    try:
        if catalog._server_version() < 150000:
            pytest.skip("TABLES IN SCHEMA needs PostgreSQL 15")
        execute(
            reference_db,
            "CREATE SCHEMA home",
            "CREATE SCHEMA away",
            "CREATE TABLE home.logs (id int PRIMARY KEY) PARTITION BY RANGE (id)",
            "CREATE TABLE away.logs_1 PARTITION OF home.logs FOR VALUES FROM (0) TO (10)",
            "CREATE PUBLICATION by_schema FOR TABLES IN SCHEMA home",
        )
        before = {t.qualified: t.membership for t in catalog.published_tables("by_schema")}
        assert set(before) == {"away.logs_1"} and not before["away.logs_1"].startswith("0:"), before
        execute(
            reference_db,
            "ALTER PUBLICATION by_schema DROP TABLES IN SCHEMA home",
            "ALTER PUBLICATION by_schema ADD TABLES IN SCHEMA home",
        )
        after = {t.qualified: t.membership for t in catalog.published_tables("by_schema")}
        assert after["away.logs_1"] != before["away.logs_1"], (before, after)
    finally:
        catalog.close()


def test_catalog_queries_are_not_compiled(reference_db: str) -> None:
    """The publication query's estimates (partition-tree functions) would otherwise have it JIT-compiled
    on every discovery: half a second of server CPU for a query of milliseconds."""
    from cdc.capture.catalog import Catalog

    catalog = Catalog(reference_db)
    try:
        assert catalog._execute("SHOW jit", ()) == [("off",)]
        assert catalog.published_tables("cdc_publication")
    finally:
        catalog.close()
