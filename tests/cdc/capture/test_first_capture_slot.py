"""The slot a log continues from stays when capture fails: also a new log's, whose tables are read part-way."""

from __future__ import annotations

import errno
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cdc.capture.group_writer import GroupWriter
from cdc.capture.snapshot import SnapshotReader
from cdc.run.coordinator import Capture
from log_store import ProducerColumns
from tests.cdc.helpers import events, execute, settings_for, slot_names

pytestmark = pytest.mark.pg


def _disk_full(*args: object, **kwargs: object) -> Iterator[ProducerColumns]:
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_first_capture_that_fails_or_stops_part_way_keeps_its_slot_and_the_next_run_goes_on(
    reference_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    execute(reference_db, "INSERT INTO categories (name) SELECT 'c' || g FROM generate_series(1, 250) g")
    settings = settings_for(reference_db, tmp_path, snapshot_chunk_rows=100)  # three chunks
    with monkeypatch.context() as patch:
        # the first read fails after the log began at the slot, as when the log's disk fills up
        patch.setattr(SnapshotReader, "keyset_chunks", _disk_full)
        patch.setattr(SnapshotReader, "column_chunks", _disk_full)
        with pytest.raises(OSError, match="No space left"):
            Capture(settings, once=True).run()
    assert slot_names(reference_db) == ["cdc_slot"], "the log continues from the slot: it must stay"

    stopped = Capture(settings, once=True)
    read = SnapshotReader.keyset_chunks

    def stop_while_reading(self: SnapshotReader, *args: Any, **kwargs: Any) -> Iterator[Any]:
        for chunk in read(self, *args, **kwargs):
            stopped.stop.set()  # asked to stop (SIGTERM) while the first table is read
            yield chunk

    with monkeypatch.context() as patch:
        patch.setattr(SnapshotReader, "keyset_chunks", stop_while_reading)
        assert stopped.run().snapshot_rows == 0
    execute(reference_db, "INSERT INTO categories (name) VALUES ('later')")
    assert Capture(settings, once=True).run().snapshot_rows == 251
    assert slot_names(reference_db) == ["cdc_slot"]
    names = [e["after"]["name"] for e in events(tmp_path, "cdc.public.categories")]  # type: ignore[index]
    assert sorted(names) == sorted([f"c{g}" for g in range(1, 251)] + ["later"])


def test_a_failed_capture_keeps_the_slot_the_log_continues_from(
    reference_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = settings_for(reference_db, tmp_path)
    Capture(settings, once=True).run()
    execute(reference_db, "INSERT INTO categories (name) VALUES ('kept')")
    with monkeypatch.context() as patch:
        patch.setattr(GroupWriter, "append", _disk_full)  # the first streamed group cannot be written
        with pytest.raises(OSError, match="No space left"):
            Capture(settings, once=True).run()
    assert slot_names(reference_db) == ["cdc_slot"]
    Capture(settings, once=True).run()
    assert [e["after"]["name"] for e in events(tmp_path, "cdc.public.categories")] == ["kept"]  # type: ignore[index]


def test_a_slot_made_by_setup_is_kept_when_capture_fails_before_its_snapshot(reference_db: str, tmp_path: Path) -> None:
    settings = settings_for(reference_db, tmp_path, tables="public.nosuch")
    from cdc.setup.source_objects import ensure_slot

    assert ensure_slot(settings_for(reference_db, tmp_path)) is True
    with pytest.raises(Exception, match="public.nosuch"):
        Capture(settings, once=True).run()
    assert slot_names(reference_db) == ["cdc_slot"]


def test_a_first_capture_after_setup_waits_for_no_open_transaction(reference_db: str, tmp_path: Path) -> None:
    """A session holds a transaction with an ID open while the first capture runs: capture begins the log
    where the slot ``cdc setup`` made is and reads every table, with no slot to make (which would wait)."""
    from cdc.setup.source_objects import ensure_slot

    settings = settings_for(reference_db, tmp_path)
    assert ensure_slot(settings) is True
    execute(reference_db, "INSERT INTO categories (name) SELECT 'c' || g FROM generate_series(1, 20) g")
    capture = Capture(settings, once=True)
    running = threading.Thread(target=capture.run)
    with psycopg.connect(reference_db) as held:  # not autocommit: the transaction stays open
        held.execute("SELECT pg_current_xact_id()")
        running.start()
        running.join(60)
        waited = running.is_alive()
    running.join(60)
    assert not waited, "the first capture waited for the open transaction"
    assert capture.stats.snapshot_rows == 20
    assert len(events(tmp_path, "cdc.public.categories")) == 20
