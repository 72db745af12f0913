"""Capture into a real Kafka broker: the same records as the embedded log, whole groups, exactly once."""

from __future__ import annotations

import os
import random
import re
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
import pytest

from cdc.config.log_backend import open_log
from cdc.config.settings import Settings
from cdc.run.coordinator import Capture
from event_format import fold_after
from log_store import Record
from tests.cdc.helpers import execute, read_log_topic, replay, settings_for, source_table
from tests.faults.harness import (
    Running,
    cdc_env,
    compare_log,
    poll,
    run_cdc,
    seed,
    slot_confirmed,
    transaction_differences,
    wal_lsn,
    watermark,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.pg, pytest.mark.kafka]

SEED = int(os.environ.get("FAULTS_SEED") or random.SystemRandom().randrange(1 << 32))

#: the envelope's own ``ts_ms`` (when capture wrote it) ends every value; the rest is the source's
_WRITTEN_AT = re.compile(rb',"ts_ms":\d+}$')
#: a snapshot read's position and time are its own slot's consistent point and start
_SNAPSHOT_POINT = re.compile(rb'"lsn":\d+,"txId":\d+,"ts_ms":\d+,"snapshot":"(true|last)"')


def _as_written(records: list[Record], *, folded: bool = False) -> list[tuple[object, ...]]:
    """Each record but for its offset (Kafka's commit markers take offsets), the moment capture wrote it and,
    for a snapshot read, the point of the slot that capture made (each capture here has a slot of its own).

    ``folded``: a partial row (header ``unchanged``) as the embedded log's compaction folds it onto the key's
    previous row, which is what capture writes into Kafka (whole rows); such a value is compared parsed."""
    out: list[tuple[object, ...]] = []
    rows: dict[bytes | None, bytes] = {}
    for r in records:
        value = None if r.value is None else _WRITTEN_AT.sub(b"}", r.value)
        read = value is not None and _SNAPSHOT_POINT.search(value) is not None
        if read:
            value = _SNAPSHOT_POINT.sub(rb'"snapshot":"\1"', value)  # type: ignore[arg-type]
        headers: object = r.headers
        unchanged = r.header("unchanged")
        if folded and unchanged is not None and value is not None:
            value = fold_after(rows[r.key], value, orjson.loads(unchanged))
            headers = ()
        if value is not None and orjson.loads(value)["op"] in ("c", "r", "u"):
            rows[r.key] = value
        out.append((r.partition, r.key, value, headers, None if read else r.timestamp_ms))
    return out


def _same_records(kafka: list[tuple[object, ...]], embedded: list[tuple[object, ...]]) -> bool:
    """Equal record for record: the values byte for byte, or equal as JSON where the embedded log's was folded."""
    if len(kafka) != len(embedded):
        return False
    return all(
        k == e or (k[:2] == e[:2] and k[3:] == e[3:] and orjson.loads(k[2]) == orjson.loads(e[2]))  # type: ignore[arg-type]
        for k, e in zip(kafka, embedded, strict=True)
    )


def _kafka(url: str, data_dir: Path, bootstrap: str, prefix: str, **extra: object) -> Settings:
    return settings_for(url, data_dir, log=f"kafka://{bootstrap}", topic_prefix=prefix, **extra)


def _captured_category_names(spark: SparkSession, kafka: Settings) -> list[str]:
    """Capture once into Kafka, then read the categories topic up to its watermark with Spark's Kafka
    source (so with the same client settings as capture): the names of the rows read."""
    from cdc.config.view_arguments import location_from_settings
    from derived_views.source.log_source import read_watermark
    from derived_views.source.pending import read_log

    Capture(kafka, once=True).run()
    location = location_from_settings(kafka)
    topic = f"{kafka.topic_prefix}.public.categories"
    watermark = read_watermark(location, [topic])
    assert watermark is not None
    rows = read_log(spark, location, [topic], {}, watermark.offsets).collect()
    return [orjson.loads(row["value"])["after"]["name"] for row in rows]


