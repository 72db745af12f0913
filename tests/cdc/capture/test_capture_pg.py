"""Capture against a real PostgreSQL: snapshot + stream, DML, schema changes, TOAST, restart, errors."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import orjson
import psycopg
import pytest

from cdc.capture.errors import PrivilegeError, SlotError, SourceError
from cdc.run.coordinator import Capture
from cdc.run.tuning import Tuning
from cdc.setup.source_checks import run_checks
from cdc.setup.source_objects import ensure_publication, ensure_slot
from event_format import fold_after
from log_store import LogConfig, LogStore
from tests.cdc.helpers import events, execute, read_topic, replay, settings_for, source_table, wait_for

pytestmark = pytest.mark.pg


def test_snapshot_then_stream_without_gap_or_duplicate(reference_db: str, tmp_path: Path) -> None:
    execute(reference_db, "INSERT INTO categories (name) SELECT 'c' || g FROM generate_series(1, 500) g")
    settings = settings_for(reference_db, tmp_path)
    stats = Capture(settings, once=True).run()
    assert stats.snapshot_rows == 500
    execute(
        reference_db,
        "INSERT INTO categories (name) SELECT 'n' || g FROM generate_series(1, 100) g",
        "UPDATE categories SET name = name || '!' WHERE id <= 10",
        "DELETE FROM categories WHERE id BETWEEN 11 AND 20",
    )
    Capture(settings, once=True).run()
    got = events(tmp_path, "cdc.public.categories")
    reads = [e for e in got if e["op"] == "r"]
    assert sorted(e["after"]["id"] for e in reads) == list(range(1, 501))  # type: ignore[index]
    assert reads[-1]["source"]["snapshot"] == "last"  # type: ignore[index]
    creates = [e["after"]["id"] for e in got if e["op"] == "c"]  # type: ignore[index]
    assert sorted(creates) == list(range(501, 601))
    assert len([e for e in got if e["op"] == "u"]) == 10 and len([e for e in got if e["op"] == "d"]) == 10
    tombstones = [r for r in read_topic(tmp_path, "cdc.public.categories") if r.value is None]
    assert len(tombstones) == 10
    schemas = read_topic(tmp_path, "cdc.__schemas")
    assert {orjson.loads(r.key or b"") for r in schemas} == {
        "public.customers",
        "public.categories",
        "public.products",
        "public.orders",
        "public.order_items",
    }
    # a third run has nothing new and appends no event
    Capture(settings, once=True).run()
    assert len(events(tmp_path, "cdc.public.categories")) == len(got)


def test_types_truncate_toast_and_compaction(reference_db: str, tmp_path: Path) -> None:
    settings = settings_for(reference_db, tmp_path)
    Capture(settings, once=True).run()
    big = "(SELECT string_agg(md5(g::text || 'x'), '') FROM generate_series(1, 3200) g)"  # ~100 kB, incompressible
    execute(
        reference_db,
        "INSERT INTO categories (name) VALUES ('books')",
        f"INSERT INTO products (category_id, name, description, price, attributes, tags) "
        f"VALUES (1, 'p', {big}, 19.90, '{{\"w\": 1.5}}', ARRAY['a','b c'])",
        "UPDATE products SET price = 21.00 WHERE id = 1",
        "TRUNCATE order_items",
    )
    Capture(settings, once=True).run()
    products = events(tmp_path, "cdc.public.products")
    create, update = products
    after = create["after"]
    assert after["price"] == "19.90" and after["tags"] == ["a", "b c"] and after["attributes"] == '{"w": 1.5}'  # type: ignore[index]
    assert len(after["description"]) == 3200 * 32  # type: ignore[index, arg-type]
    assert str(after["updated_at"]).endswith("Z")  # type: ignore[index]
    assert "description" not in update["after"] and update["after"]["price"] == "21.00"  # type: ignore[index, operator]
    partial = [r for r in read_topic(tmp_path, "cdc.public.products") if r.headers]
    assert partial and partial[0].header("unchanged") == b'["description"]'
    truncates = [r for r in read_topic(tmp_path, "cdc.public.order_items") if r.value]
    assert sorted(r.partition for r in truncates) == [0, 1, 2]
    # compaction folds the partial row onto the full one: the latest record holds every column
    with LogStore.open(tmp_path / "log", LogConfig(fold=fold_after), writer=True) as log:
        log.roll()
        log.compact()
    latest = [orjson.loads(r.value or b"") for r in read_topic(tmp_path, "cdc.public.products")]
    assert latest[-1]["after"]["price"] == "21.00"
    assert len(latest[-1]["after"]["description"]) == 3200 * 32


def test_schema_changes_partitioned_root_and_new_table(reference_db: str, tmp_path: Path) -> None:
    execute(
        reference_db,
        "CREATE TABLE events (id bigint, at date, PRIMARY KEY (id, at)) PARTITION BY RANGE (at)",
        "CREATE TABLE events_2026 PARTITION OF events FOR VALUES FROM ('2026-01-01') TO ('2027-01-01')",
        "CREATE TABLE events_2027 PARTITION OF events FOR VALUES FROM ('2027-01-01') TO ('2028-01-01')",
        "ALTER PUBLICATION cdc_publication ADD TABLE events",
        "INSERT INTO events VALUES (1, '2026-05-01'), (2, '2027-05-01')",
    )
    settings = settings_for(reference_db, tmp_path)
    Capture(settings, once=True).run()
    execute(
        reference_db,
        "INSERT INTO events VALUES (3, '2026-06-01'), (4, '2027-06-01')",
        "ALTER TABLE categories ADD COLUMN slug text DEFAULT 'x'",
        "INSERT INTO categories (name, slug) VALUES ('a', 'a-slug')",
        "ALTER TABLE categories DROP COLUMN slug",
        "INSERT INTO categories (name) VALUES ('b')",
        "CREATE TABLE extra (id int PRIMARY KEY, v text)",
        "ALTER PUBLICATION cdc_publication ADD TABLE extra",
        "INSERT INTO extra VALUES (1, 'one')",
    )
    Capture(settings, once=True).run()
    with LogStore.open(tmp_path / "log") as log:
        topics = log.topics()
    assert "cdc.public.events" in topics and not any("events_20" in t for t in topics)
    assert sorted(e["after"]["id"] for e in events(tmp_path, "cdc.public.events")) == [1, 2, 3, 4]  # type: ignore[index]
    cats = events(tmp_path, "cdc.public.categories")
    assert cats[0]["after"] == {"id": 1, "name": "a", "slug": "a-slug"}
    assert cats[1]["after"] == {"id": 2, "name": "b"}
    assert events(tmp_path, "cdc.public.extra")[0]["after"] == {"id": 1, "v": "one"}
    schemas = [orjson.loads(r.value or b"") for r in read_topic(tmp_path, "cdc.__schemas")]
    category_shapes = [[c["name"] for c in s["columns"]] for s in schemas if s["table"] == "categories"]
    assert category_shapes == [["id", "name"], ["id", "name", "slug"], ["id", "name"]]


def _ledger(data_dir: Path) -> set[str]:
    names = (orjson.loads(r.key or b'""') for r in read_topic(data_dir, "cdc.__snapshots") if r.value is not None)
    return {name for name in names if isinstance(name, str)}  # (lists key reads' progress and other notes)


def test_tables_added_mid_stream_are_snapshotted_consistently(reference_db: str, tmp_path: Path) -> None:
    big = "(SELECT string_agg(md5(g::text || 'x' || i), '') FROM generate_series(1, 3200) i)"  # ~100 kB
    execute(
        reference_db,
        "CREATE TABLE added (id int PRIMARY KEY, v text, big text)",
        f"INSERT INTO added SELECT g, 'v' || g, CASE WHEN g % 300 = 0 THEN {big} END FROM generate_series(1, 3000) g",
        "CREATE TABLE quiet (id int PRIMARY KEY, v text)",
        "INSERT INTO quiet SELECT g, 'q' || g FROM generate_series(1, 500) g",
    )
    settings = settings_for(reference_db, tmp_path)
    Capture(settings, once=True).run()
    stop, done = threading.Event(), [0]

    def writer() -> None:
        """Changes `added` before, while and after it joins the publication (big values stay unchanged)."""
        rng, next_id = random.Random(11), 3001
        with psycopg.connect(reference_db, autocommit=True) as conn:
            while not stop.is_set():
                roll, key = rng.random(), rng.randint(1, next_id - 1)
                if roll < 0.5:
                    conn.execute("UPDATE added SET v = v || '+' WHERE id = %s", (key,))
                elif roll < 0.7:
                    conn.execute("DELETE FROM added WHERE id = %s", (key,))
                else:
                    conn.execute("INSERT INTO added VALUES (%s, 'new')", (next_id,))
                    next_id += 1
                done[0] += 1

    stopping = threading.Event()
    capture = Capture(settings, stop=stopping, tuning=Tuning(heartbeat_seconds=0.2, discover_seconds=0.2))
    streaming = threading.Thread(target=capture.run)
    streaming.start()
    thread = threading.Thread(target=writer)
    thread.start()
    try:
        wait_for(lambda: done[0] >= 200, what="changes before the table joins")
        execute(reference_db, "ALTER PUBLICATION cdc_publication ADD TABLE added")
        wait_for(lambda: "public.added" in _ledger(tmp_path), what="the snapshot of the added table")
        seen = done[0]
        wait_for(lambda: done[0] >= seen + 200, what="changes after the snapshot")
        stop.set()
        thread.join(30)
        # a table that joins and then sees no change is found by the periodic check
        execute(reference_db, "ALTER PUBLICATION cdc_publication ADD TABLE quiet")
        wait_for(lambda: "public.quiet" in _ledger(tmp_path), what="the snapshot of the quiet table")
    finally:
        stop.set()
        thread.join(30)
        stopping.set()
        streaming.join(60)
    assert capture.stats.tables_added == 2
    Capture(settings, once=True).run()  # drains what the stopped capture had not reached
    got = events(tmp_path, "cdc.public.added")
    assert {e["op"] for e in got} == {"r", "c", "u", "d"}
    assert all(e["source"]["snapshot"] == "false" for e in got if e["op"] != "r")  # type: ignore[index]
    # applied in (lsn, sequence) order: each key read or created once, updated and deleted only when present
    assert replay(tmp_path, "cdc.public.added") == source_table(reference_db, "added")
    assert replay(tmp_path, "cdc.public.quiet") == source_table(reference_db, "quiet")
    with LogStore.open(tmp_path / "log", LogConfig(fold=fold_after), writer=True) as log:
        log.roll()
        log.compact()
    assert replay(tmp_path, "cdc.public.added", strict=False) == source_table(reference_db, "added")
    assert not [r for r in read_topic(tmp_path, "cdc.public.added") if r.header("unchanged")]


def test_an_unreadable_added_table_stops_capture_with_the_grant(reference_db: str, tmp_path: Path) -> None:
    reader_url = reference_db.replace("postgres@", "cdc_reader@", 1)
    settings = settings_for(reader_url, tmp_path)
    Capture(settings, once=True).run()  # the least-privilege role takes the initial snapshot
    execute(
        reference_db,
        "CREATE TABLE secret (id int PRIMARY KEY)",
        "INSERT INTO secret VALUES (1)",
        "REVOKE SELECT ON secret FROM cdc_reader",  # undo the migration's default grant
        "ALTER PUBLICATION cdc_publication ADD TABLE secret",
        "INSERT INTO secret VALUES (2)",
    )
    with pytest.raises(PrivilegeError, match=r"cannot read public\.secret.*GRANT SELECT ON public\.secret"):
        Capture(settings, once=True).run()
    execute(reference_db, "GRANT SELECT ON secret TO cdc_reader")
    stats = Capture(settings, once=True).run()
    assert stats.tables_added == 1
    assert replay(tmp_path, "cdc.public.secret") == source_table(reference_db, "secret")


def test_large_transaction_is_streamed_and_bounded(reference_db: str, tmp_path: Path) -> None:
    settings = settings_for(reference_db, tmp_path)
    Capture(settings, once=True).run()
    with psycopg.connect(reference_db, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET logical_decoding_work_mem = '64kB'")
        conn.execute("SELECT pg_reload_conf()")
        try:
            conn.execute("INSERT INTO categories (name) SELECT 'c' || g FROM generate_series(1, 30000) g")
            stats = Capture(settings, once=True, tuning=Tuning(memory_limit=64 << 10)).run()
        finally:
            conn.execute("ALTER SYSTEM RESET logical_decoding_work_mem")
            conn.execute("SELECT pg_reload_conf()")
    assert stats.transactions == 1
    got = events(tmp_path, "cdc.public.categories")
    assert [e["source"]["sequence"] for e in got] == list(range(30000))  # type: ignore[index]
    assert len({e["source"]["lsn"] for e in got}) == 1  # type: ignore[index]


def test_restart_skips_what_the_log_holds(reference_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = settings_for(reference_db, tmp_path)
    Capture(settings, once=True).run()
    execute(reference_db, "INSERT INTO categories (name) SELECT 'c' || g FROM generate_series(1, 50) g")
    from cdc.capture.transport.connection import ReplicationConnection

    original = ReplicationConnection.send_status
    monkeypatch.setattr(ReplicationConnection, "send_status", lambda self, *a, **k: None)  # crash before confirming
    Capture(settings, once=True, tuning=Tuning(batch_changes=10)).run()
    monkeypatch.setattr(ReplicationConnection, "send_status", original)
    assert len(events(tmp_path, "cdc.public.categories")) == 50
    stats = Capture(settings, once=True).run()
    assert stats.skipped >= 1 and stats.events == 0
    assert len(events(tmp_path, "cdc.public.categories")) == 50


def test_commit_right_after_a_heartbeat_is_captured(reference_db: str, tmp_path: Path) -> None:
    """A heartbeat at the server's WAL end E must not cover a transaction whose commit record starts at E."""
    settings = settings_for(reference_db, tmp_path)
    Capture(settings, once=True).run()
    with psycopg.connect(reference_db) as conn:
        conn.execute("INSERT INTO categories (name) VALUES ('open across a heartbeat')")
        execute(reference_db, "CHECKPOINT")  # flushes the WAL; the next record is the commit below
        heartbeat = Capture(settings, once=True).run()  # drains to the WAL end E and records it
        assert heartbeat.events == 0 and heartbeat.groups == 1
        conn.commit()
    stats = Capture(settings, once=True).run()
    assert stats.skipped == 0 and stats.transactions == 1
    assert [e["after"]["name"] for e in events(tmp_path, "cdc.public.categories")] == ["open across a heartbeat"]  # type: ignore[index]


