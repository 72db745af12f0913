"""Outbox events (messages and an outbox table's rows) captured into a real Kafka broker, read by a plain
Kafka consumer with a group and ``isolation.level=read_committed``: each committed event once, none of a
transaction rolled back."""

from __future__ import annotations

import uuid
from pathlib import Path

import orjson
import psycopg
import pytest

from cdc.run.coordinator import Capture
from tests.cdc.helpers import execute, run_cdc, settings_for

pytestmark = [pytest.mark.pg, pytest.mark.kafka]


def test_a_kafka_consumer_reads_each_committed_event_once(
    reference_db: str, tmp_path: Path, kafka_bootstrap: str, kafka_prefix: str
) -> None:
    from confluent_kafka import Consumer

    views = tmp_path / "views.toml"
    views.write_text('[outbox."public.outbox"]\n')
    execute(
        reference_db,
        "CREATE TABLE outbox (id uuid PRIMARY KEY, aggregatetype text, aggregateid text, type text, payload jsonb)",
        "ALTER PUBLICATION cdc_publication ADD TABLE outbox",
    )
    settings = settings_for(
        reference_db,
        tmp_path,
        log=f"kafka://{kafka_bootstrap}",
        topic_prefix=kafka_prefix,
        outbox_key_field="order",
        views_file=str(views),
    )
    topic = f"{kafka_prefix}.outbox.orders"
    table_topic = f"{kafka_prefix}.outbox.Order"  # the outbox table's rows, routed by their aggregate type
    Capture(settings, once=True).run()
    with psycopg.connect(reference_db) as conn:
        for n in range(1, 61):
            payload = orjson.dumps({"order": f"o{n % 4}", "n": n}).decode()
            conn.execute("INSERT INTO categories (id, name) VALUES (%s, 'c')", (n,))
            conn.execute("SELECT pg_logical_emit_message(true, %s, %s)", (topic, payload))
            conn.execute(
                "INSERT INTO outbox VALUES (%s, 'Order', %s, 'Placed', %s)", (str(uuid.UUID(int=n)), f"o{n % 4}", payload)
            )
            conn.execute("DELETE FROM outbox")  # the application keeps its outbox empty
            conn.rollback() if n % 5 == 0 else conn.commit()
    Capture(settings, once=True).run()
    Capture(settings, once=True).run()  # nothing new: nothing written twice
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": "billing",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic, table_topic])
    got: dict[str, dict[bytes, list[int]]] = {topic: {}, table_topic: {}}
    ids: dict[str, list[bytes]] = {topic: [], table_topic: []}
    try:
        expected = 2 * (60 - 12)
        for _ in range(200):  # a poll returns within its timeout; the broker assigns partitions on the first ones
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                got[message.topic()].setdefault(message.key(), []).append(orjson.loads(message.value())["n"])
                ids[message.topic()].append(dict(message.headers() or [])["id"])
            if sum(len(values) for by_key in got.values() for values in by_key.values()) >= expected:
                break
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    want: dict[bytes, list[int]] = {}
    for n in range(1, 61):
        if n % 5:
            want.setdefault(f"o{n % 4}".encode(), []).append(n)
    assert got == {topic: want, table_topic: want}  # both forms: per aggregate in commit order, none rolled back
    assert len(set(ids[topic])) == len(ids[topic]) == 48
    assert sorted(ids[table_topic]) == sorted(str(uuid.UUID(int=n)).encode() for n in range(1, 61) if n % 5)
    # `cdc log consume` is a member of a Kafka consumer group of its own: all once, then nothing again
    where = {"log": f"kafka://{kafka_bootstrap}", "topic_prefix": kafka_prefix}
    first = run_cdc(reference_db, tmp_path, "log", "consume", "--group", "svc", topic, **where)
    again = run_cdc(reference_db, tmp_path, "log", "consume", "--group", "svc", topic, **where)
    assert first.returncode == again.returncode == 0, first.stderr + again.stderr
    lines = [orjson.loads(line) for line in first.stdout.splitlines()]
    assert sorted(line["value"]["n"] for line in lines) == sorted(n for values in want.values() for n in values)
    assert again.stdout == ""
    # `cdc log groups` lists Kafka's groups that committed offsets of this log's topics, with their lag
    late = run_cdc(reference_db, tmp_path, "log", "consume", "--group", "late", "--max-records", "5", topic, **where)
    assert late.returncode == 0 and len(late.stdout.splitlines()) == 5, late.stderr
    listed = run_cdc(reference_db, tmp_path, "log", "groups", "--json", **where)
    assert listed.returncode == 0, listed.stderr
    rows = [orjson.loads(line) for line in listed.stdout.splitlines()]
    topics_of: dict[str, set[str]] = {}
    for row in rows:
        topics_of.setdefault(row["group"], set()).add(row["topic"])
        assert row["lag"] == max(0, row["end"] - row["committed"]) and row["end"] > 0
    assert topics_of == {"billing": {topic, table_topic}, "svc": {topic}, "late": {topic}}  # no other log's groups
    assert all(row["lag"] == 0 for row in rows if row["group"] != "late")  # read to the end and committed
    assert sum(row["lag"] for row in rows if row["group"] == "late") > 0