def test_kafka_holds_the_embedded_logs_records_byte_for_byte(
    reference_db: str, tmp_path: Path, kafka_bootstrap: str, kafka_prefix: str
) -> None:
    embedded = settings_for(reference_db, tmp_path / "embedded", topic_prefix=kafka_prefix, slot="embedded_slot")
    kafka = _kafka(reference_db, tmp_path / "kafka", kafka_bootstrap, kafka_prefix, slot="kafka_slot")
    execute(reference_db, "INSERT INTO categories (name) SELECT 'c' || g FROM generate_series(1, 300) g")
    for settings in (embedded, kafka):
        Capture(settings, once=True).run()
    big = "(SELECT string_agg(md5(g::text || 'x'), '') FROM generate_series(1, 3200) g)"  # ~100 kB, stored out of line
    execute(
        reference_db,
        "INSERT INTO categories (name) SELECT 'n' || g FROM generate_series(1, 200) g",
        "UPDATE categories SET name = name || '!' WHERE id <= 40",
        "DELETE FROM categories WHERE id BETWEEN 41 AND 60",
        f"INSERT INTO products (category_id, name, description, price, attributes, tags) "
        f"VALUES (1, 'p', {big}, 19.90, '{{\"w\": 1.5}}', ARRAY['a','b c'])",
        "UPDATE products SET price = 21.00 WHERE id = 1",  # the TOAST description is left out: a partial row
        "UPDATE categories SET id = 1000 WHERE id = 2",  # a key change: delete, tombstone, create
        "TRUNCATE order_items",
    )
    workload_end = int(wal_lsn(reference_db))
    for settings in (embedded, kafka):
        Capture(settings, once=True).run()

    with open_log(embedded) as local, open_log(kafka) as remote:
        topics = local.topics()
        assert remote.topics() == topics
        data_topics = [t for t in topics if ".__" not in t]
        assert len(data_topics) == 5
        for topic in data_topics:
            assert remote.partitions(topic) == local.partitions(topic) == 3
            expected = _as_written(read_log_topic(local, topic), folded=True)
            assert _same_records(_as_written(read_log_topic(remote, topic)), expected), topic
        counts = {t.rsplit(".", 1)[1]: len(read_log_topic(remote, t)) for t in data_topics}
        assert counts["categories"] == 300 + 200 + 40 + 2 * 20 + 3 and counts["products"] == 2
        assert counts["order_items"] == 3  # a truncate marker on each partition
        # the update that left the TOAST description out: a partial row in the embedded log, whole in Kafka
        partial = [r for r in read_log_topic(local, f"{kafka_prefix}.public.products") if r.headers]
        assert partial and partial[0].header("unchanged") == b'["description"]'
        update = read_log_topic(remote, f"{kafka_prefix}.public.products")[-1]
        after = orjson.loads(update.value or b"")["after"]
        assert not update.headers and after["price"] == "21.00" and len(after["description"]) == 3200 * 32
        schemas = read_log_topic(remote, f"{kafka_prefix}.__schemas")
        assert sorted(r.key for r in schemas) == sorted(r.key for r in read_log_topic(local, f"{kafka_prefix}.__schemas"))
        # each capture drains to the WAL's end when it starts: the same records, and watermarks that hold them all
        # (the later capture's may be further on, when the server wrote WAL of its own in between)
        local_at, remote_at = (int(log.latest_watermark().position, 16) for log in (local, remote))  # type: ignore[union-attr]
        assert workload_end - 1 <= local_at <= remote_at, (workload_end, local_at, remote_at)
    assert replay(kafka, f"{kafka_prefix}.public.categories") == source_table(reference_db, "categories")

    # the log commands read Kafka's topics
    env = cdc_env(reference_db, tmp_path / "kafka", log=kafka.log, topic_prefix=kafka_prefix)
    topic = f"{kafka_prefix}.public.categories"
    listed = run_cdc(env, "log", "topics")
    assert listed.returncode == 0 and listed.stdout.split() == topics  # not the watermark topic: as the embedded log
    described = run_cdc(env, "log", "describe", topic)
    shown = " ".join(described.stdout.split())  # the table's title wraps
    assert described.returncode == 0 and "(3 partition(s), compacted)" in shown and "latest watermark: #" in shown
    tail = run_cdc(env, "log", "tail", topic, "--from-beginning", "--max-records", "5")
    assert tail.returncode == 0 and [orjson.loads(line)["topic"] for line in tail.stdout.splitlines()] == [topic] * 5
    compact = run_cdc(env, "log", "compact")
    assert compact.returncode == 2 and "compacts its topics itself" in compact.stderr

    # an update leaving the description out, alone in its group: its value is read back from Kafka
    execute(reference_db, "UPDATE products SET price = 22.00 WHERE id = 1")
    capture = Capture(kafka, once=True)
    capture.run()
    assert capture.builder is not None and capture.builder.rows_read_back == {"public.products"}
    # under REPLICA IDENTITY FULL the server sends the whole old row: nothing is read back
    execute(reference_db, "ALTER TABLE products REPLICA IDENTITY FULL", "UPDATE products SET price = 23.00 WHERE id = 1")
    capture = Capture(kafka, once=True)
    capture.run()
    assert capture.builder is not None and not capture.builder.rows_read_back
    with open_log(kafka) as remote:
        updates = read_log_topic(remote, f"{kafka_prefix}.public.products")[-2:]
    for update, price in zip(updates, ("22.00", "23.00"), strict=True):
        after = orjson.loads(update.value or b"")["after"]
        assert not update.headers and after["price"] == price and len(after["description"]) == 3200 * 32


