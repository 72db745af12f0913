"""``cdc snapshot TABLE --where``: the rows a condition selects read again beside the stream, and nothing else.

Real PostgreSQL, real capture (in a thread), real log, the real ``cdc`` command. The table has a column
the publication leaves out and a row filter; a writer updates rows of it (the selected ones included)
and another table all along.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import orjson
import psycopg
import pytest

from cdc.capture.reads.snapshot_requests import PREFIX, SnapshotRequest
from cdc.commands.snapshot_cmd import request_snapshot
from cdc.config.settings import Settings
from cdc.run.coordinator import Capture
from event_format import is_truncate_key
from log_store.errors import LogNotFoundError
from tests.cdc.capture.reads.test_online_reads import BIG, TOASTED, WORDS, _progress, _started, assert_per_key_order, words_table
from tests.cdc.capture.reads.test_online_reads import _tables as online_tables
from tests.cdc.helpers import execute, first_reads, read_topic, replay, run_cdc, settings_for, source_table, wait_for
from tests.faults.harness import CdcProcess, cdc_env, wal_lsn

pytestmark = pytest.mark.pg

ROWS = 150_000
KEY = "a-request-key-of-32-characters.."
#: what the publication publishes of big, and what the request asks for
PUBLISHED = "id % 3 <> 0"
WHERE = "id % 10 = 0"


def _tables(url: str) -> None:
    execute(
        url,
        "CREATE TABLE big (id int PRIMARY KEY, v int NOT NULL, doc text, secret text)",
        "CREATE TABLE busy (id int PRIMARY KEY, n int NOT NULL)",
        f"INSERT INTO big SELECT g, 0, 'd' || g, 's' || g FROM generate_series(1, {ROWS}) g",
        "INSERT INTO busy SELECT g, 0 FROM generate_series(1, 50) g",
        f"ALTER PUBLICATION cdc_publication ADD TABLE big (id, v, doc) WHERE ({PUBLISHED}), busy",
        f"CREATE VIEW big_published AS SELECT id, v, doc FROM big WHERE {PUBLISHED}",
    )


class _Updates(threading.Thread):
    """Updates of random rows of big (selected ones too) and of busy until stopped: no row comes or goes."""

    def __init__(self, url: str) -> None:
        super().__init__(name="updates", daemon=True)
        self.url, self.stop, self.transactions, self.error = url, threading.Event(), 0, None

    def run(self) -> None:
        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                while not self.stop.is_set():
                    with conn.transaction():
                        conn.execute("UPDATE big SET v = v + 1, secret = 'x' WHERE id = 1 + (random() * %s)::int", (ROWS - 1,))
                        conn.execute("UPDATE big SET v = v + 1 WHERE id = 10 * (1 + (random() * %s)::int)", (ROWS // 10 - 1,))
                        conn.execute("UPDATE busy SET n = n + 1 WHERE id = 1 + (random() * 49)::int")
                    self.transactions += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


@contextmanager
def _streaming_while_updated(url: str, data_dir: Path) -> Iterator[tuple[Capture, Settings, _Updates]]:
    """Capture (in a thread, chunks of 100 rows, ``CDC_REQUEST_KEY`` set) past its initial snapshot of big and
    busy, and :class:`_Updates` running; both stopped at the end."""
    _tables(url)
    first_reads(url, data_dir, tables="public.big,public.busy", request_key=KEY)
    settings = settings_for(url, data_dir, tables="public.big,public.busy", snapshot_chunk_rows=100, request_key=KEY)
    capture, stop_capture = _started(settings)
    updates = _Updates(url)
    try:
        wait_for(lambda: _first_read_over(data_dir), what="the first read")
        updates.start()
        yield capture, settings, updates
    finally:
        updates.stop.set()
        stop_capture()


def _stop_and_drain(updates: _Updates, url: str, data_dir: Path) -> None:
    """Stop ``updates`` (failing on its error) and wait until big's log replays to the rows published.

    Replayed with ``strict=False``: a partial read's ``op=r`` rows are of keys the table already holds."""
    updates.stop.set()
    updates.join(30)
    assert updates.error is None, updates.error
    try:
        wait_for(
            lambda: replay(data_dir, BIG, strict=False) == source_table(url, "big_published"),
            what="the log to replay to the source",
        )
    except AssertionError as timed_out:
        replayed, source = replay(data_dir, BIG, strict=False), source_table(url, "big_published")
        extra = sorted(set(replayed) - set(source), key=repr)[:5]
        missing = sorted(set(source) - set(replayed), key=repr)[:5]
        differing = [
            (key, replayed[key], source[key])
            for key in sorted(set(source) & set(replayed), key=repr)
            if replayed[key] != source[key]
        ]
        raise AssertionError(
            f"{timed_out}: extra {extra}, missing {missing}, differing {differing[:5]} of {len(differing)}"
        ) from None