def test_once_exits_with_the_slot_released_at_its_confirmed_position(reference_db: str, tmp_path: Path) -> None:
    """``cdc capture --once`` ends the stream the protocol's way: a probe right after it sees the final
    confirmation, not a walsender still holding the slot at an older position."""
    settings = settings_for(reference_db, tmp_path)
    Capture(settings, once=True).run()
    for round_ in range(5):
        execute(reference_db, f"INSERT INTO categories (name) SELECT 'r{round_}-' || g FROM generate_series(1, 20) g")
        capture = Capture(settings, once=True)
        stats = capture.run()
        assert stats.events == 20
        with psycopg.connect(reference_db, autocommit=True) as conn:
            active, confirmed = conn.execute(
                "SELECT active, confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'cdc_slot'"
            ).fetchone()  # type: ignore[misc]
        assert active is False
        assert confirmed == str(capture.confirmed) and capture.confirmed == capture.position + 1


def test_slot_dropped_is_a_clear_error(reference_db: str, tmp_path: Path) -> None:
    settings = settings_for(reference_db, tmp_path)
    Capture(settings, once=True).run()
    execute(reference_db, "SELECT pg_drop_replication_slot('cdc_slot')")
    with pytest.raises(SlotError, match="replication slot is gone.*cdc setup"):
        Capture(settings, once=True).run()