def test_kill_9_of_capture_into_kafka_under_load_loses_and_doubles_nothing(
    reference_db: str, tmp_path: Path, kafka_bootstrap: str, kafka_prefix: str
) -> None:
    """``cdc capture`` into Kafka, its tables read, is killed 4 times at random moments (start-up, the
    writer's fencing and abort of the open transaction, the slot's resend, streaming) under a write load with large
    transactions; then the load stops and ``cdc capture --once`` drains. Replaying the topics from offset 0
    equals the source, and every transaction of the load is there exactly once and whole."""
    kafka = _kafka(reference_db, tmp_path, kafka_bootstrap, kafka_prefix)
    env = cdc_env(reference_db, tmp_path, log=kafka.log, topic_prefix=kafka_prefix)
    rng = random.Random(SEED)
    seed(reference_db, products=500, orders=150)
    # the tables' first reads before the load: a read takes in the changes its snapshot sees, so only
    # the transactions after it are each in the log whole (the faults suite kills capture mid-read)
    first = run_cdc(env, "capture", "--once")
    assert first.returncode == 0, first.stderr
    running = Running()
    try:
        load = running.load(reference_db, SEED, big_every=120, pace=0.03)
        moments = []
        for kill in range(4):
            before = watermark(kafka) or 0
            capture = running.cdc(env, ["capture"], tmp_path / f"capture-{kill}.err")
            if kill % 2:
                poll(lambda: (watermark(kafka) or 0) > before or not capture.running(), 120, "capture progress")
            moment = rng.uniform(0.0, 2.0)
            try:
                capture.process.wait(moment)
            except subprocess.TimeoutExpired:
                pass
            assert capture.kill9(), f"seed {SEED}: capture {kill} exited by itself: {capture.stderr()}"
            moments.append(f"{moment:.2f}s{'+' if (watermark(kafka) or 0) > before else ''}")
        load.finish()
    finally:
        running.close()
    drained = run_cdc(env, "capture", "--once")
    context = f"seed {SEED}, kill moments {' '.join(moments)}; {load.line()}"
    assert drained.returncode == 0, f"{context}: cdc capture --once exited {drained.returncode}: {drained.stderr}"
    rows = compare_log(reference_db, kafka)
    assert rows.compared > 1000 and not rows.differences, f"{context}; {rows.line()}: {rows.differences[:5]}"
    transactions, wrong = transaction_differences(kafka, load)
    assert transactions > 50 and load.big_transactions >= 1, context
    assert not wrong, f"{context}; transactions compared {transactions}: {wrong[:5]}"


