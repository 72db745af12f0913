"""A read beside the stream waits for no other transaction and holds the server's xmin horizon only briefly.

Real PostgreSQL, real capture (in a thread), real log: a transaction left open with an ID does not stop
a read from beginning, nor the other tables' changes from reaching the log; the snapshot a read holds
(what keeps VACUUM from removing dead rows) is renewed every ``read_snapshot_seconds``.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psycopg
import pytest

from cdc.run.coordinator import Capture
from cdc.run.tuning import Tuning
from tests.cdc.capture.reads.test_online_reads import BIG, BUSY, _ends, _started, _tables, assert_per_key_order
from tests.cdc.helpers import execute, first_reads, read_topic, replay, run_cdc, settings_for, source_table, wait_for

pytestmark = pytest.mark.pg


def test_a_transaction_left_open_delays_neither_a_read_nor_the_other_tables(reference_db: str, tmp_path: Path) -> None:
    """An idle-in-transaction session holding a transaction ID (PostgreSQL makes a new replication slot
    wait for such a transaction): ``cdc snapshot`` asks for a read, which ends while the transaction is
    still open, and a change of the other table reaches the log within a few seconds all along."""
    rows = 20_000
    _tables(reference_db, rows)
    execute(reference_db, "CREATE TABLE unrelated (id int)")
    settings = settings_for(reference_db, tmp_path, tables="public.big,public.busy")
    capture, stop_capture = _started(settings)
    delays: list[float] = []
    try:
        wait_for(lambda: _ends(tmp_path)[0] >= rows, what="the initial snapshot")
        with psycopg.connect(reference_db) as open_tx:
            open_tx.execute("INSERT INTO unrelated VALUES (1)")  # holds an ID until the session commits
            asked = run_cdc(reference_db, tmp_path, "snapshot", "public.big", tables="public.big,public.busy")
            assert asked.returncode == 0, asked.stderr
            for n in range(1, 6):
                execute(reference_db, f"UPDATE busy SET n = {n} WHERE id = 1")
                committed = time.monotonic()
                wait_for(lambda n=n: replay(tmp_path, BUSY)[b'{"id":1}']["n"] == n, timeout=20, what=f"busy n={n}")  # type: ignore[misc]
                delays.append(time.monotonic() - committed)
            wait_for(lambda: capture.stats.snapshot_rows >= 2 * rows, timeout=30, what="the read of big")
            still_open = open_tx.execute("SELECT pg_current_xact_id_if_assigned() IS NOT NULL").fetchone()
            assert still_open == (True,)
            open_tx.rollback()
    finally:
        stop_capture()
    assert max(delays) < 5.0, f"busy's changes waited for the open transaction: {delays}"
    assert capture.stats.reads_requested == 1
    assert replay(tmp_path, BIG) == source_table(reference_db, "big")


class _XminWatch(threading.Thread):
    """Samples, every 20 ms, how long the oldest transaction holding a snapshot (``backend_xmin``) in the
    database has been open, its own sessions aside."""

    def __init__(self, url: str) -> None:
        super().__init__(name="xmin-watch", daemon=True)
        self.url, self.stop, self.longest, self.samples = url, threading.Event(), 0.0, 0

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.stop.is_set():
                row = conn.execute(
                    "SELECT COALESCE(max(extract(epoch FROM clock_timestamp() - xact_start)), 0)::float8 "
                    "FROM pg_stat_activity WHERE datname = current_database() AND backend_xmin IS NOT NULL "
                    "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
                ).fetchone()
                self.longest = max(self.longest, float(row[0]) if row else 0.0)
                self.samples += 1
                time.sleep(0.02)


def test_a_long_read_holds_each_snapshot_a_moment_and_stays_exact(reference_db: str, tmp_path: Path) -> None:
    """A read of many small chunks while the table changes: no session of capture keeps a snapshot much
    longer than ``read_snapshot_seconds``, though the read lasts many times that; the log replays to the
    source, in per-key order."""
    rows = 60_000
    _tables(reference_db, rows)
    first_reads(reference_db, tmp_path, tables="public.big,public.busy")
    settings = settings_for(reference_db, tmp_path, tables="public.big,public.busy", snapshot_chunk_rows=100)
    stop = threading.Event()
    capture = Capture(settings, stop=stop, tuning=Tuning(read_snapshot_seconds=0.3))
    running = threading.Thread(target=capture.run)
    running.start()
    watch = _XminWatch(reference_db)
    try:
        wait_for(lambda: _ends(tmp_path)[0] >= rows, what="the initial snapshot")
        watch.start()
        began = time.monotonic()
        execute(reference_db, "ALTER TABLE big ADD COLUMN flag int DEFAULT (7 + random() * 0)::int")
        for n in range(1, 40):  # changes of big beside the read, far apart in the key
            execute(
                reference_db, f"UPDATE big SET v = {n} WHERE id IN ({n}, {rows - n})", f"DELETE FROM big WHERE id = {1000 + n}"
            )
        wait_for(lambda: capture.stats.snapshot_rows >= rows - 100, timeout=120, what="the read of big")
        lasted = time.monotonic() - began
    finally:
        watch.stop.set()
        stop.set()
        running.join(60)
    assert watch.samples > 20
    assert watch.longest < 0.3 + 1.5 < lasted, f"a snapshot was held {watch.longest:.2f} s of a {lasted:.2f} s read"
    assert capture.stats.snapshots_renewed >= 2, capture.stats
    assert replay(tmp_path, BIG) == source_table(reference_db, "big")
    assert_per_key_order(read_topic(tmp_path, BIG))


def test_a_truncate_between_two_runs_of_a_read_starts_it_over_and_the_log_stays_exact(reference_db: str, tmp_path: Path) -> None:
    """``TRUNCATE`` and new rows while a read goes from snapshot to snapshot, at most 4,000 rows a second:
    the rows read before it are not left beside those read after it; the read starts over and the log
    replays to the source."""
    rows = 12_000
    _tables(reference_db, rows)
    first_reads(reference_db, tmp_path, tables="public.big,public.busy")
    settings = settings_for(
        reference_db, tmp_path, tables="public.big,public.busy", snapshot_chunk_rows=100, snapshot_rows_per_second=4_000
    )
    stop = threading.Event()
    capture = Capture(settings, stop=stop, tuning=Tuning(read_snapshot_seconds=0.2))
    running = threading.Thread(target=capture.run)
    running.start()
    try:
        wait_for(lambda: _ends(tmp_path)[0] >= rows, what="the first read")
        renewed = capture.stats.snapshots_renewed  # (the first read's runs)
        execute(reference_db, "ALTER TABLE big ADD COLUMN flag int DEFAULT (7 + random() * 0)::int")
        wait_for(lambda: capture.stats.snapshots_renewed >= renewed + 2, what="a read in several runs")
        execute(reference_db, "TRUNCATE big", "INSERT INTO big (id, v, doc) SELECT g, 1, 'new' FROM generate_series(1, 500) g")
        wait_for(lambda: capture.stats.reads_abandoned >= 1, what="the read started over")
        wait_for(lambda: not capture.reads and not capture.core.waiting, timeout=120, what="the end of the read")
        wait_for(lambda: replay(tmp_path, BIG) == source_table(reference_db, "big"), what="the log to replay to the source")
    finally:
        stop.set()
        running.join(60)
    assert len(replay(tmp_path, BIG)) == 500
    assert capture.stats.reads_throttled > 0, "the read never waited for its rate ceiling"