def _reads(data_dir: Path) -> dict[tuple[int, int], list[int]]:
    """The ids of big's ``op=r`` records, run by run of each read, by the position the run is as of and
    its first sequence number (runs may share a position when the stream did not move between them;
    a run's rows are numbered one after the other)."""
    try:
        records = read_topic(data_dir, BIG)
    except LogNotFoundError:  # capture has not created it yet
        return {}
    rows = []
    for record in records:
        value = orjson.loads(record.value) if record.value is not None and not is_truncate_key(record.key) else None
        if value is not None and value["op"] == "r":
            rows.append((value["source"]["lsn"], value["source"]["sequence"], value["after"]["id"]))
    runs: dict[tuple[int, int], list[int]] = {}
    run: list[int] = []
    last = (-1, -2)
    for lsn, sequence, key in sorted(rows):
        if (lsn, sequence) != (last[0], last[1] + 1):
            run = runs.setdefault((lsn, sequence), [])
        run.append(key)
        last = (lsn, sequence)
    return runs


def _first_read_over(data_dir: Path) -> bool:
    """Whether the first read of big (a new log's, in runs of chunks) is in the log: rows, and no progress."""
    return bool(_reads(data_dir)) and _progress(data_dir) is None


def _later_runs(data_dir: Path, initial: set[tuple[int, int]]) -> list[tuple[tuple[int, int], list[int]]]:
    """The runs of big's reads after those in ``initial`` (the first read's), in order."""
    return sorted(item for item in _reads(data_dir).items() if item[0] not in initial)


