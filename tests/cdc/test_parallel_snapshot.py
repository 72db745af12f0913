"""Every session of a parallel snapshot reads the slot's exported snapshot, never a later state."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from cdc import snapshot
from cdc.coordinator import Capture, Tuning
from tests.cdc.helpers import replay, settings_for, source_table

pytestmark = pytest.mark.pg


def test_changes_after_the_export_are_streamed_not_read(reference_db: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    with psycopg.connect(reference_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE spread (id int PRIMARY KEY, v text)")
        conn.execute("ALTER PUBLICATION cdc_publication ADD TABLE spread")
        conn.execute("INSERT INTO spread SELECT g, 'v' || g FROM generate_series(1, 3000) g")
        conn.execute("ANALYZE spread")
    original = snapshot.SnapshotReader.__init__
    sessions: list[int] = []

    def open_then_write(self: snapshot.SnapshotReader, url: str, name: str, connections: int = 2) -> None:
        original(self, url, name, connections)
        sessions.append(1 + len(self._helpers))
        # committed after the snapshot was exported and imported: the stream carries these, no read may
        with psycopg.connect(reference_db, autocommit=True) as writer:
            writer.execute("UPDATE spread SET v = v || '+' WHERE id % 7 = 0")
            writer.execute("DELETE FROM spread WHERE id % 11 = 0")
            writer.execute("INSERT INTO spread SELECT g, 'late' FROM generate_series(3001, 3100) g")

    monkeypatch.setattr(snapshot.SnapshotReader, "__init__", open_then_write)
    settings = settings_for(reference_db, tmp_path, tables="public.spread")
    stats = Capture(settings, once=True, tuning=Tuning(snapshot_chunk_rows=100)).run()
    assert sessions == [2], "the snapshot is read by two sessions"
    assert stats.snapshot_rows == 3000
    # applied in (lsn, sequence) order: every key read once, then changed only as the stream says
    assert replay(tmp_path, "cdc.public.spread") == source_table(reference_db, "spread")