def test_setup_checks_the_brokers_and_names_tables_whose_toast_values_kafka_cannot_fold(
    reference_db: str, tmp_path: Path, kafka_bootstrap: str, kafka_prefix: str
) -> None:
    env = cdc_env(reference_db, tmp_path, log=f"kafka://{kafka_bootstrap}", topic_prefix=kafka_prefix)

    def warned() -> dict[str, str]:
        checked = run_cdc(env, "setup", "--check-only")
        assert checked.returncode == 0, checked.stderr
        assert "ok   kafka log" in checked.stdout.splitlines()
        return {
            line.split()[2]: line
            for line in checked.stdout.splitlines()
            if line.endswith("(it writes whole old rows to the WAL)")
        }

    before = warned()
    assert "public.products" in before and "description" in before["public.products"]
    assert "ALTER TABLE public.products REPLICA IDENTITY FULL" in before["public.products"]
    execute(reference_db, "ALTER TABLE products REPLICA IDENTITY FULL")
    assert set(before) - set(warned()) == {"public.products"}
    unreachable = run_cdc(
        cdc_env(reference_db, tmp_path, log="kafka://127.0.0.1:9", topic_prefix=kafka_prefix), "setup", "--check-only"
    )
    assert unreachable.returncode != 0
    assert "FAIL kafka log" in unreachable.stdout and "127.0.0.1:9" in unreachable.stderr


def test_capture_waits_out_a_broker_that_is_down_and_loses_nothing(reference_db: str, tmp_path: Path, kafka_prefix: str) -> None:
    """The broker is killed while capture streams: capture says so once per attempt, confirms nothing more to
    the source, ``cdc lag`` names the log as unreadable; once the broker is back the changes arrive, once."""
    from local_servers.kafka import LocalKafka

    with LocalKafka(root=tmp_path / "broker") as broker:
        kafka = _kafka(reference_db, tmp_path, broker.bootstrap, kafka_prefix)
        env = cdc_env(reference_db, tmp_path, log=kafka.log, topic_prefix=kafka_prefix, kafka_timeout_ms="2000")
        execute(reference_db, "INSERT INTO categories (name) SELECT 'c' || g FROM generate_series(1, 50) g")
        running = Running()
        try:
            capture = running.cdc(env, ["capture"], tmp_path / "capture.err")
            poll(lambda: (watermark(kafka) or 0) > 0, 120, "the snapshot in Kafka")
            broker.kill()
            execute(
                reference_db,
                "INSERT INTO categories (name) SELECT 'n' || g FROM generate_series(1, 30) g",
                "UPDATE categories SET name = name || '!' WHERE id <= 10",
                "DELETE FROM categories WHERE id > 75",
            )
            poll(
                lambda: "capture starts again in" in capture.stderr() or not capture.running(),
                120,
                "a first attempt while the broker is down",
            )
            # a group Kafka committed just before the kill (a heartbeat, when other writes move the WAL) may
            # have been confirmed since the watermark was last read; from the first failed attempt on,
            # nothing more may be
            confirmed = slot_confirmed(reference_db)
            poll(
                lambda: capture.stderr().count("capture starts again in") >= 2 or not capture.running(),
                120,
                "two attempts while the broker is down",
            )
            assert capture.running(), capture.stderr()
            lag = run_cdc(env, "lag", "--json")
            assert lag.returncode == 1 and "the log cannot be read: Kafka at" in lag.stdout
            assert orjson.loads(lag.stdout)["source"]["wal_bytes_behind"] > 0
            assert slot_confirmed(reference_db) == confirmed, "the slot was confirmed while the broker was down"
            broker.start()
            poll(
                lambda: replay(kafka, f"{kafka_prefix}.public.categories") == source_table(reference_db, "categories"),
                120,
                "the changes in Kafka once the broker is back",
            )
            assert capture.terminate() == 0, capture.stderr()
        finally:
            running.close()


_PLAIN_LOGIN = "org.apache.kafka.common.security.plain.PlainLoginModule"
_SASL_USERS = 'username="broker" password="b-secret" user_broker="b-secret" user_cdc="c-secret";'


