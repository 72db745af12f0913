"""Outbox messages through capture against a real PostgreSQL: commit, rollback, savepoints, order among the
transaction's row changes, bad input, and ``kill -9`` of capture during a burst of events."""

from __future__ import annotations

import logging
import os
import random
import signal
import subprocess
import threading
import uuid
from pathlib import Path

import orjson
import psycopg
import pytest

from cdc.run.coordinator import Capture
from cdc.run.tuning import Tuning
from derived_views.write.context import read_schemas
from log_store import LogStore, Record, TopicPartition
from tests.cdc.helpers import CDC, execute, read_topic, run_cdc, settings_for, wait_for

pytestmark = pytest.mark.pg

TOPIC = "cdc.outbox.orders"


def _emit(conn: psycopg.Connection[object], payload: object, topic: str = "orders", *, transactional: bool = True) -> None:
    conn.execute(
        "SELECT pg_logical_emit_message(%s, %s, %s)",
        (transactional, f"cdc.outbox.{topic}", payload if isinstance(payload, str) else orjson.dumps(payload).decode()),
    )


def _position(record: Record) -> tuple[int, int]:
    """``(commit lsn, sequence)`` of an event or of a row change."""
    if record.header("id") is not None:
        return int(record.header("lsn") or b""), int(record.header("sequence") or b"")
    source = orjson.loads(record.value or b"")["source"]
    return int(source["lsn"]), int(source["sequence"])