def test_setup_checks_and_idempotent_creation(reference_db: str, tmp_path: Path) -> None:
    execute(
        reference_db,
        "CREATE TABLE nokey (a int)",
        "ALTER PUBLICATION cdc_publication ADD TABLE nokey",
        "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'norepl') THEN CREATE ROLE norepl LOGIN; END IF; END $$",
    )
    settings = settings_for(reference_db, tmp_path, slot="setup_slot")
    failed = {c.name: c.message for c in run_checks(settings) if not c.ok}
    assert list(failed) == ["table public.nokey key"]
    assert "REPLICA IDENTITY FULL" in failed["table public.nokey key"] and "\n" not in failed["table public.nokey key"]
    norepl = settings_for(reference_db.replace("postgres@", "norepl@", 1), tmp_path, tables="public.categories")
    failed = {c.name: c.message for c in run_checks(norepl) if not c.ok}
    assert "lacks the REPLICATION privilege" in failed["replication privilege"]
    assert ensure_slot(settings) is True and ensure_slot(settings) is False
    assert ensure_publication(settings) is False
    # a table without a key: inserts are captured with a null key into a non-compacted topic
    execute(reference_db, "INSERT INTO nokey VALUES (1)")
    Capture(settings_for(reference_db, tmp_path), once=True).run()
    (record,) = read_topic(tmp_path, "cdc.public.nokey")
    assert record.key is None and orjson.loads(record.value or b"")["after"] == {"a": 1}