@pytest.mark.spark
def test_sasl_credentials_reach_capture_and_spark_and_a_wrong_password_is_one_clear_error(
    reference_db: str, tmp_path: Path, kafka_prefix: str, spark: SparkSession
) -> None:
    from local_servers.kafka import LocalKafka, _free_port

    port, controller = _free_port(), _free_port()
    secured = {
        "listeners": f"SASL_PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}",
        "advertised.listeners": f"SASL_PLAINTEXT://127.0.0.1:{port}",
        "listener.security.protocol.map": "SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": "PLAIN",
        "sasl.mechanism.inter.broker.protocol": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": f"{_PLAIN_LOGIN} required {_SASL_USERS}",
    }
    execute(reference_db, "INSERT INTO categories (name) SELECT 'c' || g FROM generate_series(1, 30) g")
    with LocalKafka(root=tmp_path / "broker", port=port, controller_port=controller, settings=secured) as broker:
        sasl = {
            "kafka_security_protocol": "sasl_plaintext",
            "kafka_sasl_mechanism": "PLAIN",
            "kafka_sasl_username": "cdc",
            "kafka_timeout_ms": "3000",
        }
        refused = run_cdc(
            cdc_env(
                reference_db,
                tmp_path,
                log=f"kafka://{broker.bootstrap}",
                topic_prefix=kafka_prefix,
                kafka_sasl_password="wrong",
                **sasl,
            ),
            "capture",
            "--once",
        )
        assert refused.returncode == 5, refused.stderr
        assert refused.stderr.count("error: Kafka at") == 1 and "wrong" not in refused.stderr, refused.stderr
        assert "Authentication failed" in refused.stderr, refused.stderr
        kafka = _kafka(reference_db, tmp_path, broker.bootstrap, kafka_prefix, kafka_sasl_password="c-secret", **sasl)
        assert sorted(_captured_category_names(spark, kafka)) == sorted(f"c{g}" for g in range(1, 31))


@pytest.mark.spark
def test_tls_with_a_client_certificate_reaches_capture_and_spark_and_an_untrusted_broker_is_one_clear_error(
    reference_db: str, tmp_path: Path, kafka_prefix: str, spark: SparkSession
) -> None:
    from local_servers.kafka import LocalKafka, _free_port
    from tests.fix_tls import make_tls_files

    files = make_tls_files(tmp_path / "tls")
    stranger = make_tls_files(tmp_path / "stranger", ca_name="stranger-ca")  # a CA that did not sign the broker
    port, controller = _free_port(), _free_port()
    secured = {  # TLS only, and the broker asks every client for a certificate its CA signed
        "listeners": f"SSL://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}",
        "advertised.listeners": f"SSL://127.0.0.1:{port}",
        "listener.security.protocol.map": "SSL:SSL,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "SSL",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(files.server),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(files.ca),
        "ssl.client.auth": "required",
    }
    execute(reference_db, "INSERT INTO categories (name) SELECT 't' || g FROM generate_series(1, 30) g")
    with LocalKafka(root=tmp_path / "broker", port=port, controller_port=controller, settings=secured) as broker:
        tls = {
            "kafka_security_protocol": "ssl",
            "kafka_ssl_certificate_location": str(files.client_certificate),
            "kafka_ssl_key_location": str(files.client_key),
            "kafka_timeout_ms": "3000",
        }
        env = cdc_env(reference_db, tmp_path, log=f"kafka://{broker.bootstrap}", topic_prefix=kafka_prefix, **tls)
        untrusted = run_cdc(
            {**env, "CDC_KAFKA_SSL_CA_LOCATION": str(stranger.ca), "CDC_KAFKA_SSL_KEY_PASSWORD": files.client_key_password},
            "capture",
            "--once",
        )
        assert untrusted.returncode == 5, untrusted.stderr
        assert untrusted.stderr.count("error: Kafka at") == 1, untrusted.stderr
        assert "certificate verify failed" in untrusted.stderr, untrusted.stderr
        locked = run_cdc(
            {**env, "CDC_KAFKA_SSL_CA_LOCATION": str(files.ca), "CDC_KAFKA_SSL_KEY_PASSWORD": "wrong"}, "capture", "--once"
        )
        assert locked.returncode == 5, locked.stderr
        assert locked.stderr.count("error: Kafka at") == 1 and "Traceback" not in locked.stderr, locked.stderr
        assert "CDC_KAFKA_SSL_KEY_PASSWORD" in locked.stderr and "wrong" not in locked.stderr, locked.stderr
        kafka = _kafka(
            reference_db,
            tmp_path,
            broker.bootstrap,
            kafka_prefix,
            kafka_ssl_ca_location=str(files.ca),
            kafka_ssl_key_password=files.client_key_password,
            **tls,
        )
        names = _captured_category_names(spark, kafka)
        assert sorted(name for name in names if name.startswith("t")) == sorted(f"t{g}" for g in range(1, 31))
