"""A first capture that does not complete its snapshot drops the slot it created; a slot the log continues stays."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdc.capture.group_writer import GroupWriter
from cdc.capture.snapshot import SnapshotReader
from cdc.coordinator import Capture
from log_store import ProducerColumns
from tests.cdc.helpers import events, execute, settings_for, slot_names

pytestmark = pytest.mark.pg


def _disk_full(*args: object, **kwargs: object) -> Iterator[ProducerColumns]:
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_failed_first_snapshot_drops_the_slot_it_created(
    reference_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    execute(reference_db, "INSERT INTO categories (name) SELECT 'c' || g FROM generate_series(1, 50) g")
    settings = settings_for(reference_db, tmp_path)
    with monkeypatch.context() as patch:
        # the snapshot fails after its slot exists, as when the log's disk fills up
        patch.setattr(SnapshotReader, "column_chunks", _disk_full)
        with pytest.raises(OSError, match="No space left"):
            Capture(settings, once=True).run()
    assert slot_names(reference_db) == [], "the failed snapshot's slot would hold WAL for nobody"

    stopped = Capture(settings, once=True)
    read = SnapshotReader.column_chunks

    def stop_while_reading(self: SnapshotReader, *args: Any, **kwargs: Any) -> Iterator[ProducerColumns]:
        for block in read(self, *args, **kwargs):
            stopped.stop.set()  # asked to stop (SIGTERM) while the snapshot reads the first table
            yield block

    with monkeypatch.context() as patch:
        patch.setattr(SnapshotReader, "column_chunks", stop_while_reading)
        assert stopped.run().snapshot_rows == 0
    assert slot_names(reference_db) == [], "an interrupted snapshot's slot is never used again"
    assert Capture(settings, once=True).run().snapshot_rows == 50
    assert slot_names(reference_db) == ["cdc_slot"]


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
    from cdc.source_checks import ensure_slot

    assert ensure_slot(settings_for(reference_db, tmp_path)) is True
    with pytest.raises(Exception, match="public.nosuch"):
        Capture(settings, once=True).run()
    assert slot_names(reference_db) == ["cdc_slot"]
