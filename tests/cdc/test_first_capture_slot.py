"""A first capture that does not complete its snapshot drops the slot it created; a slot the log continues stays."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdc.coordinator import Capture
from cdc.events import TxContext
from cdc.snapshot import SnapshotReader
from cdc.tables import TableShape
from log_store import ProducerColumns
from tests.cdc.helpers import events, execute, settings_for, slot_names

pytestmark = pytest.mark.pg


class _DiskFullDuringSnapshot(Capture):
    """A capture whose snapshot fails after its slot exists, as when the log's disk fills up."""

    def _read_blocks(
        self, reader: SnapshotReader, shape: TableShape, context: TxContext, tally: list[int]
    ) -> Iterator[ProducerColumns]:
        raise OSError(errno.ENOSPC, "No space left on device")


class _StoppedDuringSnapshot(Capture):
    """A capture asked to stop (SIGTERM) while its snapshot reads the first table."""

    def _read_blocks(
        self, reader: SnapshotReader, shape: TableShape, context: TxContext, tally: list[int]
    ) -> Iterator[ProducerColumns]:
        for block in super()._read_blocks(reader, shape, context, tally):
            self.stop.set()
            yield block


class _DiskFullWhileStreaming(Capture):
    """A capture whose first streamed group cannot be written."""

    def _flush(self, pending: list, repl: object) -> None:  # type: ignore[type-arg, override]
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_failed_first_snapshot_drops_the_slot_it_created(reference_db: str, tmp_path: Path) -> None:
    execute(reference_db, "INSERT INTO categories (name) SELECT 'c' || g FROM generate_series(1, 50) g")
    settings = settings_for(reference_db, tmp_path)
    with pytest.raises(OSError, match="No space left"):
        _DiskFullDuringSnapshot(settings, once=True).run()
    assert slot_names(reference_db) == [], "the failed snapshot's slot would hold WAL for nobody"
    _StoppedDuringSnapshot(settings, once=True).run()
    assert slot_names(reference_db) == [], "an interrupted snapshot's slot is never used again"
    assert Capture(settings, once=True).run().snapshot_rows == 50
    assert slot_names(reference_db) == ["cdc_slot"]


def test_a_failed_capture_keeps_the_slot_the_log_continues_from(reference_db: str, tmp_path: Path) -> None:
    settings = settings_for(reference_db, tmp_path)
    Capture(settings, once=True).run()
    execute(reference_db, "INSERT INTO categories (name) VALUES ('kept')")
    with pytest.raises(OSError, match="No space left"):
        _DiskFullWhileStreaming(settings, once=True).run()
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
