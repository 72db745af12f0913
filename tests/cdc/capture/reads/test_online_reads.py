"""A table read again while capture streams: the stream never waits, and the table's log stays exact.

Real PostgreSQL, real capture (in a thread), real log. A writer changes the table being read (updates of
keys anywhere in it, deletes, key changes, inserts, updates that leave a TOAST value unchanged) and
another table, from before the read starts until after it ended.
"""

from __future__ import annotations

import random
import re
import subprocess
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import cast

import jsonschema
import orjson
import psycopg
import pytest

from cdc.capture.catalog import Catalog
from cdc.capture.lsn import Lsn
from cdc.capture.table_snapshots import PendingSnapshot, take_snapshot
from cdc.capture.tables import TableShape
from cdc.commands.snapshot_cmd import request_snapshot
from cdc.config.settings import Settings
from cdc.observe.lag import measure
from cdc.observe.lag_report import JSON_SCHEMA
from cdc.observe.read_status import read_status
from cdc.run.coordinator import Capture
from event_format import is_truncate_key
from log_store import Record
from log_store.errors import LogNotFoundError
from log_store.watermark import PUBLISHED_NAME, read_published
from tests.cdc.helpers import execute, first_reads, read_topic, replay, run_cdc, settings_for, source_table, wait_for
from tests.faults.harness import CdcProcess, cdc_env

pytestmark = pytest.mark.pg

ROWS = 200_000
CHUNK = 4_000
#: every TOASTED-th row holds a document stored out of line (TOAST), which updates of other columns leave out
TOASTED = 500
BIG = "cdc.public.big"
BUSY = "cdc.public.busy"


#: a table read by block ranges (its key is text: no progress record per chunk), made by :func:`words_table`
WORDS = "cdc.public.words"


def words_table(url: str, rows: int) -> None:
    """``words (k text PRIMARY KEY, v int)`` with ``rows`` rows (``'w<n>'``, ``n``), published."""
    execute(
        url,
        "CREATE TABLE words (k text PRIMARY KEY, v int NOT NULL)",
        f"INSERT INTO words SELECT 'w' || g, g FROM generate_series(1, {rows}) g",
        "ALTER PUBLICATION cdc_publication ADD TABLE words",
    )


def _tables(url: str, rows: int = ROWS) -> None:
    execute(
        url,
        "CREATE TABLE big (id int PRIMARY KEY, v int NOT NULL, doc text)",
        "CREATE TABLE busy (id int PRIMARY KEY, n int NOT NULL)",
        f"INSERT INTO big SELECT g, 0, CASE WHEN g % {TOASTED} = 0 THEN "
        "(SELECT string_agg(md5(s::text || g::text), '') FROM generate_series(1, 200) s) "
        f"ELSE 'd' || g END FROM generate_series(1, {rows}) g",
        "INSERT INTO busy SELECT g, 0 FROM generate_series(1, 50) g",
        "ALTER PUBLICATION cdc_publication ADD TABLE big, busy",
    )