def test_setup_refuses_a_publication_that_leaves_out_deletes_and_warns_of_partition_truncates(
    reference_db: str, tmp_path: Path
) -> None:
    settings = settings_for(reference_db, tmp_path)
    assert [c.name for c in run_checks(settings) if not c.ok or c.warning] == []
    execute(
        reference_db,
        "CREATE TABLE readings (id bigint, at date, PRIMARY KEY (id, at)) PARTITION BY RANGE (at)",
        "ALTER PUBLICATION cdc_publication ADD TABLE readings",
        "ALTER PUBLICATION cdc_publication SET (publish = 'insert, update')",
    )
    checks = {c.name: c for c in run_checks(settings)}
    assert not checks["publication actions"].ok
    assert "does not publish delete, truncate" in checks["publication actions"].message
    assert (
        "ALTER PUBLICATION cdc_publication SET (publish = 'insert, update, delete, truncate')"
        in checks["publication actions"].message
    )
    warning = checks["partition truncate"]
    assert warning.ok and warning.warning and "public.readings" in warning.message
    execute(reference_db, "ALTER PUBLICATION cdc_publication SET (publish = 'insert, update, delete, truncate')")
    assert all(c.ok for c in run_checks(settings))


def test_reconnects_after_server_restart(pg_server: object, reference_db: str, tmp_path: Path) -> None:
    local = getattr(pg_server, "local", None)
    if local is None:
        pytest.skip("the test server is not a local cluster that can be restarted")
    settings = settings_for(reference_db, tmp_path)
    Capture(settings, once=True).run()
    stop = threading.Event()
    capture = Capture(settings, stop=stop, tuning=Tuning(heartbeat_seconds=0.5))
    errors: list[BaseException] = []

    def run() -> None:
        try:
            capture.run()
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        execute(reference_db, "INSERT INTO categories (name) VALUES ('before')")
        wait_for(lambda: len(events(tmp_path, "cdc.public.categories")) == 1, what="first event")
        local.restart()
        execute(reference_db, "INSERT INTO categories (name) VALUES ('after')")
        wait_for(lambda: len(events(tmp_path, "cdc.public.categories")) == 2, what="event after restart")
    finally:
        stop.set()
        thread.join(60)
    assert not errors and capture.stats.reconnects >= 1
    assert [e["after"]["name"] for e in events(tmp_path, "cdc.public.categories")] == ["before", "after"]  # type: ignore[index]


def test_unknown_publication_is_a_clear_error(reference_db: str, tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="publication nopub does not exist.*cdc setup"):
        Capture(settings_for(reference_db, tmp_path, publication="nopub"), once=True).run()
