"""A slot that does not continue the log (recreated, or advanced by another client) never leaves a gap."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc.capture.lsn import Lsn
from cdc.capture.slot_continuity import gap_after, slot_confirmed
from cdc.run.coordinator import Capture
from cdc.setup.source_objects import ensure_slot
from log_store import LogStore
from tests.cdc.helpers import execute, replay, settings_for, source_table

pytestmark = pytest.mark.pg


def test_gap_rule() -> None:
    assert not gap_after(Lsn(0), Lsn(500))  # no complete snapshot yet: capture snapshots anyway
    assert not gap_after(Lsn(0x17F), None)
    assert not gap_after(Lsn(0x17F), Lsn(0x180))  # confirmed up to the end of the log's last commit record
    assert gap_after(Lsn(0x17F), Lsn(0x181))
    assert not gap_after(Lsn(0x180), Lsn(0x1A8))  # a commit LSN written by an earlier version: no gap told


def test_restart_continues_and_a_recreated_slot_has_every_table_read_again(reference_db: str, tmp_path: Path) -> None:
    execute(reference_db, "INSERT INTO categories (name) SELECT 'c' || g FROM generate_series(1, 50) g")
    settings = settings_for(reference_db, tmp_path)
    Capture(settings, once=True).run()
    execute(reference_db, "UPDATE categories SET name = name || '!' WHERE id <= 10")
    stats = Capture(settings, once=True).run()
    assert stats.snapshot_rows == 0 and stats.events >= 10  # an ordinary restart streams on
    with LogStore.open(tmp_path / "log") as log:
        watermark = log.latest_watermark()
        assert watermark is not None
        position = Lsn.from_hex16(watermark.position)
    assert position % 8 == 7  # one below a record boundary (cdc.capture.slot_continuity)
    assert not gap_after(position, slot_confirmed(reference_db, settings.slot))

    # the slot is lost; changes committed meanwhile never reach any slot
    execute(
        reference_db,
        f"SELECT pg_drop_replication_slot('{settings.slot}')",
        "DELETE FROM categories WHERE id > 40",
        "UPDATE categories SET name = 'while gone' WHERE id = 11",
        "INSERT INTO categories (name) VALUES ('added while gone')",
    )
    assert ensure_slot(settings) is True  # `cdc setup` creates a new slot at the current WAL position
    assert gap_after(position, slot_confirmed(reference_db, settings.slot))
    execute(reference_db, "UPDATE categories SET name = 'after setup' WHERE id = 12")
    stats = Capture(settings, once=True).run()
    assert stats.snapshot_rows == 41 and stats.resnapshots == 1  # every table read again, superseding the log's rows
    assert replay(tmp_path, "cdc.public.categories") == source_table(reference_db, "categories")
    assert Capture(settings, once=True).run().snapshot_rows == 0
