"""A lost replication slot: by default a clear stop; with ``CDC_RECREATE_LOST_SLOT`` capture makes it again
and reads every table again beside the stream, exactly, saying so in one warning line.

Real PostgreSQL (the slot invalidated by ``max_slot_wal_keep_size``, and a slot dropped under a running
capture), real ``cdc capture`` processes, the real log.
"""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest

from tests.cdc.helpers import execute, replay, run_cdc, source_table, wait_for
from tests.faults.harness import CdcProcess, cdc_env

pytestmark = pytest.mark.pg

TABLES = "public.items,public.notes"


def test_a_lost_slot_stops_capture_unless_it_may_be_made_again(reference_db: str, tmp_path: Path) -> None:
    """The slot is invalidated while capture is stopped and rows change: capture stops with one line that
    names the setting; with ``CDC_RECREATE_LOST_SLOT`` it makes the slot again, warns once naming what it
    reads again, and the log replays to the source. Then the slot is dropped under the running capture:
    it makes it again by itself, and the changes after it reach the log."""
    execute(
        reference_db,
        "CREATE TABLE items (id int PRIMARY KEY, v int NOT NULL)",
        "CREATE TABLE notes (id int PRIMARY KEY, note text NOT NULL)",
        "INSERT INTO items SELECT g, 0 FROM generate_series(1, 2000) g",
        "INSERT INTO notes SELECT g, 'n' || g FROM generate_series(1, 20) g",
        "ALTER PUBLICATION cdc_publication ADD TABLE items, notes",
    )
    assert run_cdc(reference_db, tmp_path, "capture", "--once", tables=TABLES).returncode == 0
    execute(reference_db, "UPDATE items SET v = 1 WHERE id <= 10", "DELETE FROM items WHERE id = 2000", "DELETE FROM notes")
    _invalidate_slot(reference_db)

    stopped = run_cdc(reference_db, tmp_path, "capture", "--once", tables=TABLES)
    errors = [line for line in stopped.stderr.splitlines() if line.startswith("error:")]
    assert stopped.returncode != 0 and len(errors) == 1, stopped.stderr
    assert "invalidated" in errors[0] and "CDC_RECREATE_LOST_SLOT" in errors[0], errors[0]

    recovered = run_cdc(reference_db, tmp_path, "capture", "--once", tables=TABLES, recreate_lost_slot="true")
    assert recovered.returncode == 0, recovered.stderr
    warnings = [line for line in recovered.stderr.splitlines() if "level=warning" in line]
    assert len(warnings) == 1, recovered.stderr
    assert "was invalidated" in warnings[0] and "public.items, public.notes" in warnings[0], warnings[0]
    _assert_replays(reference_db, tmp_path)

    capture = CdcProcess(
        cdc_env(reference_db, tmp_path, tables=TABLES, recreate_lost_slot="true"), ["capture"], tmp_path / "c.err"
    )
    try:
        _drop_active_slot(reference_db)
        execute(reference_db, "UPDATE items SET v = 2 WHERE id <= 5", "INSERT INTO notes VALUES (1, 'again')")
        wait_for(lambda: _replays(reference_db, tmp_path), what="the log to replay to the source")
        assert capture.running(), capture.stderr()
        assert capture.terminate() == 0, capture.stderr()
    finally:
        if capture.running():
            capture.kill9()
    warnings = [line for line in capture.stderr().splitlines() if "level=warning" in line and "is made again" in line]
    assert len(warnings) == 1 and "is missing" in warnings[0], capture.stderr()


def _invalidate_slot(url: str) -> None:
    """Let the server remove WAL the idle slot needs (``max_slot_wal_keep_size`` of 1 MB for a moment):
    switches and checkpoints until its ``wal_status`` is ``lost``."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
        conn.execute("SELECT pg_reload_conf()")
        try:
            deadline = time.monotonic() + 60
            while conn.execute("SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'cdc_slot'").fetchone() != (
                "lost",
            ):
                assert time.monotonic() < deadline, "the slot was not invalidated"
                conn.execute("SELECT pg_logical_emit_message(false, 'filler', repeat('x', 100000))")
                conn.execute("SELECT pg_switch_wal()")
                conn.execute("CHECKPOINT")
        finally:
            conn.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
            conn.execute("SELECT pg_reload_conf()")


def _drop_active_slot(url: str) -> None:
    """Wait until capture streams from the slot, then end its session and drop the slot before it is back."""
    with psycopg.connect(url, autocommit=True) as conn:
        active = "SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'cdc_slot'"
        wait_for(lambda: (row := conn.execute(active).fetchone()) is not None and row[0] is not None, what="capture streaming")
        deadline = time.monotonic() + 30
        while True:
            conn.execute("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = 'cdc_slot'")
            try:
                conn.execute("SELECT pg_drop_replication_slot('cdc_slot')")
                return
            except psycopg.errors.ObjectInUse:
                assert time.monotonic() < deadline, "the slot stayed in use"


def _replays(url: str, data_dir: Path) -> bool:
    return replay(data_dir, "cdc.public.items", strict=False) == source_table(url, "items") and replay(
        data_dir, "cdc.public.notes", strict=False
    ) == source_table(url, "notes")


def _assert_replays(url: str, data_dir: Path) -> None:
    assert replay(data_dir, "cdc.public.items") == source_table(url, "items")
    assert replay(data_dir, "cdc.public.notes") == source_table(url, "notes")