def test_events_of_committed_transactions_only_in_order_with_their_row_changes(
    reference_db: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = settings_for(reference_db, tmp_path, outbox_key_field="order")
    Capture(settings, once=True).run()
    with psycopg.connect(reference_db) as conn:
        with conn.transaction():  # rows and events interleaved in one transaction
            conn.execute("INSERT INTO categories (id, name) VALUES (1, 'a')")
            _emit(conn, {"order": "o1", "n": 1})
            conn.execute("UPDATE categories SET name = 'b' WHERE id = 1")
            _emit(conn, {"order": "o2", "n": 2})
        with conn.transaction():  # rolled back: neither its row nor its event
            conn.execute("INSERT INTO categories (id, name) VALUES (2, 'x')")
            _emit(conn, {"order": "o1", "n": 99})
            raise psycopg.Rollback()
        with conn.transaction():  # an event inside a savepoint rolled back is gone, the one after it stays
            with conn.transaction():  # a savepoint
                _emit(conn, {"order": "o1", "n": 98})
                raise psycopg.Rollback()  # to the savepoint
            _emit(conn, {"order": "o1", "n": 3})
        with conn.transaction():  # bad input beside good: dead letters, the rest of the transaction stays
            _emit(conn, "{not json")
            _emit(conn, {"n": 97})  # no key field
            _emit(conn, {"order": "o3", "n": 4}, topic="bad topic")
            _emit(conn, {"order": "o2", "n": 5})
            conn.execute("INSERT INTO categories (id, name) VALUES (3, 'c')")
        with conn.transaction():
            _emit(conn, {"order": "o9", "n": 96}, transactional=False)  # refused: could still roll back
    with caplog.at_level(logging.WARNING, logger="cdc.capture"):
        Capture(settings, once=True).run()
    events = read_topic(tmp_path, TOPIC)
    payloads = sorted(events, key=_position)
    assert [orjson.loads(r.value or b"")["n"] for r in payloads] == [1, 2, 3, 5]
    by_key: dict[bytes | None, list[int]] = {}
    for record in events:  # partition order is offset order: one aggregate's events in commit order
        by_key.setdefault(record.key, []).append(orjson.loads(record.value or b"")["n"])
    assert by_key == {b"o1": [1, 3], b"o2": [2, 5]}
    assert len({r.partition for r in events if r.key == b"o1"}) == 1
    ids = [(r.header("id") or b"").decode() for r in payloads]
    assert len(set(ids)) == 4 and all(i.startswith(f"{_position(r)[0]:016X}-") for i, r in zip(ids, payloads, strict=True))
    assert ids[0].endswith("-0") and ids[1].endswith("-1") and ids[3].endswith("-3")  # counted per transaction
    # one order over the topics: the first transaction's insert, event, update, event
    rows = [r for r in read_topic(tmp_path, "cdc.public.categories") if r.value is not None]
    first = sorted([*rows, *events], key=_position)[:4]
    assert [r.topic for r in first] == ["cdc.public.categories", TOPIC, "cdc.public.categories", TOPIC]
    assert len({_position(r)[0] for r in first}) == 1
    assert sorted(orjson.loads(r.value or b"")["after"]["id"] for r in rows) == [1, 1, 3]
    letters = [orjson.loads(r.value or b"") for r in read_topic(tmp_path, "cdc.__dead_letters")]
    assert [(d["target"], d["error"].split(" (")[0]) for d in letters] == [
        (TOPIC, "the payload is not JSON"),
        (TOPIC, "the payload has no key field 'order'"),
        ("cdc.outbox.bad topic", "'cdc.outbox.bad topic' is not a topic name Kafka can hold"),
    ]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len([w for w in warnings if "is not published" in w]) == 3
    assert len([w for w in warnings if "refused the non-transactional outbox message" in w]) == 1
    with LogStore.open(tmp_path / "log") as log:  # the views take their tables from the schema topic only
        ends = {"0": log.end_offset(TopicPartition("cdc.__schemas", 0))}
    assert {schema.topic for schema in read_schemas(str(tmp_path / "log"), "cdc.__schemas", ends).values()} == {
        f"cdc.public.{table}" for table in ("categories", "customers", "products", "orders", "order_items")
    }
    Capture(settings, once=True).run()  # a run with nothing new writes no event again
    assert len(read_topic(tmp_path, TOPIC)) == 4
    tail = run_cdc(reference_db, tmp_path, "log", "tail", TOPIC, "--from-beginning")
    assert tail.returncode == 0, tail.stderr
    shown = [orjson.loads(line) for line in tail.stdout.splitlines()]
    assert sorted(line["value"]["n"] for line in shown) == [1, 2, 3, 5] and all("id" in line["headers"] for line in shown)


def test_kill_9_during_a_burst_publishes_every_committed_event_once(reference_db: str, tmp_path: Path) -> None:
    """Each transaction of the burst emits two messages and inserts two rows of an outbox table (deleting
    them at once every other time); capture is killed three times at seeded moments. Both forms: every
    committed event once, in order per aggregate, none of a transaction rolled back."""
    views = tmp_path / "views.toml"
    views.write_text('[outbox."public.outbox"]\n')
    execute(
        reference_db,
        "CREATE TABLE outbox (id uuid PRIMARY KEY, aggregatetype text, aggregateid text, type text, payload jsonb)",
        "ALTER PUBLICATION cdc_publication ADD TABLE outbox",
    )
    settings = {"OUTBOX_KEY_FIELD": "agg", "VIEWS_FILE": str(views)}
    assert run_cdc(reference_db, tmp_path, "capture", "--once", **settings).returncode == 0
    committed: list[tuple[int, int]] = []  # (aggregate, n) of every committed event of each form
    committed_rows: list[str] = []  # the ids of the committed outbox rows
    stop = threading.Event()
    rng = random.Random(55)
    insert = "INSERT INTO outbox VALUES (%s, 'Order', %s, 'Counted', %s)"

    def burst() -> None:
        counters = dict.fromkeys(range(8), 0)
        with psycopg.connect(reference_db) as conn:
            while not stop.is_set():
                aggregate = rng.randrange(8)
                rollback = rng.random() < 0.2
                n = counters[aggregate] + 1
                ids = [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(2)]
                for value, ident in zip((n, n + 1), ids, strict=True):
                    payload = orjson.dumps({"agg": aggregate, "n": value}).decode()
                    _emit(conn, payload)
                    conn.execute(insert, (ident, str(aggregate), payload))
                if n % 2:
                    conn.execute("DELETE FROM outbox WHERE id = ANY(%s::uuid[])", (ids,))
                if rollback:
                    conn.rollback()
                    continue
                conn.commit()
                counters[aggregate] = n + 1
                committed.extend([(aggregate, n), (aggregate, n + 1)])
                committed_rows.extend(ids)

    env = _environment(reference_db, tmp_path, settings)
    writer = threading.Thread(target=burst)
    writer.start()
    try:
        for _ in range(3):
            process = subprocess.Popen([str(CDC), "capture"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            before = len(read_topic(tmp_path, TOPIC))
            wait_for(lambda: len(read_topic(tmp_path, TOPIC)) > before + 20, what="capture progress")
            threading.Event().wait(rng.uniform(0.0, 0.3))  # a seeded moment, not a synchronisation
            process.send_signal(signal.SIGKILL)
            process.wait(30)
    finally:
        stop.set()
        writer.join(30)
    assert run_cdc(reference_db, tmp_path, "capture", "--once", **settings).returncode == 0
    expected: dict[int, list[int]] = {}
    for aggregate, n in committed:
        expected.setdefault(aggregate, []).append(n)
    for topic in (TOPIC, "cdc.outbox.Order"):  # the messages, then the outbox table's rows
        got: dict[int, list[int]] = {}
        ids = []
        for record in read_topic(tmp_path, topic):  # partition order = offset order
            value = orjson.loads(record.value or b"")
            got.setdefault(value["agg"], []).append(value["n"])
            ids.append((record.header("id") or b"").decode())
            assert record.key == str(value["agg"]).encode()
        assert got == expected, topic  # every committed event once, in order per aggregate, none rolled back
        assert len(set(ids)) == len(ids) == len(committed)
    assert sorted(ids) == sorted(committed_rows)  # the table form's ids are its rows' ids
    assert read_topic(tmp_path, "cdc.__dead_letters") == []


def _environment(url: str, data_dir: Path, settings: dict[str, str]) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("CDC_")}
    env.update(CDC_DATABASE_URL=url, CDC_DATA_DIR=str(data_dir))
    env.update({f"CDC_{name}": value for name, value in settings.items()})
    return env


def test_a_large_transaction_streamed_before_its_commit_never_publishes_a_rolled_back_savepoints_events(
    reference_db: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Past ``logical_decoding_work_mem`` the server streams the transaction in blocks. A subtransaction
    rolled back after its messages were streamed is aborted in the stream, but pgoutput marks those
    messages with the top transaction's id: the messages before the rollback go to the dead letters (none
    of the rolled-back ones is published), the later ones are published, in order, with the rows."""
    settings = settings_for(reference_db, tmp_path, outbox_key_field="n")
    Capture(settings, once=True).run()
    emit = "SELECT count(pg_logical_emit_message(true, 'cdc.outbox.orders', json_build_object('n', g)::text)) "
    with psycopg.connect(reference_db, autocommit=True) as admin:
        admin.execute("ALTER SYSTEM SET logical_decoding_work_mem = '64kB'")
        admin.execute("SELECT pg_reload_conf()")
        try:
            with psycopg.connect(reference_db) as conn:
                conn.execute(emit + "FROM generate_series(1, 4000) g")
                with conn.transaction():
                    conn.execute(emit + "FROM generate_series(-5000, -1) g")  # streamed, then rolled back
                    raise psycopg.Rollback()
                conn.execute("INSERT INTO categories (id, name) VALUES (1, 'a')")
                conn.execute(emit + "FROM generate_series(4001, 30000) g")
            with caplog.at_level(logging.WARNING, logger="cdc.capture"):
                stats = Capture(settings, once=True, tuning=Tuning(memory_limit=64 << 10)).run()
        finally:
            admin.execute("ALTER SYSTEM RESET logical_decoding_work_mem")
            admin.execute("SELECT pg_reload_conf()")
    assert stats.transactions == 1
    events = sorted(read_topic(tmp_path, TOPIC), key=_position)
    assert [orjson.loads(r.value or b"")["n"] for r in events] == list(range(4001, 30001))
    (row,) = [r for r in read_topic(tmp_path, "cdc.public.categories") if r.value is not None]
    assert _position(row)[0] == _position(events[0])[0] and _position(row)[1] < _position(events[0])[1]
    letters = [orjson.loads(r.value or b"") for r in read_topic(tmp_path, "cdc.__dead_letters")]
    unsure = sorted(orjson.loads(d["value"])["n"] for d in letters)
    assert unsure[-4000:] == list(range(1, 4001)) and all(n < 0 for n in unsure[:-4000])  # none of them published
    assert {d["error"].split(":")[0] for d in letters} == {
        "emitted before a subtransaction rolled back in a transaction PostgreSQL streamed before its commit"
    }
    assert len([r for r in caplog.records if "rolled back a subtransaction" in r.getMessage()]) == 1


def _peak_rss_of_capture(url: str, data_dir: Path, settings: dict[str, str]) -> int:
    """Bytes of the highest resident set of one ``cdc capture --once`` process (``VmHWM``, as the kernel
    reports it to its parent when it exits)."""
    process = subprocess.Popen(
        [str(CDC), "capture", "--once"], env=_environment(url, data_dir, settings), stdout=subprocess.DEVNULL
    )
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    assert process.returncode == 0
    return usage.ru_maxrss * 1024


def test_a_transaction_of_100k_events_is_streamed_in_bounded_memory(reference_db: str, tmp_path: Path) -> None:
    """100,000 events of one transaction, streamed by the server before its commit: all published once, while
    capture's peak memory is that of a transaction of 30,000 (past its spill buffer, 8 MB), not that plus
    the 70,000 events more it wrote: they waited in its spill file, not in memory."""
    settings = {"OUTBOX_KEY_FIELD": "n"}
    emit = (
        "SELECT count(pg_logical_emit_message(true, 'cdc.outbox.orders', "
        "json_build_object('n', g, 'pad', repeat('x', 300))::text)) FROM generate_series(%s::int, %s::int) g"
    )
    assert run_cdc(reference_db, tmp_path, "capture", "--once", **settings).returncode == 0
    with psycopg.connect(reference_db, autocommit=True) as admin:
        admin.execute("ALTER SYSTEM SET logical_decoding_work_mem = '64kB'")
        admin.execute("SELECT pg_reload_conf()")
        try:
            with psycopg.connect(reference_db) as conn:
                conn.execute(emit, (-30_000, -1))
                conn.commit()
            small = _peak_rss_of_capture(reference_db, tmp_path, settings)
            with psycopg.connect(reference_db) as conn:
                conn.execute(emit, (1, 100_000))
                conn.commit()
            large = _peak_rss_of_capture(reference_db, tmp_path, settings)
        finally:
            admin.execute("ALTER SYSTEM RESET logical_decoding_work_mem")
            admin.execute("SELECT pg_reload_conf()")
    events = read_topic(tmp_path, TOPIC)
    published = {orjson.loads(r.value or b"")["n"]: len(r.value or b"") for r in events}
    assert len(events) == 130_000 and sorted(published) == [*range(-30_000, 0), *range(1, 100_001)]
    more = sum(size for n, size in published.items() if n > 30_000)  # the payloads of the 70,000 events more
    assert more > 20_000_000
    assert large - small < more / 4, f"peak RSS {large >> 20} MB for 100k events, {small >> 20} MB for 30k"


def test_an_outbox_table_is_routed_as_debezium_does_and_never_copied(reference_db: str, tmp_path: Path) -> None:
    views = tmp_path / "views.toml"
    views.write_text('[outbox."public.outbox"]\naggregateid = "aggregate_id"\n')
    execute(
        reference_db,
        "CREATE TABLE outbox (id uuid PRIMARY KEY, aggregatetype text, aggregate_id text, type text, payload jsonb)",
        "ALTER PUBLICATION cdc_publication ADD TABLE outbox",
        "INSERT INTO outbox VALUES (gen_random_uuid(), 'Order', 'old', 'Before', '{}')",  # before capture: no event
    )
    settings = settings_for(reference_db, tmp_path, views_file=str(views))
    Capture(settings, once=True).run()
    insert = "INSERT INTO outbox VALUES (%s, 'Order', %s, %s, %s) RETURNING id"
    ids = [str(uuid.UUID(int=n)) for n in range(1, 7)]
    with psycopg.connect(reference_db) as conn:
        with conn.transaction():  # the business row and its event; the outbox row deleted at once
            conn.execute("INSERT INTO categories (id, name) VALUES (7, 'c')")
            conn.execute(insert, (ids[0], "7", "OrderPlaced", '{"order": 7}'))
            conn.execute("DELETE FROM outbox WHERE id = %s", (ids[0],))
        with conn.transaction():
            conn.execute(insert, (ids[1], "8", "OrderPlaced", '{"order": 8}'))
            raise psycopg.Rollback()
        with conn.transaction():
            with conn.transaction():
                conn.execute(insert, (ids[2], "7", "OrderPaid", '{"order": 7, "paid": true}'))
                raise psycopg.Rollback()  # to the savepoint
            conn.execute(insert, (ids[3], "7", "OrderShipped", '{"order": 7, "shipped": true}'))
        with conn.transaction():
            conn.execute("UPDATE outbox SET type = 'Changed'")  # updates and deletes are not events
            conn.execute("DELETE FROM outbox WHERE aggregate_id = 'old'")
            conn.execute(insert, (ids[4], "9", "OrderPlaced", None))  # no payload: a dead letter
            conn.execute(insert, (ids[5], "9", "OrderPlaced", '{"order": 9}'))
    Capture(settings, once=True).run()
    events = sorted(read_topic(tmp_path, "cdc.outbox.Order"), key=_position)
    # read as a consumer of Debezium's Outbox Event Router reads: key = aggregate id, value = payload, id and type headers
    seen = [
        (r.key.decode() if r.key else None, orjson.loads(r.value or b""), dict(r.headers)["id"].decode(), dict(r.headers)["type"])
        for r in events
    ]
    assert seen == [
        ("7", {"order": 7}, ids[0], b"OrderPlaced"),
        ("7", {"order": 7, "shipped": True}, ids[3], b"OrderShipped"),
        ("9", {"order": 9}, ids[5], b"OrderPlaced"),
    ]
    (row,) = [r for r in read_topic(tmp_path, "cdc.public.categories") if r.value is not None]
    assert _position(row)[0] == _position(events[0])[0] and _position(row)[1] < _position(events[0])[1]
    (letter,) = [orjson.loads(r.value or b"") for r in read_topic(tmp_path, "cdc.__dead_letters")]
    assert (letter["target"], letter["id"], letter["error"]) == ("cdc.outbox.Order", ids[4], "the payload is null")
    with LogStore.open(tmp_path / "log") as log:  # routed, not copied: no topic, no schema record of the table
        assert "cdc.public.outbox" not in log.topics()
    assert b"outbox" not in b"".join(r.value or b"" for r in read_topic(tmp_path, "cdc.__schemas"))
    # `cdc snapshot` cannot read an outbox table again: one clear error line, nothing sent to capture
    refused = run_cdc(reference_db, tmp_path, "snapshot", "public.outbox", views_file=str(views))
    assert refused.returncode == 2 and refused.stdout == "", refused.stdout
    assert refused.stderr.strip().splitlines() == [
        f"error: public.outbox is an outbox table ({views} declares it): its inserts are routed as events to the "
        "cdc.outbox.<aggregatetype> topics, not captured, so there is nothing of it to read again"
    ]
    with psycopg.connect(reference_db) as conn:  # what the slot holds for capture: no request among it
        pending = conn.execute(
            "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, 'proto_version', '1', "
            "'publication_names', %s, 'messages', 'true')",
            (settings.slot, settings.publication),
        ).fetchall()
    assert not any(b"cdc.snapshot" in bytes(data) for (data,) in pending)
    views.write_text('[outbox."public.outbox"]\npayload = "body"\n')  # a column the table lacks: one clear error
    checked = run_cdc(reference_db, tmp_path, "setup", "--check-only", views_file=str(views))
    assert checked.returncode != 0 and "payload = 'body': no such published column of public.outbox" in checked.stderr