class _Writer(threading.Thread):
    """Small transactions on both tables until stopped; each touches ``busy``, most touch ``big``."""

    def __init__(self, url: str, seed: int) -> None:
        super().__init__(name="writer", daemon=True)
        self.url, self.random, self.stop, self.transactions = url, random.Random(seed), threading.Event(), 0
        self.error: BaseException | None = None
        self.longest_pause = 0.0  # seconds between two commits, at most

    def run(self) -> None:
        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                last = time.monotonic()
                while not self.stop.is_set():
                    with conn.transaction():
                        self._change(conn)
                    self.transactions += 1
                    now = time.monotonic()
                    self.longest_pause, last = max(self.longest_pause, now - last), now
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def _change(self, conn: psycopg.Connection) -> None:
        pick = self.random
        conn.execute("UPDATE busy SET n = n + 1 WHERE id = %s", (pick.randint(1, 50),))
        small = pick.randint(1, ROWS // TOASTED - 1) * TOASTED + pick.randint(1, TOASTED - 1)  # not toasted
        toasted = pick.randint(1, ROWS // TOASTED) * TOASTED
        match pick.randrange(6):
            case 0:  # anywhere in the table: inside, before or after the chunk being read
                conn.execute("UPDATE big SET v = v + 1, doc = doc || 'x' WHERE id = %s", (small,))
            case 1:  # the document is left out of the update (unchanged TOAST)
                conn.execute("UPDATE big SET v = v + 1 WHERE id = %s", (toasted,))
            case 2:
                conn.execute("DELETE FROM big WHERE id = %s", (small,))
            case 3:  # a key change (of a row whose values all travel with the update)
                conn.execute("UPDATE big SET id = id + 10000000 WHERE id = %s", (small,))
            case 4:  # a new row with a toasted document, then an update leaving it out
                new = 5_000_000 + self.transactions
                conn.execute(
                    "INSERT INTO big SELECT %s, 0, string_agg(md5(random()::text), '') FROM generate_series(1, 200)",
                    (new,),
                )
                conn.execute("UPDATE big SET v = 1 WHERE id = %s", (new,))
            case _:
                conn.execute("UPDATE busy SET n = n + 1 WHERE id = %s", (pick.randint(1, 50),))


def _ends(data_dir: Path) -> tuple[int, int]:
    """Records of ``big`` and of ``busy`` below the published watermark."""
    published = data_dir / "log" / PUBLISHED_NAME
    watermark = read_published(published) if published.exists() else None
    if watermark is None:
        return 0, 0
    totals = {BIG: 0, BUSY: 0}
    for tp, end in watermark.end_offsets.items():
        if tp.topic in totals:
            totals[tp.topic] += end
    return totals[BIG], totals[BUSY]


def assert_per_key_order(records: list[Record]) -> None:
    """In each partition, in offset order: a key's events never go back in (lsn, sequence), and an update
    leaving values out (partial row) always has a full row of its key before it."""
    by_partition: dict[int, list[Record]] = {}
    for record in records:
        by_partition.setdefault(record.partition, []).append(record)
    for partition, stored in by_partition.items():
        last: dict[bytes, tuple[int, int]] = {}
        whole: set[bytes] = set()
        for record in sorted(stored, key=lambda r: r.offset):
            if record.key is None or record.value is None:
                continue
            value = orjson.loads(record.value)
            position = (value["source"]["lsn"], value["source"]["sequence"])
            if is_truncate_key(record.key):
                whole.clear()
                continue
            where = f"partition {partition} offset {record.offset}, key {record.key!r}"
            assert position >= last.get(record.key, (0, 0)), f"{where}: {position} after {last[record.key]}"
            last[record.key] = position
            if value["op"] == "d":
                whole.discard(record.key)
            elif record.header("unchanged") is not None:
                assert record.key in whole, f"{where}: a partial row with no full row before it"
            else:
                whole.add(record.key)


def _started(settings: Settings) -> tuple[Capture, Callable[[], None]]:
    """Capture streaming in a thread of this process, and the call that stops it and waits for its end."""
    stop = threading.Event()
    capture = Capture(settings, stop=stop)
    running = threading.Thread(target=capture.run)
    running.start()

    def stop_capture() -> None:
        stop.set()
        running.join(60)

    return capture, stop_capture


def test_a_table_read_again_while_both_tables_change_keeps_the_stream_going_and_the_log_exact(
    reference_db: str, tmp_path: Path
) -> None:
    _tables(reference_db)
    settings = settings_for(reference_db, tmp_path, tables="public.big,public.busy", snapshot_chunk_rows=CHUNK)
    capture, stop_capture = _started(settings)
    writer = _Writer(reference_db, seed=40)
    samples: list[tuple[int, int]] = []
    try:
        wait_for(lambda: _ends(tmp_path)[0] >= ROWS, what="the initial snapshot")
        writer.start()
        wait_for(lambda: writer.transactions > 50, what="the writer")
        before = _ends(tmp_path)
        # the existing rows gain a value no change event carries (a volatile default): capture reads the table again
        execute(reference_db, "ALTER TABLE big ADD COLUMN flag int DEFAULT (7 + random() * 0)::int")

        def read_done() -> bool:
            samples.append(_ends(tmp_path))
            return capture.stats.snapshot_rows >= 2 * ROWS - ROWS // 10

        wait_for(read_done, what="the read of big")
        wait_for(lambda: writer.transactions > 50 + len(samples) // 10, what="more writes after the read")
        _stop_writing_and_drain(writer, reference_db, tmp_path)
    finally:
        writer.stop.set()
        stop_capture()
    assert capture.stats.tables_added == 1 and capture.stats.reads_abandoned == 0
    assert capture.stats.held_changes > 0, "no change of big was held during its read"
    assert {row["flag"] for row in replay(tmp_path, BIG).values()} >= {7}
    assert_per_key_order(read_topic(tmp_path, BIG))
    # the other table's changes reached the log while big's rows were only partly there
    during = [busy for big_end, busy in samples if before[0] + CHUNK <= big_end < before[0] + ROWS - CHUNK]
    assert len(set(during)) >= 2, f"busy did not move during the read: {samples}"


def _stop_writing_and_drain(writer: _Writer, url: str, data_dir: Path) -> None:
    """Stop the writer (failing on its error) and wait until the log replays to both source tables."""
    writer.stop.set()
    writer.join(30)
    assert writer.error is None, writer.error
    wait_for(
        lambda: replay(data_dir, BIG) == source_table(url, "big") and replay(data_dir, BUSY) == source_table(url, "busy"),
        what="the log to replay to the source",
    )


def _progress(data_dir: Path) -> int | None:
    """Rows of big's read under way as the ledger's progress record holds them (``None``: no read under way)."""
    rows = None
    try:
        ledger = read_topic(data_dir, "cdc.__snapshots")
    except LogNotFoundError:  # capture has not made the log yet
        return None
    for record in ledger:
        if record.key == b'["read","public.big"]':
            rows = None if record.value is None else int(orjson.loads(record.value)["rows"])
    return rows


@pytest.mark.parametrize("seed", [1, 2])
def test_a_read_killed_mid_way_resumes_past_its_last_durable_chunk(reference_db: str, tmp_path: Path, seed: int) -> None:
    """``kill -9`` of capture once during the first read of big (a new log's) and twice during a read of
    it again (at seeded moments), while both tables change: each new run goes on past the last chunk the
    log holds (no key is read twice, no tombstone but a delete's), and the log still replays to exactly
    the source, in per-key order."""
    rows = 60_000
    _tables(reference_db, rows)
    env = cdc_env(reference_db, tmp_path, tables="public.big,public.busy", snapshot_chunk_rows="500")
    pick = random.Random(seed)
    writer = _Writer(reference_db, seed=seed)
    writer.start()  # the tables change during the first read too
    capture = CdcProcess(env, ["capture"], tmp_path / "capture-first.err")
    killed_at: list[int] = []
    try:
        target = pick.randint(rows // 10, rows // 2)
        wait_for(lambda: (_progress(tmp_path) or 0) >= target, what=f"{target} rows of the first read")
        assert capture.kill9(), capture.stderr()
        first_killed_at = _progress(tmp_path) or 0
        capture = CdcProcess(env, ["capture"], tmp_path / "capture-0.err")
        wait_for(lambda: _progress(tmp_path) is None and _ends(tmp_path)[0] >= rows, what="the end of the first read")
        execute(reference_db, "ALTER TABLE big ADD COLUMN flag int DEFAULT (7 + random() * 0)::int")
        done = 0
        for attempt in range(1, 3):
            target = done + pick.randint(rows // 10, rows // 3)
            wait_for(lambda: (_progress(tmp_path) or 0) >= target, what=f"{target} rows read")  # noqa: B023
            assert capture.kill9(), capture.stderr()
            done = _progress(tmp_path) or 0
            killed_at.append(done)
            capture = CdcProcess(env, ["capture"], tmp_path / f"capture-{attempt}.err")
        wait_for(lambda: _progress(tmp_path) is None, what="the end of the read")
        _stop_writing_and_drain(writer, reference_db, tmp_path)
        assert capture.terminate() == 0, capture.stderr()
    finally:
        writer.stop.set()
        if capture.running():
            capture.kill9()
    records = read_topic(tmp_path, BIG)
    assert_per_key_order(records)
    # both reads of big: rows as of each run's boundary, no key twice, markers only where the second began
    first: list[bytes] = []
    reads: dict[int, set[bytes]] = {}
    markers: set[int] = set()
    deleted: set[bytes] = set()
    for record in records:
        value = orjson.loads(record.value) if record.value is not None else None
        if value is None:
            assert is_truncate_key(cast(bytes, record.key)) or record.key in deleted, (
                f"a tombstone of {record.key!r} but no delete"
            )
        elif value["op"] == "d":
            deleted.add(cast(bytes, record.key))
        elif value["op"] == "t":
            markers.add(value["source"]["lsn"])
        elif value["op"] == "r" and "flag" in value["after"]:
            reads.setdefault(value["source"]["lsn"], set()).add(cast(bytes, record.key))
        elif value["op"] == "r":
            first.append(cast(bytes, record.key))
    # each process went on past the last key the one before it wrote, never reading a key twice
    assert len(first) == len(set(first)), "a key was read again by the first read: a run started over"
    assert 0 < first_killed_at < len(first), (first_killed_at, len(first))
    keys = [key for boundary in sorted(reads) for key in reads[boundary]]
    assert len(keys) == len(set(keys)), "a key was read again: a run started over"
    assert 0 < killed_at[0] < killed_at[1] <= len(keys), (killed_at, len(keys))
    assert markers == {min(reads)}, "a resumed read wrote truncate markers"


def _by_id(table: dict[bytes | None, dict[str, object]]) -> dict[object, dict[str, object]]:
    return {row["id"]: row for row in table.values()}


def test_two_tables_are_read_at_once_each_with_its_own_progress(reference_db: str, tmp_path: Path) -> None:
    """Both tables gain a column with a default in one transaction: one snapshot, two reads whose chunks
    (and progress records) alternate in the log, up to ``CDC_SNAPSHOT_CONCURRENCY`` at a time."""
    rows = 20_000
    _tables(reference_db, rows)
    execute(
        reference_db,
        "CREATE TABLE big2 (id int, part int, v text, PRIMARY KEY (part, id))",
        f"INSERT INTO big2 SELECT g, g % 7, 'w' || g FROM generate_series(1, {rows}) g",
        "ALTER PUBLICATION cdc_publication ADD TABLE big2",
    )
    settings = settings_for(
        reference_db, tmp_path, tables="public.big,public.big2,public.busy", snapshot_chunk_rows=1000, snapshot_concurrency=2
    )
    capture, stop_capture = _started(settings)
    try:
        wait_for(lambda: capture.stats.snapshot_rows >= 2 * rows + 50, what="the first reads")
        first_reads = len(read_topic(tmp_path, "cdc.__snapshots"))
        with psycopg.connect(reference_db, autocommit=True) as conn, conn.transaction():
            conn.execute("ALTER TABLE big ADD COLUMN flag int DEFAULT (7 + random() * 0)::int")
            conn.execute("ALTER TABLE big2 ADD COLUMN flag int DEFAULT (8 + random() * 0)::int")
        execute(reference_db, "UPDATE big SET v = 1 WHERE id = 1", "UPDATE big2 SET v = 'x' WHERE id = 2")
        wait_for(
            lambda: (
                replay(tmp_path, BIG) == source_table(reference_db, "big")
                and _by_id(replay(tmp_path, "cdc.public.big2")) == _by_id(source_table(reference_db, "big2"))
            ),
            what="both tables read again",
        )
    finally:
        stop_capture()
    progress = [
        (orjson.loads(record.key)[1], orjson.loads(record.value)["rows"] if record.value else None)
        for record in read_topic(tmp_path, "cdc.__snapshots")[first_reads:]
        if record.key is not None and record.key.startswith(b'["read"')
    ]
    tables = [name for name, _ in progress]
    assert sorted(set(tables)) == ["public.big", "public.big2"]
    # alternating: the second table's progress began before the first one's ended
    first_end = min(tables.index(name) + tables.count(name) - 1 for name in set(tables))
    assert all(name in tables[: first_end + 1] for name in set(tables)), tables
    for name in set(tables):
        counts = [rows_done for table, rows_done in progress if table == name]
        # a record per chunk with the rows so far, but the last chunk's: its group ends the read
        assert counts[-1] is None and counts[:-1] == list(range(1000, rows, 1000)), counts


def test_cdc_snapshot_asks_the_running_capture_to_read_a_table_again(reference_db: str, tmp_path: Path) -> None:
    """The request travels as a logical message; capture reads the table again beside the stream (``op=r``
    rows as of a new point), ``cdc lag`` (and ``cdc snapshot --status``) shows the read under way, and a
    table capture does not read is refused with one clear error."""
    rows = 40_000
    _tables(reference_db, rows)
    first_reads(reference_db, tmp_path, tables="public.big,public.busy")  # in chunks of the default size
    settings = settings_for(reference_db, tmp_path, tables="public.big,public.busy", snapshot_chunk_rows=200)
    capture, stop_capture = _started(settings)
    seen: list[dict[str, object]] = []
    try:
        wait_for(lambda: _ends(tmp_path)[0] >= rows, what="the initial snapshot")
        refused = run_cdc(reference_db, tmp_path, "snapshot", "public.nope", tables="public.big,public.busy")
        assert refused.returncode == 2 and "public.nope is not a table capture reads" in refused.stderr, refused.stderr
        asked = run_cdc(reference_db, tmp_path, "snapshot", "public.big", tables="public.big,public.busy")
        assert asked.returncode == 0, asked.stderr

        def status_seen() -> bool:
            report = measure(settings)  # cdc lag
            if report.reads:
                jsonschema.validate(orjson.loads(orjson.dumps(report.to_dict())), JSON_SCHEMA)
            seen.extend(report.reads)
            return bool(seen)

        wait_for(status_seen, what="the read in cdc snapshot --status")
        wait_for(lambda: capture.stats.snapshot_rows >= rows, what="the read of big")
    finally:
        stop_capture()
    assert capture.stats.reads_requested == 1
    assert seen[0]["table"] == "public.big" and 0 < int(cast(int, seen[0]["rows"])) < rows
    assert read_status(settings) == []
    assert replay(tmp_path, BIG) == source_table(reference_db, "big")
    boundaries = {
        orjson.loads(record.value)["source"]["lsn"]
        for record in read_topic(tmp_path, BIG)
        if record.value is not None and orjson.loads(record.value)["op"] == "r"
    }
    assert len(boundaries) >= 2, "the table was not read again"


def _half_read(capture: Capture, rows: int) -> bool:
    """Whether a read under way has written some rows of big but not half of them."""
    reads = [read for read in capture.reads if not read.abandoned]
    return bool(reads) and 0 < reads[0].rows < rows // 2


def test_a_read_starts_over_when_a_key_change_needs_a_row_it_has_not_written(reference_db: str, tmp_path: Path) -> None:
    """During a read, an update changing a key and leaving a TOAST value unchanged (its value comes from the
    old key's row, which the log may not hold yet) starts the read over from a new snapshot; the log still
    replays to exactly the source with no partial row before a full one, and the moved row keeps its value."""
    rows = 40_000
    _tables(reference_db, rows)
    first_reads(reference_db, tmp_path, tables="public.big,public.busy")  # in chunks of the default size
    settings = settings_for(reference_db, tmp_path, tables="public.big,public.busy", snapshot_chunk_rows=200)
    capture, stop_capture = _started(settings)
    try:
        wait_for(lambda: _ends(tmp_path)[0] >= rows, what="the initial snapshot")
        execute(
            reference_db,
            "ALTER TABLE big ADD COLUMN flag int DEFAULT (7 + random() * 0)::int",
            "UPDATE big SET v = 1 WHERE id = 1",
        )
        wait_for(lambda: _half_read(capture, rows), what="the read under way")
        execute(reference_db, f"UPDATE big SET id = 90000000 WHERE id = {rows - TOASTED}")  # the document stays out of line
        wait_for(lambda: capture.stats.reads_abandoned >= 1, what="the read to start over")
        wait_for(
            lambda: not capture.reads and replay(tmp_path, BIG) == source_table(reference_db, "big"),
            what="the log to replay to the source",
        )
    finally:
        stop_capture()
    assert capture.stats.reads_abandoned == 1
    assert_per_key_order(read_topic(tmp_path, BIG))
    moved = replay(tmp_path, BIG)[b'{"id":90000000}']
    assert len(str(moved["doc"])) == 6400 and moved["flag"] == 7


def _ddl_seconds(url: str, statement: str) -> float:
    """Run ``statement`` with a 5 s ``lock_timeout`` (it fails when a read keeps its lock longer); its time."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET lock_timeout = '5s'")
        started = time.monotonic()
        conn.execute(statement)
        return time.monotonic() - started


def test_ddl_on_a_table_being_read_waits_about_one_chunk_and_the_read_goes_on(reference_db: str, tmp_path: Path) -> None:
    """A read of big gives way when DDL waits for its lock: ``ADD COLUMN`` and a rewriting ``ALTER COLUMN ...
    TYPE`` (each with a 5 s ``lock_timeout``) run within moments while the read is far from done, the
    writer of both tables never stalls for long, and the log replays to exactly the source, in per-key order."""
    rows = 150_000  # in chunks of 100, a read of several seconds
    _tables(reference_db, rows)
    first_reads(reference_db, tmp_path, tables="public.big,public.busy")  # in chunks of the default size
    settings = settings_for(reference_db, tmp_path, tables="public.big,public.busy", snapshot_chunk_rows=100)

    def early() -> bool:  # the read under way, most of it still to come
        return _half_read(capture, rows // 5)

    capture, stop_capture = _started(settings)
    writer = _Writer(reference_db, seed=7)
    ddl: list[float] = []
    try:
        wait_for(lambda: _ends(tmp_path)[0] >= rows, what="the initial snapshot")
        writer.start()
        request_snapshot(settings, ("public.big",))
        wait_for(early, what="the read under way")
        ddl.append(_ddl_seconds(reference_db, "ALTER TABLE big ADD COLUMN extra int"))
        assert _progress(tmp_path) is not None, "the read ended before the DDL: no wait to avoid"
        wait_for(early, what="the read under way again")
        ddl.append(_ddl_seconds(reference_db, "ALTER TABLE big ALTER COLUMN v TYPE bigint"))  # rewrites the table
        wait_for(lambda: _progress(tmp_path) is None and not capture.reads, timeout=120, what="the end of the read")
        _stop_writing_and_drain(writer, reference_db, tmp_path)
    finally:
        writer.stop.set()
        stop_capture()
    assert max(ddl) < 2.0, ddl
    assert capture.stats.reads_yielded >= 2, capture.stats
    assert writer.longest_pause < 2.0, writer.longest_pause
    assert_per_key_order(read_topic(tmp_path, BIG))
    assert {row["extra"] for row in replay(tmp_path, BIG).values()} == {None}


def test_a_read_goes_on_past_its_last_durable_key_after_capture_reconnects(reference_db: str, tmp_path: Path) -> None:
    """The replication connection and the read's sessions are terminated during a read of big while both
    tables change: capture reconnects in process and the read goes on past its last durable key from a
    new snapshot (no key read twice, no markers of the second run), and the log replays to the source."""
    rows = 60_000
    _tables(reference_db, rows)
    first_reads(reference_db, tmp_path, tables="public.big,public.busy")  # in chunks of the default size
    settings = settings_for(reference_db, tmp_path, tables="public.big,public.busy", snapshot_chunk_rows=200)
    capture, stop_capture = _started(settings)
    writer = _Writer(reference_db, seed=11)
    try:
        wait_for(lambda: _ends(tmp_path)[0] >= rows, what="the initial snapshot")
        writer.start()
        request_snapshot(settings, ("public.big",))
        wait_for(lambda: (_progress(tmp_path) or 0) >= rows // 10, what="the read under way")
        pids = [pid for read in capture.reads for pid in read.pending.reader.pids]
        execute(
            reference_db,
            f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = ANY(ARRAY{pids}::int[]) "
            f"OR pid = (SELECT active_pid FROM pg_replication_slots WHERE slot_name = '{settings.slot}')",
        )
        wait_for(
            lambda: capture.stats.reconnects >= 1 and _progress(tmp_path) is None and not capture.reads,
            timeout=120,
            what="the read to end",
        )
        _stop_writing_and_drain(writer, reference_db, tmp_path)
    finally:
        writer.stop.set()
        stop_capture()
    # a read that went on counts as resumed, renewed or not: at least the run after the reconnect
    assert capture.stats.reads_resumed >= 1 and capture.stats.reads_abandoned == 0, capture.stats
    records = read_topic(tmp_path, BIG)
    assert_per_key_order(records)
    reads: dict[int, list[bytes]] = {}
    markers: set[int] = set()
    for record in records:
        value = orjson.loads(record.value) if record.value is not None else None
        if value is not None and value["op"] == "t":
            markers.add(value["source"]["lsn"])
        elif value is not None and value["op"] == "r":
            reads.setdefault(value["source"]["lsn"], []).append(cast(bytes, record.key))
    again = [boundary for boundary in sorted(reads) if boundary >= min(markers)]  # the first read's runs before
    assert len(again) >= 2, f"a boundary per run of the read: {sorted(reads)}"
    keys = [key for boundary in again for key in reads[boundary]]
    assert len(keys) == len(set(keys)), "a key was read again: the read started over"
    assert markers == {again[0]}, "the resumed run wrote truncate markers"


def test_a_read_does_not_begin_in_a_snapshot_its_table_was_rewritten_or_reshaped_since(reference_db: str) -> None:
    """``SnapshotReader.hold``: a table rewritten (``ALTER COLUMN ... TYPE``), truncated or given a column
    after the snapshot is not read in it (the rewritten table would look empty to it), nor one whose lock
    another session holds; otherwise the lock is held until the snapshot ends, and DDL then waits for it."""
    execute(reference_db, "CREATE TABLE t (id int PRIMARY KEY, v int)", "INSERT INTO t SELECT g, g FROM generate_series(1, 10) g")
    with psycopg.connect(reference_db) as conn:
        relid = int(cast(int, cast(tuple[int], conn.execute("SELECT 't'::regclass::oid::int8").fetchone())[0]))
    catalog = Catalog(reference_db)
    shape = TableShape(relid, "public", "t", "cdc.public.t", ())
    now = partial(catalog.relation_state, relid)

    def snapshot() -> PendingSnapshot:
        pending = take_snapshot(reference_db, [], Lsn(0))
        assert pending is not None
        return pending

    def hold_after(*statements: str) -> str | None:
        pending = snapshot()
        try:
            execute(reference_db, *statements)
            return pending.reader.hold(shape, now, 200)
        finally:
            pending.close()

    try:
        assert hold_after("UPDATE t SET v = v + 1") is None
        assert hold_after("ALTER TABLE t ALTER COLUMN v TYPE bigint") == "its columns or storage changed since the snapshot"
        assert hold_after("TRUNCATE t") is not None
        assert hold_after("ALTER TABLE t ADD COLUMN w int DEFAULT 3") is not None
        pending = snapshot()
        try:
            with psycopg.connect(reference_db) as locker:
                locker.execute("LOCK TABLE t IN ACCESS EXCLUSIVE MODE")
                assert pending.reader.hold(shape, now, 200) == "another session holds or waits for a lock on it"
            assert pending.reader.hold(shape, now, 200) is None  # the snapshot outlived the failed attempt
            with pytest.raises(psycopg.errors.LockNotAvailable):
                execute(reference_db, "SET lock_timeout = '300ms'", "ALTER TABLE t ADD COLUMN x int")
        finally:
            pending.close()
    finally:
        catalog.close()


def test_cdc_snapshot_cancel_stops_a_read_and_leaves_the_table_out_until_asked_again(reference_db: str, tmp_path: Path) -> None:
    """``cdc snapshot --cancel`` during a read of big: the read stops (no progress record, ``--status`` lists
    nothing, the holding file is gone), big's later changes are not written (its log lacks rows the read
    did not reach) while busy's still are, a restart keeps big left out, and ``cdc snapshot`` reads it
    whole again: then the log replays to exactly the source."""
    rows = 150_000  # in chunks of 100, a read of several seconds: the command arrives while it is under way
    _tables(reference_db, rows)
    settings = settings_for(reference_db, tmp_path, tables="public.big,public.busy", snapshot_chunk_rows=100)
    # the reads the test does not act on (the first and the last of big) in the default chunks: far fewer
    whole = settings_for(reference_db, tmp_path, tables="public.big,public.busy")
    env = {"tables": "public.big,public.busy"}

    def run(until: Callable[[Capture], bool], what: str, using: Settings = settings) -> Capture:
        capture, stop_capture = _started(using)
        try:
            wait_for(lambda: until(capture), what=what)
        finally:
            stop_capture()
        return capture

    def cancelled(capture: Capture) -> bool:
        wait_for(lambda: _ends(tmp_path)[0] >= rows, what="the initial snapshot")
        request_snapshot(settings, ("public.big",))
        wait_for(lambda: (_progress(tmp_path) or 0) > 0, what="the read under way")
        asked = run_cdc(reference_db, tmp_path, "snapshot", "--cancel", "public.big", **env)
        assert asked.returncode == 0, asked.stderr
        wait_for(lambda: capture.stats.reads_cancelled == 1 or capture.stats.snapshot_rows >= 2 * rows, what="the cancellation")
        assert capture.stats.reads_cancelled == 1 and not capture.reads, "the read ended before the cancellation came"
        assert _progress(tmp_path) is None and read_status(settings) == []
        assert not list((tmp_path / "held").glob("*.held"))
        return True

    def left_out(capture: Capture) -> bool:
        big_end = _ends(tmp_path)[0]
        execute(reference_db, "UPDATE big SET v = v + 1 WHERE id % 100 = 1", "UPDATE busy SET n = n + 1")
        wait_for(lambda: replay(tmp_path, BUSY) == source_table(reference_db, "busy"), what="busy's change")
        assert _ends(tmp_path)[0] == big_end, "a change of a cancelled table was written"
        return True

    run(lambda c: _ends(tmp_path)[0] >= rows and _progress(tmp_path) is None and not c.reads, "the initial snapshot", whole)
    run(lambda c: cancelled(c) and left_out(c), "the read to cancel")
    restarted = run(left_out, "busy's change after a restart")
    assert restarted.stats.tables_added == 0, "a cancelled table was read again without being asked"
    lag = measure(settings)  # cdc lag says the table is left out, and how to bring it back
    assert lag.log.cancelled == ["public.big"]
    assert [w for w in lag.warnings if "cancelled" in w] == [
        "public.big: its read was cancelled (cdc snapshot --cancel); capture leaves it out and its views lack "
        "changes until `cdc snapshot public.big` reads it whole again"
    ]
    assert run_cdc(reference_db, tmp_path, "snapshot", "public.big", **env).returncode == 0
    run(lambda c: replay(tmp_path, BIG) == source_table(reference_db, "big"), "big read again whole", whole)
    assert_per_key_order(read_topic(tmp_path, BIG))
    assert measure(settings).log.cancelled == []


def test_who_may_ask_capture_to_read_is_who_may_execute_pg_logical_emit_message(reference_db: str, tmp_path: Path) -> None:
    """PostgreSQL grants ``pg_logical_emit_message`` to every role: any role that can connect may ask (as
    docs/commands.md warns). Revoked from ``PUBLIC`` and granted to an operator role, a role without the
    grant gets one error naming the grant (exit 3), and the operator role, with nothing else, may ask."""
    _tables(reference_db, 10)
    for role in ("snapshot_asker", "snapshot_operator"):
        exists = f"SELECT FROM pg_roles WHERE rolname = '{role}'"
        execute(reference_db, f"DO $$ BEGIN IF NOT EXISTS ({exists}) THEN CREATE ROLE {role} LOGIN; END IF; END $$")

    def ask(role: str) -> subprocess.CompletedProcess[str]:
        return run_cdc(reference_db.replace("postgres@", f"{role}@", 1), tmp_path, "snapshot", "public.big")

    assert ask("snapshot_asker").returncode == 0
    execute(
        reference_db,
        "REVOKE EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, bytea) FROM PUBLIC",
        "REVOKE EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text) FROM PUBLIC",
        "GRANT EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, bytea) TO snapshot_operator",
    )
    refused = ask("snapshot_asker")
    assert refused.returncode == 3, refused.stderr
    (error,) = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert "may not send requests to capture: run GRANT EXECUTE ON FUNCTION pg_logical_emit_message" in error
    allowed = ask("snapshot_operator")
    assert allowed.returncode == 0, allowed.stderr


def test_the_progress_of_a_read_whose_table_left_the_capture_is_not_listed_for_ever(reference_db: str, tmp_path: Path) -> None:
    """Capture is killed during a read of big, and ``CDC_TABLES`` leaves big out: the next run ends the read
    (its holding file goes, its progress record gets a tombstone), so ``cdc snapshot --status`` lists nothing."""
    rows = 40_000
    _tables(reference_db, rows)
    first_reads(reference_db, tmp_path, tables="public.big,public.busy")  # in chunks of the default size
    settings = settings_for(reference_db, tmp_path, tables="public.big,public.busy", snapshot_chunk_rows=100)
    env = cdc_env(reference_db, tmp_path, tables="public.big,public.busy", snapshot_chunk_rows="100")
    capture = CdcProcess(env, ["capture"], tmp_path / "capture-0.err")
    try:
        wait_for(lambda: _ends(tmp_path)[0] >= rows, what="the initial snapshot")
        request_snapshot(settings, ("public.big",))
        wait_for(lambda: (_progress(tmp_path) or 0) > 0, what="the read under way")
        assert capture.kill9(), capture.stderr()
        assert [read["table"] for read in read_status(settings)] == ["public.big"]
        execute(reference_db, "UPDATE busy SET n = n + 1")
        env = cdc_env(reference_db, tmp_path, tables="public.busy", snapshot_chunk_rows="100")  # big is left out
        capture = CdcProcess(env, ["capture"], tmp_path / "capture-1.err")
        wait_for(lambda: replay(tmp_path, BUSY) == source_table(reference_db, "busy"), what="busy's change")
        wait_for(lambda: read_status(settings) == [], what="the read's progress to go")
        assert not list((tmp_path / "held").glob("*.held"))
        assert capture.terminate() == 0, capture.stderr()
    finally:
        if capture.running():
            capture.kill9()


def test_a_key_change_keeping_a_toasted_value_while_a_read_waits_to_resume_starts_it_over(
    reference_db: str, tmp_path: Path
) -> None:
    """Capture is killed during a read of big; before the next run resumes it, a row read already (key at
    most the last durable one) moves to another such key leaving its document unchanged. Its value is the
    old key's, which a resumed read's held records could not carry: the read starts over, and the log
    replays to exactly the source with no partial row before a full one."""
    rows = 40_000
    _tables(reference_db, rows)
    first_reads(reference_db, tmp_path, tables="public.big,public.busy")  # in chunks of the default size
    settings = settings_for(reference_db, tmp_path, tables="public.big,public.busy", snapshot_chunk_rows=100)
    env = cdc_env(reference_db, tmp_path, tables="public.big,public.busy", snapshot_chunk_rows="100")
    capture = CdcProcess(env, ["capture"], tmp_path / "capture-0.err")
    try:
        wait_for(lambda: _ends(tmp_path)[0] >= rows, what="the initial snapshot")
        execute(reference_db, "DELETE FROM big WHERE id = 7")
        request_snapshot(settings, ("public.big",))
        wait_for(lambda: (_progress(tmp_path) or 0) > TOASTED, what="the read past a toasted row")
        assert capture.kill9(), capture.stderr()
        execute(reference_db, f"UPDATE big SET id = 7 WHERE id = {TOASTED}")  # the document stays out of line
        capture = CdcProcess(env, ["capture"], tmp_path / "capture-1.err")
        wait_for(
            lambda: _progress(tmp_path) is None and replay(tmp_path, BIG) == source_table(reference_db, "big"),
            what="the log to replay to the source",
        )
        assert capture.terminate() == 0, capture.stderr()
    finally:
        if capture.running():
            capture.kill9()
    assert_per_key_order(read_topic(tmp_path, BIG))
    assert len(str(replay(tmp_path, BIG)[b'{"id":7}']["doc"])) == 6400


def test_a_read_asked_for_survives_a_kill_before_it_ends_also_one_by_block_ranges(reference_db: str, tmp_path: Path) -> None:
    """``cdc snapshot`` of a table read by block ranges (a text key: no progress records), then ``kill -9``
    of capture while its rows are half written (its truncate markers already hide the old ones): the
    ledger's note of the request makes the next run read the table whole again, so the log replays to
    exactly the source; once the read ended the note is gone and a restart reads nothing."""
    rows = 150_000
    words_table(reference_db, rows)
    topic = WORDS
    first_reads(reference_db, tmp_path, tables="public.words")  # in chunks of the default size
    env = cdc_env(reference_db, tmp_path, tables="public.words", snapshot_chunk_rows="100")
    settings = settings_for(reference_db, tmp_path, tables="public.words")

    def written() -> int:
        published = tmp_path / "log" / PUBLISHED_NAME
        watermark = read_published(published) if published.exists() else None
        return sum(end for tp, end in watermark.end_offsets.items() if tp.topic == topic) if watermark else 0

    capture = CdcProcess(env, ["capture"], tmp_path / "capture-0.err")
    try:
        wait_for(lambda: written() >= rows, what="the initial snapshot")
        before = written()
        request_snapshot(settings, ("public.words",))
        wait_for(lambda: written() >= before + rows // 10, what="the read under way")
        assert capture.kill9(), capture.stderr()
        assert written() < before + rows, "the read ended before the kill"
        capture = CdcProcess(env, ["capture"], tmp_path / "capture-1.err")
        source = source_table(reference_db, "words", key="k")
        wait_for(lambda: replay(tmp_path, topic) == source, what="the table read again whole")
        assert capture.terminate() == 0, capture.stderr()
    finally:
        if capture.running():
            capture.kill9()
    asked = [r for r in read_topic(tmp_path, "cdc.__snapshots") if r.key == b'["asked","public.words",null]']
    assert [r.value is None for r in asked] == [False, True], "the request's note and its tombstone"
    restarted, stop_capture = _started(settings)
    try:
        end = written()
        execute(reference_db, "UPDATE words SET v = -1 WHERE k = 'w1'")
        wait_for(lambda: written() > end, what="capture to stream the update")
    finally:
        stop_capture()
    assert restarted.stats.tables_added == 0 and restarted.stats.snapshot_rows == 0


def test_a_slot_that_skipped_changes_has_every_table_read_again_beside_the_stream(reference_db: str, tmp_path: Path) -> None:
    """A read of big is under way, holding an update of a row it already read, when capture is killed;
    the slot is then dropped and made again (``cdc setup``): the changes in between never reach the log,
    so the next run reads every table again. That read is newer than anything the earlier one held: the
    earlier read is over (its progress tombstoned, its holding file gone). The new reads run beside the
    stream in chunks, as ``cdc snapshot`` reads, one table at a time here, and are asked for in the log's
    move past the gap: killed during big's, the next run finds no gap but goes on past big's last durable
    chunk and then reads busy (changed in the gap too), and the log replays to the source."""
    rows = 60_000
    _tables(reference_db, rows)
    env = cdc_env(reference_db, tmp_path, tables="public.big,public.busy", snapshot_chunk_rows="500", snapshot_concurrency="1")
    settings = settings_for(reference_db, tmp_path, tables="public.big,public.busy")
    capture = CdcProcess(env, ["capture"], tmp_path / "capture-0.err")
    try:
        wait_for(lambda: _ends(tmp_path)[0] >= rows, what="the initial snapshot")
        request_snapshot(settings, ("public.big",))
        wait_for(lambda: (_progress(tmp_path) or 0) >= 5_000, what="the read under way")
        execute(reference_db, "UPDATE big SET v = 111 WHERE id = 1")  # a row the read already wrote
        wait_for(lambda: any(p.stat().st_size > 0 for p in (tmp_path / "held").glob("*.held")), what="the update held")
        assert capture.kill9(), capture.stderr()
        earlier = _read_state(tmp_path)
        assert earlier is not None, "the read ended before the kill"
        execute(
            reference_db,
            "UPDATE big SET v = 222 WHERE id = 1",
            "UPDATE busy SET n = 5 WHERE id = 1",
            "SELECT pg_drop_replication_slot('cdc_slot')",
        )
        assert run_cdc(reference_db, tmp_path, "setup", tables="public.big,public.busy").returncode == 0
        capture = CdcProcess(env, ["capture"], tmp_path / "capture-1.err")
        wait_for(
            lambda: (state := _read_state(tmp_path)) is not None and state[0] > earlier[0] and 0 < state[1] < rows - 5_000,
            what="the read again after the gap, part-way",
        )
        assert capture.kill9(), capture.stderr()
        capture = CdcProcess(env, ["capture"], tmp_path / "capture-2.err")
        wait_for(
            lambda: (
                replay(tmp_path, BIG) == source_table(reference_db, "big")
                and replay(tmp_path, "cdc.public.busy") == source_table(reference_db, "busy")
            ),
            what="the log to replay to the source",
        )
        assert _progress(tmp_path) is None and not list((tmp_path / "held").glob("*.held"))
        assert capture.terminate() == 0, capture.stderr()
    finally:
        if capture.running():
            capture.kill9()
    assert "every captured table is read again, superseding the log's rows" in (tmp_path / "capture-1.err").read_text()
    resumed = (tmp_path / "capture-2.err").read_text()
    assert "read again, superseding" not in resumed, "the move past the gap was not durable"
    went_on = re.search(rf"resuming the read of {BIG} after (\d+) rows", resumed)
    assert went_on is not None and 0 < int(went_on[1]) < rows, resumed
    ledger = {r.key: r.value for r in read_topic(tmp_path, "cdc.__snapshots") if r.key is not None and b'"asked"' in r.key}
    assert ledger and all(value is None for value in ledger.values()), f"a read asked for never ended: {ledger}"


def _read_state(data_dir: Path) -> tuple[int, int] | None:
    """``(boundary, rows)`` of big's read under way, as the ledger's progress record holds them."""
    state = None
    for record in read_topic(data_dir, "cdc.__snapshots"):
        if record.key == b'["read","public.big"]':
            state = (
                None
                if record.value is None
                else (int(orjson.loads(record.value)["boundary"]), int(orjson.loads(record.value)["rows"]))
            )
    return state


def test_a_keyless_table_read_while_written_is_not_started_over(reference_db: str, tmp_path: Path) -> None:
    """The changes held during a keyless table's read have a null key, as a truncate marker may have: they
    do not start the read over (which would never end while the table is written), and the log ends with
    every row once."""
    rows = 6_000
    execute(
        reference_db,
        "CREATE TABLE ledger (tid int, delta int)",
        "ALTER TABLE ledger REPLICA IDENTITY FULL",
        f"INSERT INTO ledger SELECT g, g FROM generate_series(1, {rows}) g",
        "ALTER PUBLICATION cdc_publication ADD TABLE ledger",
    )
    settings = settings_for(reference_db, tmp_path, tables="public.ledger", snapshot_chunk_rows=200)
    capture, stop_capture = _started(settings)
    written = [0]
    stop_writing = threading.Event()

    def write() -> None:
        with psycopg.connect(reference_db, autocommit=True) as conn:
            while not stop_writing.is_set():
                written[0] += 1
                conn.execute("INSERT INTO ledger VALUES (%s, 0)", (rows + written[0],))

    writer = threading.Thread(target=write, daemon=True)
    try:
        writer.start()
        wait_for(lambda: capture.stats.snapshot_rows >= rows and not capture.reads, what="the read of ledger")
        stop_writing.set()
        writer.join(30)
        assert not writer.is_alive()
        with psycopg.connect(reference_db) as conn:
            end = Lsn.parse(str(conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]))  # type: ignore[index]
        wait_for(lambda: capture.confirmed >= end, what="capture to catch up with the writer")
    finally:
        stop_writing.set()
        stop_capture()
    assert capture.stats.reads_abandoned == 0 and written[0] > 20, (capture.stats, written)
    events = [orjson.loads(r.value) for r in read_topic(tmp_path, "cdc.public.ledger") if r.value is not None]
    tids = [event["after"]["tid"] for event in events if event["op"] != "t"]
    assert sorted(tids) == list(range(1, rows + written[0] + 1))
