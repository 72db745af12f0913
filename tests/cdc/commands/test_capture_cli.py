"""The ``cdc setup`` / ``cdc capture`` commands as subprocesses, including kill -9 during a workload."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
from pathlib import Path

import orjson
import psycopg
import pytest

from event_format import fold_after
from local_servers.postgres import LocalPostgres
from log_store import LogConfig, LogStore, TopicPartition
from tests.cdc.helpers import read_topic, replay, source_table, wait_for

pytestmark = [pytest.mark.pg, pytest.mark.slow]

CDC = str(Path(__file__).resolve().parents[3] / ".venv" / "bin" / "cdc")


def _env(url: str, data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_")}
    env.update(CDC_DATABASE_URL=url, CDC_DATA_DIR=str(data_dir), CDC_SLOT="cdc_slot", CDC_PUBLICATION="cdc_publication")
    return env


def test_setup_reports_a_missing_key_in_one_line(reference_db: str, tmp_path: Path) -> None:
    with psycopg.connect(reference_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE nokey (a int)")
        conn.execute("ALTER PUBLICATION cdc_publication ADD TABLE nokey")
    result = subprocess.run([CDC, "setup"], env=_env(reference_db, tmp_path), capture_output=True, text=True, timeout=60)
    assert result.returncode == 3
    errors = result.stderr.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("error: table public.nokey has no primary key")
    with psycopg.connect(reference_db, autocommit=True) as conn:
        conn.execute("ALTER TABLE nokey REPLICA IDENTITY FULL")
    result = subprocess.run([CDC, "setup"], env=_env(reference_db, tmp_path), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "slot cdc_slot: created" in result.stdout
    (warning,) = [line for line in result.stdout.splitlines() if line.startswith("warn ")]
    assert warning.startswith("warn table public.nokey key: table public.nokey has no primary key") and "append-only" in warning


def test_setup_reports_wal_level_replica_then_too_few_slots_in_one_line(tmp_path: Path) -> None:
    server = LocalPostgres(settings={"wal_level": "replica"})
    try:
        url = server.start()
        result = subprocess.run([CDC, "setup"], env=_env(url, tmp_path), capture_output=True, text=True, timeout=60)
        assert result.returncode == 3, result.stderr
        assert result.stderr.strip().splitlines() == [
            "error: wal_level is replica, logical decoding needs logical; set wal_level = logical in "
            "postgresql.conf (or ALTER SYSTEM SET wal_level = logical) and restart PostgreSQL"
        ]
        assert "FAIL wal_level" in result.stdout and "slot cdc_slot" not in result.stdout
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET wal_level = logical")
            conn.execute("ALTER SYSTEM SET max_replication_slots = 1")
        server.restart()
        with psycopg.connect(url, autocommit=True) as conn:  # another client's slot takes the only one
            conn.execute("SELECT pg_create_physical_replication_slot('other_client')")
        result = subprocess.run([CDC, "setup"], env=_env(url, tmp_path), capture_output=True, text=True, timeout=60)
    finally:
        server.stop()
    assert result.returncode == 3, result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: 0 of 1 replication slots are free, capture needs 1 (its slot); raise max_replication_slots or drop an unused slot"
    ]


def test_kill_9_during_a_workload_loses_and_doubles_nothing(reference_db: str, tmp_path: Path) -> None:
    env = _env(reference_db, tmp_path)
    keys = 20
    with psycopg.connect(reference_db, autocommit=True) as conn:
        conn.execute("INSERT INTO categories (name) SELECT '0' FROM generate_series(1, %s)", (keys,))
    subprocess.run([CDC, "capture", "--once"], env=env, check=True, capture_output=True, timeout=120)
    counters = dict.fromkeys(range(1, keys + 1), 0)
    stop = threading.Event()
    rng = random.Random(7)

    def workload() -> None:
        with psycopg.connect(reference_db, autocommit=True) as conn:
            while not stop.is_set():
                chosen = rng.sample(sorted(counters), 3)
                with conn.transaction():
                    for key in chosen:
                        conn.execute("UPDATE categories SET name = (name::int + 1)::text WHERE id = %s", (key,))
                for key in chosen:
                    counters[key] += 1

    writer = threading.Thread(target=workload)
    writer.start()
    try:
        for _ in range(4):
            process = subprocess.Popen([CDC, "capture"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            before = len(read_topic(tmp_path, "cdc.public.categories"))
            wait_for(lambda: len(read_topic(tmp_path, "cdc.public.categories")) > before + 20, what="capture progress")
            threading.Event().wait(rng.uniform(0.0, 0.5))  # a random moment, not a synchronisation
            process.send_signal(signal.SIGKILL)
            process.wait(30)
            assert process.stderr is not None
            process.stderr.close()
    finally:
        stop.set()
        writer.join(30)
    final = subprocess.Popen([CDC, "capture"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        expected_updates = sum(counters.values())
        wait_for(
            lambda: (
                len([r for r in read_topic(tmp_path, "cdc.public.categories") if r.value and b'"op":"u"' in r.value])
                >= expected_updates
            ),
            what="all updates",
        )
    finally:
        final.send_signal(signal.SIGTERM)
        _, stderr = final.communicate(timeout=60)
    assert final.returncode == 0, stderr
    per_key: dict[int, list[int]] = {}
    for record in read_topic(tmp_path, "cdc.public.categories"):  # partition order = offset order
        value = orjson.loads(record.value or b"null")
        if value and value["op"] == "u":
            per_key.setdefault(value["after"]["id"], []).append(int(value["after"]["name"]))
    for key, count in counters.items():
        assert per_key.get(key, []) == list(range(1, count + 1)), f"key {key}"


def _snapshot_progress(data_dir: Path, topic: str) -> tuple[str, int] | None:
    """(watermark position, records of ``topic``) as a reader sees them, or None before the first group."""
    try:
        with LogStore.open(data_dir / "log") as log:
            watermark = log.latest_watermark()
            if watermark is None:
                return None
            return watermark.position, sum(watermark.end_offset(TopicPartition(topic, p)) for p in range(log.partitions(topic)))
    except Exception:  # noqa: BLE001 - the writer has not created the log or topic yet
        return None


def test_kill_9_mid_first_read_then_deletes_leave_no_stale_row(reference_db: str, tmp_path: Path) -> None:
    """``kill -9`` while a new log's table is read, then deletes and updates of rows already read: the next
    run goes on past the last durable key (no row read twice, no truncate marker, no tombstone but a
    delete's), and the log replays to the source, before and after compaction."""
    rows, topic = 6000, "cdc.public.categories"
    with psycopg.connect(reference_db, autocommit=True) as conn:
        # wide rows: few per block, and a chunk of one block per group makes the snapshot take a while
        conn.execute("INSERT INTO categories (name) SELECT repeat('x', 500) || g FROM generate_series(1, %s) g", (rows,))
        conn.execute("ANALYZE categories")
    env = _env(reference_db, tmp_path)
    first = subprocess.Popen(
        [CDC, "capture", "--once", "--snapshot-chunk-rows", "1"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_for(lambda: (_snapshot_progress(tmp_path, topic) or ("", 0))[1] >= 150, what="the first snapshot rows")
        first.send_signal(signal.SIGSTOP)
        position, written = _snapshot_progress(tmp_path, topic) or ("", 0)
        assert position != "0" * 16 and 150 <= written < rows, "the read finished before it could be interrupted"
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    partial = sorted({orjson.loads(r.key or b"")["id"] for r in read_topic(tmp_path, topic)})  # only reads so far
    deleted = partial[:50]
    with psycopg.connect(reference_db, autocommit=True) as conn:
        conn.execute("DELETE FROM categories WHERE id = ANY(%s)", (deleted,))
        conn.execute("UPDATE categories SET name = 'renamed' WHERE id = ANY(%s)", (partial[50:100],))
        conn.execute("INSERT INTO categories (name) VALUES ('new')")
    subprocess.run([CDC, "capture", "--once"], env=env, check=True, capture_output=True, timeout=120)
    records = read_topic(tmp_path, topic)
    values = [orjson.loads(r.value) for r in records if r.value]
    assert any(v["op"] == "r" and v["after"]["id"] in deleted for v in values), "the interrupted rows are in the log"
    assert replay(tmp_path, topic) == source_table(reference_db, "categories")
    read = [v["after"]["id"] for v in values if v["op"] == "r"]
    assert len(read) == len(set(read)), "a row was read twice: the read started over"
    assert not [v for v in values if v["op"] == "t"], "a resumed read wrote truncate markers"
    deletes = {orjson.dumps({"id": v["before"]["id"]}) for v in values if v["op"] == "d"}
    assert {r.key for r in records if r.value is None} <= deletes, "a tombstone of a key nobody deleted"
    with psycopg.connect(reference_db, autocommit=True) as conn:
        conn.execute("UPDATE categories SET name = 'streamed' WHERE id = %s", (partial[100],))
    subprocess.run([CDC, "capture", "--once"], env=env, check=True, capture_output=True, timeout=120)
    expected = source_table(reference_db, "categories")
    assert replay(tmp_path, topic) == expected
    with LogStore.open(tmp_path / "log", LogConfig(fold=fold_after), writer=True) as log:
        log.roll()
        log.compact()
    assert replay(tmp_path, topic, strict=False) == expected


def test_capture_compacts_its_log_beside_its_appends(reference_db: str, tmp_path: Path) -> None:
    """A running capture compacts the embedded log every ``CDC_LOG_COMPACT_INTERVAL_S`` (in a child
    process, beside its appends): superseded records leave the log while it runs, the log still replays to
    the source, and each compaction is one line of capture's log."""
    topic, keys, rounds = "cdc.public.categories", 5, 12
    env = _env(reference_db, tmp_path) | {"CDC_SEGMENT_BYTES": "1024", "CDC_LOG_COMPACT_INTERVAL_S": "0.5"}
    with psycopg.connect(reference_db, autocommit=True) as conn:
        conn.execute("INSERT INTO categories (name) SELECT 'v0' FROM generate_series(1, %s)", (keys,))
    log_file = tmp_path / "capture.err"
    with log_file.open("wb") as err:
        process = subprocess.Popen([CDC, "capture"], env=env, stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_for(lambda: (_snapshot_progress(tmp_path, topic) or ("", 0))[1] >= keys, what="the table's first read")
        with psycopg.connect(reference_db, autocommit=True) as conn:
            for n in range(1, rounds + 1):  # a round at a time, so that segments roll between them
                conn.execute("UPDATE categories SET name = %s", (f"v{n}",))
                appended = keys * (n + 1)
                wait_for(lambda: (_snapshot_progress(tmp_path, topic) or ("", 0))[1] >= appended, what="the update in the log")
        wait_for(lambda: len(read_topic(tmp_path, topic)) < appended // 2, what="a compaction while capture runs")
        assert replay(tmp_path, topic, strict=False) == source_table(reference_db, "categories")
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)
    assert process.returncode == 0, log_file.read_text()
    lines = [line for line in log_file.read_text().splitlines() if "compacted the log in" in line]
    assert any("rewritten" in line for line in lines), log_file.read_text()