def _forged(url: str) -> None:
    """Requests as any role that may connect could send them: signed with another key, and with a signature
    that is no hex text at all."""
    request = SnapshotRequest(("public.big",), where="true").signed(b"not the key at all.............", time.time_ns() // 10**6)
    odd = SnapshotRequest(("public.big",), where="true", at=request.at, signature="\u00e9\u00e9")
    for content in (request.content(), odd.content()):
        execute(url, f"SELECT pg_logical_emit_message(true, '{PREFIX}', convert_to('{content.decode()}', 'UTF8'))")


def test_cdc_snapshot_where_reads_again_exactly_the_rows_it_selects_beside_the_stream(reference_db: str, tmp_path: Path) -> None:
    """A forged request is ignored; a signed one reads again exactly the published rows the condition
    selects (no unpublished column, no row the row filter leaves out, no truncate marker), gives way to an
    ``ADD COLUMN`` mid-way and goes on past its last key, and the log replays to the source in per-key order."""
    with _streaming_while_updated(reference_db, tmp_path) as (capture, settings, updates):
        initial = set(_reads(tmp_path))
        _forged(reference_db)
        asked = run_cdc(reference_db, tmp_path, "snapshot", "public.big", "--where", WHERE, request_key=KEY)
        assert asked.returncode == 0, asked.stderr
        wait_for(lambda: any(read.condition for read in capture.reads if read.rows > 500), what="the partial read under way")
        execute(reference_db, "ALTER TABLE big ADD COLUMN extra int")  # the read gives way, then goes on
        wait_for(
            lambda: len(_later_runs(tmp_path, initial)) >= 2 and _progress(tmp_path) is None and not capture.reads,
            timeout=120,
            what="the end of the partial read",
        )
        _stop_and_drain(updates, reference_db, tmp_path)
    assert capture.stats.reads_requested == 1, "the forged request was taken"
    assert capture.stats.reads_yielded >= 1 and capture.stats.tables_added == 0, capture.stats
    runs = _reads(tmp_path)
    assert sum(len(runs[run]) for run in initial) == ROWS - ROWS // 3
    again = _later_runs(tmp_path, initial)
    reread = [key for _, keys in again for key in keys]
    assert sorted(reread) == [i for i in range(1, ROWS + 1) if i % 10 == 0 and i % 3 != 0], "not exactly the selected rows"
    records = read_topic(tmp_path, BIG)
    assert sum(is_truncate_key(r.key) for r in records) == 0, "a partial read wrote truncate markers"
    assert all(b"secret" not in (r.value or b"") for r in records)
    assert_per_key_order(records)


def test_a_where_request_that_capture_would_not_run_is_one_clear_error(reference_db: str, tmp_path: Path) -> None:
    _tables(reference_db)
    execute(reference_db, "CREATE DOMAIN public.my_domain AS int CHECK (VALUE > -1)")
    cases = {
        (WHERE, ""): "set CDC_REQUEST_KEY",
        ("secret = 's1'", KEY): "secret is not a column the publication publishes",
        ("doc > 5", KEY): "operator does not exist: text",
        ("random() < 0.5", KEY): "calls random, which may read beyond the row",
        ("strpos(table_to_xml('public.big'::regclass, true, false, '')::text, '<id>' || id) > 0", KEY): "calls table_to_xml",
        ("txid_current() > 0", KEY): "calls txid_current",
        # a type of another schema on the search path is never the one a condition names
        ("CAST(id AS my_domain) > 0", KEY): 'type "pg_catalog.my_domain" does not exist',
        ("id = 1) OR (true", KEY): "is not an SQL condition",
    }
    for (where, key), error in cases.items():
        refused = run_cdc(reference_db, tmp_path, "snapshot", "public.big", "--where", where, request_key=key)
        assert refused.returncode == 2 and error in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
    both = run_cdc(reference_db, tmp_path, "snapshot", "public.big", "public.busy", "--where", WHERE, request_key=KEY)
    assert both.returncode == 2 and "name exactly one table" in both.stderr, both.stderr


def test_a_partial_read_killed_mid_way_goes_on_past_its_last_key_and_cancel_stops_one(reference_db: str, tmp_path: Path) -> None:
    """``kill -9`` of capture during a partial read: the next run writes what the read held and goes on
    past its last durable key (no selected row missing, none read twice). Then ``--cancel`` stops another
    partial read under way: its held changes are written, no progress or holding file is left, and the
    table stays captured: the log replays to the source."""
    _tables(reference_db)
    first_reads(reference_db, tmp_path, tables="public.big,public.busy", request_key=KEY)
    env = cdc_env(reference_db, tmp_path, tables="public.big,public.busy", snapshot_chunk_rows="100", request_key=KEY)
    capture = CdcProcess(env, ["capture"], tmp_path / "capture-0.err")
    updates = _Updates(reference_db)
    try:
        wait_for(lambda: _first_read_over(tmp_path), what="the first read")
        initial = set(_reads(tmp_path))
        updates.start()
        asked = run_cdc(reference_db, tmp_path, "snapshot", "public.big", "--where", WHERE, request_key=KEY)
        assert asked.returncode == 0, asked.stderr
        wait_for(lambda: (_progress(tmp_path) or 0) >= 1_000, what="the partial read under way")
        assert capture.kill9(), capture.stderr()
        killed_at = _progress(tmp_path) or 0
        capture = CdcProcess(env, ["capture"], tmp_path / "capture-1.err")
        wait_for(
            lambda: len(_later_runs(tmp_path, initial)) >= 2 and _progress(tmp_path) is None, timeout=120, what="the read's end"
        )
        runs = len(_later_runs(tmp_path, initial))  # the killed read's and those of the run after it
        settings = settings_for(reference_db, tmp_path, tables="public.big,public.busy", request_key=KEY)
        request_snapshot(settings, ("public.big",), where="id % 7 <> 0")  # most of the table, in chunks of 100
        wait_for(lambda: (_progress(tmp_path) or 0) > 0, what="the second partial read under way")
        request_snapshot(settings, ("public.big",), cancel=True)
        wait_for(lambda: _progress(tmp_path) is None, what="the cancellation")
        _stop_and_drain(updates, reference_db, tmp_path)
        assert not list((tmp_path / "held").glob("*.held"))
        assert capture.terminate() == 0, capture.stderr()
    finally:
        updates.stop.set()
        if capture.running():
            capture.kill9()
    later = _later_runs(tmp_path, initial)
    finished, cancelled_runs = later[:runs], later[runs:]
    assert len(finished[0][1]) >= killed_at > 0
    reread = sorted(key for _, keys in finished for key in keys)
    assert reread == [i for i in range(1, ROWS + 1) if i % 10 == 0 and i % 3 != 0], "a selected row missing or read twice"
    stopped = [key for _, keys in cancelled_runs for key in keys]
    selected = [i for i in range(1, ROWS + 1) if i % 7 != 0 and i % 3 != 0]
    assert stopped and all(key % 7 != 0 for key in stopped) and len(stopped) < len(selected), "the read was not stopped"
    assert_per_key_order(read_topic(tmp_path, BIG))


def test_a_key_change_leaving_a_toasted_value_takes_it_from_the_held_changes_during_a_partial_read(
    reference_db: str, tmp_path: Path
) -> None:
    """During a partial read, a row's document is rewritten (a held change) and then its key changes with
    the document left unchanged: the new key's row gets the rewritten document (the held change folded
    over the log's row), the read goes on (no whole read of the table) and the log replays to the source."""
    rows = 150_000
    online_tables(reference_db, rows)
    first_reads(reference_db, tmp_path, tables="public.big,public.busy", request_key=KEY)
    settings = settings_for(reference_db, tmp_path, tables="public.big,public.busy", snapshot_chunk_rows=100, request_key=KEY)
    capture, stop_capture = _started(settings)
    moved = rows - TOASTED  # its document is stored out of line
    try:
        wait_for(lambda: _first_read_over(tmp_path), what="the first read")
        request_snapshot(settings, ("public.big",), where=WHERE)
        wait_for(lambda: (_progress(tmp_path) or 0) > 0, what="the partial read under way")
        execute(
            reference_db,
            f"UPDATE big SET doc = (SELECT string_agg(md5('new' || s), '') FROM generate_series(1, 200) s) WHERE id = {moved}",
        )
        wait_for(lambda: any(read.held.count for read in capture.reads), what="the rewrite held")  # in a group of its own
        execute(reference_db, f"UPDATE big SET id = 90000000 WHERE id = {moved}")
        assert _progress(tmp_path) is not None, "the read ended before the updates"
        wait_for(lambda: _progress(tmp_path) is None and not capture.reads, what="the end of the partial read")
        # two requests in a row: the second waits for the first (one holding file per table), none is dropped
        request_snapshot(settings, ("public.big",), where="id = 10")
        request_snapshot(settings, ("public.big",), where="id = 20")
        wait_for(lambda: capture.stats.reads_requested == 3 and not _asked(tmp_path), what="both requests read")
        wait_for(lambda: replay(tmp_path, BIG, strict=False) == source_table(reference_db, "big"), what="the log to replay")
    finally:
        stop_capture()
    assert capture.stats.reads_abandoned == 0 and capture.stats.tables_added == 0, capture.stats
    last_two = sorted(_reads(tmp_path).items())[-2:]
    assert [keys for _, keys in last_two] == [[10], [20]], last_two
    new_doc = replay(tmp_path, BIG, strict=False)[b'{"id":90000000}']["doc"]
    assert str(new_doc).startswith(hashlib.md5(b"new1").hexdigest()) and len(str(new_doc)) == 6400
    assert_per_key_order(read_topic(tmp_path, BIG))


def test_a_partial_read_by_block_ranges_killed_writes_what_it_held_and_a_failing_condition_ends_its_read(
    reference_db: str, tmp_path: Path
) -> None:
    """A table with a text key is read by block ranges (no progress per chunk): ``kill -9`` during its
    partial read while other rows change, and the next run still writes the changes the read held (the
    read's progress record is in the log from its first moment) and reads the selected rows again. Then a
    condition that fails on a row (a division by zero PostgreSQL cannot see when it plans it) ends its read:
    capture goes on streaming, the request is forgotten, and the log replays to the source."""
    rows = 300_000
    words_table(reference_db, rows)
    topic = WORDS
    env = cdc_env(reference_db, tmp_path, tables="public.words", snapshot_chunk_rows="100", request_key=KEY)
    settings = settings_for(reference_db, tmp_path, tables="public.words", request_key=KEY)
    source = partial(source_table, reference_db, "words", key="k")

    def reads() -> list[int]:
        try:
            records = read_topic(tmp_path, topic)
        except LogNotFoundError:
            return []
        return [orjson.loads(r.value)["source"]["lsn"] for r in records if r.value and orjson.loads(r.value)["op"] == "r"]

    # the first read in chunks of the default size: small chunks are for the partial read alone
    first = run_cdc(reference_db, tmp_path, "capture", "--once", tables="public.words", request_key=KEY)
    assert first.returncode == 0 and len(reads()) >= rows, first.stderr
    capture = CdcProcess(env, ["capture"], tmp_path / "capture-0.err")
    try:
        request_snapshot(settings, ("public.words",), where="v % 2 = 0")
        wait_for(lambda: _reading(tmp_path, "public.words"), what="the partial read under way")
        execute(reference_db, "UPDATE words SET v = v + 2 WHERE v % 2 = 1 AND v < 3000")  # rows it does not select
        wait_for(lambda: any(p.stat().st_size > 0 for p in (tmp_path / "held").glob("*.held")), what="the update held")
        assert capture.kill9(), capture.stderr()
        assert _reading(tmp_path, "public.words"), "the read ended before the kill"
        capture = CdcProcess(env, ["capture"], tmp_path / "capture-1.err")
        wait_for(lambda: replay(tmp_path, topic, strict=False) == source(), what="the log to replay to the source")
        wait_for(lambda: not _asked(tmp_path), what="the end of the partial read")
        request_snapshot(settings, ("public.words",), where="v / (v % 1000 - 500) > -10")  # fails at v = 500
        wait_for(lambda: not _asked(tmp_path), what="the failing read's end")
        execute(reference_db, "UPDATE words SET v = 0 WHERE k = 'w1'")
        wait_for(lambda: replay(tmp_path, topic, strict=False) == source(), what="capture streaming on")
        assert capture.terminate() == 0, capture.stderr()
    finally:
        if capture.running():
            capture.kill9()
    assert "its condition failed on a row" in (tmp_path / "capture-1.err").read_text()
    assert_per_key_order(read_topic(tmp_path, topic))


def _reading(data_dir: Path, name: str) -> bool:
    """Whether the ledger holds the progress of a read of ``name`` under way."""
    present = False
    for record in read_topic(data_dir, "cdc.__snapshots"):
        if record.key == orjson.dumps(["read", name]):
            present = record.value is not None
    return present


def _asked(data_dir: Path) -> set[bytes]:
    """The ledger's notes of reads asked for and not ended."""
    notes: dict[bytes, bool] = {}
    for record in read_topic(data_dir, "cdc.__snapshots"):
        if record.key is not None and record.key.startswith(b'["asked"'):
            notes[record.key] = record.value is not None
    return {key for key, present in notes.items() if present}


def test_a_whole_read_that_falls_due_during_a_partial_read_waits_for_it(reference_db: str, tmp_path: Path) -> None:
    """The publication's row filter of big changes while a partial read of it is under way: the whole read
    that change calls for waits until the partial one ended (one holding file per table), then supersedes
    it; the log replays to the rows the new filter publishes, in per-key order, while rows keep changing."""
    with _streaming_while_updated(reference_db, tmp_path) as (capture, settings, updates):
        request_snapshot(settings, ("public.big",), where="id % 4 = 0")  # a quarter of the table, in chunks of 100
        wait_for(lambda: any(read.condition for read in capture.reads if read.rows > 0), what="the partial read under way")
        execute(
            reference_db,
            "ALTER PUBLICATION cdc_publication SET TABLE big (id, v, doc) WHERE (id % 3 <> 1), busy",
            "CREATE OR REPLACE VIEW big_published AS SELECT id, v, doc FROM big WHERE id % 3 <> 1",
        )
        altered = wal_lsn(reference_db)
        request_snapshot(settings, ("public.busy",))  # a discovery right after it: big's whole read falls due
        wait_for(lambda: capture.stats.reads_requested == 2, what="the request for busy")
        assert any(read.condition for read in capture.reads), "the partial read ended before the filter changed"
        wait_for(  # the whole read's last part: the ledger's entry as of a position past the change
            lambda: capture.stats.tables_added == 2 and (entry := capture.ledger.entries.get("public.big")) is not None
            and entry.lsn >= altered and not capture.reads,
            timeout=120,
            what="the whole reads",
        )  # fmt: skip
        _stop_and_drain(updates, reference_db, tmp_path)  # to the rows the new filter publishes
    assert capture.stats.reads_abandoned == 0, capture.stats
    assert_per_key_order(read_topic(tmp_path, BIG))
