"""Parallel snapshot reads: every session reads the slot's exported snapshot, never a later state; chunks
are bounded by stored bytes; a read stopped or failed part way ends its threads and leaves no snapshot."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from cdc.capture import snapshot
from cdc.run.coordinator import Capture
from cdc.run.tuning import Tuning
from tests.cdc.helpers import replay, settings_for, snapshot_threads, source_table

pytestmark = pytest.mark.pg


def test_changes_after_the_export_are_streamed_not_read(
    reference_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
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


def test_long_rows_are_read_in_chunks_of_bounded_bytes(
    reference_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with psycopg.connect(reference_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE wide (id int PRIMARY KEY, body text)")
        conn.execute("ALTER PUBLICATION cdc_publication ADD TABLE wide")
        # 10 kB of hex per row, stored out of line (TOAST): the heap holds about a hundred rows per block
        conn.execute(
            "INSERT INTO wide SELECT g, (SELECT string_agg(md5(g::text || '.' || i), '') "
            "FROM generate_series(1, 320) i) FROM generate_series(1, 1000) g"
        )
        conn.execute("ANALYZE wide")
    monkeypatch.setattr(snapshot, "CHUNK_BYTES", 1 << 20)
    chunks = _watch_chunks(monkeypatch)
    settings = settings_for(reference_db, tmp_path, tables="public.wide")
    stats = Capture(settings, once=True).run()
    assert stats.snapshot_rows == 1000 and sum(chunks) == 1000
    # by rows alone (20,000 per chunk) the table is one chunk of 10 MB; by bytes, blocks of about 1 MB
    assert len(chunks) >= 4 and max(chunks) <= 300, chunks
    assert replay(tmp_path, "cdc.public.wide") == source_table(reference_db, "wide")


def _watch_chunks(monkeypatch: pytest.MonkeyPatch, on_chunk: Callable[[int], None] = lambda seen: None) -> list[int]:
    """The row counts of the chunks the snapshot converts from now on; ``on_chunk`` is called with how
    many were seen so far before each is converted."""
    chunks: list[int] = []
    original = snapshot.chunk_columns

    def watched(shape: object, row: list[object]) -> object:
        chunks.append(int(row[-1]))  # type: ignore[call-overload]
        on_chunk(len(chunks))
        return original(shape, row)  # type: ignore[arg-type]

    monkeypatch.setattr(snapshot, "chunk_columns", watched)
    return chunks


def _table_of_many_chunks(url: str, table: str, rows: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v text)").format(sql.Identifier(table)))
        conn.execute(sql.SQL("ALTER PUBLICATION cdc_publication ADD TABLE {}").format(sql.Identifier(table)))
        conn.execute(
            sql.SQL("INSERT INTO {} SELECT g, 'v' || g FROM generate_series(1, %s) g").format(sql.Identifier(table)), (rows,)
        )
        conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(table)))


def test_a_snapshot_stopped_after_a_few_chunks_ends_its_threads_and_the_next_run_reads_it_all(
    reference_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _table_of_many_chunks(reference_db, "stopped", 20_000)
    stop = threading.Event()

    def stop_after_five(seen: int) -> None:
        if seen == 5:
            stop.set()

    chunks = _watch_chunks(monkeypatch, stop_after_five)
    settings = settings_for(reference_db, tmp_path, tables="public.stopped")
    stats = Capture(settings, once=True, stop=stop, tuning=Tuning(snapshot_chunk_rows=100)).run()
    assert stats.snapshot_rows == 0 and 5 <= len(chunks) < 60, len(chunks)
    assert snapshot_threads() == []
    monkeypatch.undo()
    stats = Capture(settings, once=True, tuning=Tuning(snapshot_chunk_rows=100)).run()
    assert stats.snapshot_rows == 20_000
    assert replay(tmp_path, "cdc.public.stopped") == source_table(reference_db, "stopped")


def test_a_chunk_that_cannot_be_converted_fails_the_snapshot_with_its_error(
    reference_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _table_of_many_chunks(reference_db, "failing", 20_000)

    def fail_the_fourth(seen: int) -> None:
        if seen == 4:
            raise ValueError("chunk four cannot be converted")

    _watch_chunks(monkeypatch, fail_the_fourth)
    settings = settings_for(reference_db, tmp_path, tables="public.failing")
    with pytest.raises(ValueError, match="chunk four"):
        Capture(settings, once=True, tuning=Tuning(snapshot_chunk_rows=100)).run()
    assert snapshot_threads() == []
    monkeypatch.undo()
    stats = Capture(settings, once=True, tuning=Tuning(snapshot_chunk_rows=100)).run()
    assert stats.snapshot_rows == 20_000
    assert replay(tmp_path, "cdc.public.failing") == source_table(reference_db, "failing")


def test_a_table_is_read_in_key_ranges_by_every_session_at_once(
    reference_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``CDC_SNAPSHOT_SESSIONS=3``: each of the snapshot's three sessions fetches key ranges of the one table,
    at the same time as the others, and every row is read once."""
    _table_of_many_chunks(reference_db, "ranges", 20_000)
    fetches: list[tuple[int, float, float]] = []  # (session's server process, start, end)
    original = snapshot._fetched_row

    def timed(conn: psycopg.Connection[tuple[object, ...]], query: sql.Composed) -> object:
        start = time.monotonic()
        row = original(conn, query)
        fetches.append((conn.info.backend_pid, start, time.monotonic()))
        return row

    monkeypatch.setattr(snapshot, "_fetched_row", timed)
    settings = settings_for(reference_db, tmp_path, tables="public.ranges", snapshot_chunk_rows=1000, snapshot_sessions=3)
    assert Capture(settings, once=True).run().snapshot_rows == 20_000
    assert len({pid for pid, _, _ in fetches}) == 3, fetches
    at_once = [(a, b) for a in fetches for b in fetches if a[0] < b[0] and a[1] < b[2] and b[1] < a[2]]
    assert at_once, f"no two sessions fetched at the same time: {fetches}"
    assert replay(tmp_path, "cdc.public.ranges") == source_table(reference_db, "ranges")
