"""A publication's column list and row filter hold for every read capture makes: the initial snapshot,
the stream, a re-read after a column change and a re-read after the rule itself changed. No byte of an
unpublished column or row reaches any file under the data directory."""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import os
import tempfile
import threading
from contextlib import closing
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from cdc.capture.catalog import Catalog
from cdc.config.settings import Settings
from cdc.run.coordinator import Capture
from log_store.errors import LogStoreError
from tests.cdc.helpers import execute, replay, run_cdc, settings_for, wait_for

pytestmark = pytest.mark.pg

#: The publication of these tests: ``people``'s ``ssn`` is left out, and only its ``eu`` rows are
#: published (``region`` is in its primary key, so updates and deletes stay allowed); ``plain`` whole.
PUBLICATION = "CREATE PUBLICATION cdc_publication FOR TABLE people (id, region, name) WHERE (region = 'eu'), TABLE plain"


def secret(kind: str, n: int) -> str:
    """A long value that occurs nowhere else: found in a file only if that exact value leaked."""
    return f"{kind}-{n}-" + hashlib.sha256(f"{kind}/{n}".encode()).hexdigest()


def create_tables(url: str, people: int = 6) -> None:
    """``people`` with ids 1..``people`` (odd ids in ``eu``, even in ``us``), ``plain`` with three rows."""
    execute(
        url,
        "CREATE TABLE people (id int, region text, name text, ssn text, PRIMARY KEY (id, region))",
        "CREATE TABLE plain (id int PRIMARY KEY, v text)",
        "INSERT INTO plain SELECT g, 'plain ' || g FROM generate_series(1, 3) g",
    )
    for n in range(1, people + 1):
        insert_person(url, n, "eu" if n % 2 else "us")
    execute(url, PUBLICATION)


def insert_person(url: str, n: int, region: str) -> None:
    execute(url, f"INSERT INTO people VALUES ({n}, '{region}', '{secret('name', n)}', '{secret('ssn', n)}')")


def published_people(url: str, columns: tuple[str, ...] = ("id", "region", "name"), where: str = "region = 'eu'") -> dict:
    """``people`` as the publication publishes it, keyed as capture keys it."""
    listed = ", ".join(f"'{c}', {c}" for c in columns)
    with psycopg.connect(url) as conn:
        rows = conn.execute(f"SELECT jsonb_build_object({listed}) FROM people WHERE {where}").fetchall()  # noqa: S608
    return {orjson.dumps({"id": row[0]["id"], "region": row[0]["region"]}): row[0] for row in rows}


def files_holding(data_dir: Path, values: list[str]) -> dict[str, list[str]]:
    """Every file under ``data_dir`` that holds one of ``values`` (as bytes), with the values it holds."""
    found: dict[str, list[str]] = {}
    for path in sorted(p for p in data_dir.rglob("*") if p.is_file()):
        data = path.read_bytes()
        held = [value for value in values if value.encode() in data]
        if held:
            found[str(path.relative_to(data_dir))] = held
    return found


def schema_columns(data_dir: Path, table: str) -> list[str]:
    """The columns of ``table``'s latest schema record."""
    from tests.cdc.helpers import read_topic

    records = [r for r in read_topic(data_dir, "cdc.__schemas") if r.key == orjson.dumps(f"public.{table}") and r.value]
    return [c["name"] for c in orjson.loads(records[-1].value)["columns"]]  # type: ignore[arg-type]


def capture(settings: Settings) -> None:
    Capture(settings, once=True).run()


def test_snapshot_stream_and_re_read_hold_only_the_published_columns_and_rows(pg_url: str, tmp_path: Path) -> None:
    create_tables(pg_url)
    settings = settings_for(pg_url, tmp_path)
    with closing(Catalog(pg_url)) as catalog:
        people = next(t for t in catalog.published_tables("cdc_publication") if t.table == "people")
    assert (people.column_list, people.row_filter) == (("id", "region", "name"), "(region = 'eu'::text)")
    capture(settings)
    assert replay(tmp_path, "cdc.public.people") == published_people(pg_url)
    assert len(published_people(pg_url)) == 3
    assert schema_columns(tmp_path, "people") == ["id", "region", "name"]

    # the stream: inserts, updates and a delete inside and outside the filter, and rows crossing it
    for n, region in ((7, "eu"), (8, "us")):
        insert_person(pg_url, n, region)
    execute(
        pg_url,
        f"UPDATE people SET name = '{secret('renamed', 1)}', ssn = '{secret('ssn', 101)}' WHERE id = 1",
        f"UPDATE people SET name = '{secret('renamed', 2)}', ssn = '{secret('ssn', 102)}' WHERE id = 2",
        "UPDATE people SET region = 'us' WHERE id = 3",  # leaves the filter: arrives as a delete
        "UPDATE people SET region = 'eu' WHERE id = 4",  # enters it: arrives as an insert
        "DELETE FROM people WHERE id IN (5, 6)",
        "UPDATE plain SET v = 'changed' WHERE id = 1",
    )
    capture(settings)
    log = replay(tmp_path, "cdc.public.people")
    assert log == published_people(pg_url)
    assert sorted(row["id"] for row in log.values()) == [1, 4, 7]

    # a column added with a volatile default makes capture read the table again: under the same rule
    execute(pg_url, "ALTER TABLE people ADD COLUMN added int NOT NULL DEFAULT (7 + random() * 0)::int", "TRUNCATE plain")
    insert_person(pg_url, 9, "us")
    assert Capture(settings, once=True).run().tables_added == 1
    assert replay(tmp_path, "cdc.public.people") == published_people(pg_url)
    assert replay(tmp_path, "cdc.public.plain") == {}

    leaked = [secret("ssn", n) for n in (*range(1, 10), 101, 102)] + [secret("name", n) for n in (2, 6, 8, 9)]
    leaked += [secret("renamed", 2)]
    assert files_holding(tmp_path, leaked) == {}
    # the published values are there: the search would find a leak
    assert files_holding(tmp_path, [secret("name", 7)]) != {}


def test_a_changed_column_list_or_row_filter_is_read_again(pg_url: str, tmp_path: Path) -> None:
    """Narrowing the rule while capture runs: the table is read again under the new rule, and once the
    log is compacted (``cdc log compact --roll``) no byte of what the publication no longer publishes
    remains in it."""
    create_tables(pg_url)
    settings = settings_for(pg_url, tmp_path)
    capture(settings)
    assert files_holding(tmp_path, [secret("name", 1)]) != {}
    execute(
        pg_url,
        "ALTER PUBLICATION cdc_publication SET TABLE people (id, region) WHERE (region = 'eu' AND id > 1), TABLE plain",
    )
    assert Capture(settings, once=True).run().tables_added == 1
    assert replay(tmp_path, "cdc.public.people") == published_people(pg_url, ("id", "region"), "region = 'eu' AND id > 1")
    assert schema_columns(tmp_path, "people") == ["id", "region"]
    # an unchanged rule reads nothing again
    assert Capture(settings, once=True).run().tables_added == 0

    result = run_cdc(pg_url, tmp_path, "log", "compact", "--roll")
    assert result.returncode == 0, result.stderr
    gone = [secret("name", n) for n in range(1, 7)]
    assert files_holding(tmp_path / "log", gone) == {}


@pytest.mark.kafka
def test_kafka_receives_only_the_published_columns_and_rows(
    pg_url: str, tmp_path: Path, kafka_bootstrap: str, kafka_prefix: str
) -> None:
    """The same reads into Kafka: snapshot, stream, a re-read after the rule changed; neither a record
    of the prefix's topics nor a file of the broker under those topics holds an unpublished value."""
    from tests.cdc.helpers import read_topic

    create_tables(pg_url)
    settings = settings_for(pg_url, tmp_path, log=f"kafka://{kafka_bootstrap}", topic_prefix=kafka_prefix)
    topic = f"{kafka_prefix}.public.people"
    capture(settings)
    assert replay(settings, topic) == published_people(pg_url)
    execute(
        pg_url,
        f"UPDATE people SET name = '{secret('renamed', 2)}', ssn = '{secret('ssn', 102)}' WHERE id = 2",
        "UPDATE people SET region = 'us' WHERE id = 3",
        "UPDATE people SET region = 'eu' WHERE id = 4",
        "DELETE FROM people WHERE id = 5",
    )
    insert_person(pg_url, 8, "us")
    capture(settings)
    assert replay(settings, topic) == published_people(pg_url)
    execute(
        pg_url,
        "ALTER PUBLICATION cdc_publication SET TABLE people (id, region) WHERE (region = 'eu' AND id > 1), TABLE plain",
    )
    assert Capture(settings, once=True).run().tables_added == 1
    assert replay(settings, topic) == published_people(pg_url, ("id", "region"), "region = 'eu' AND id > 1")

    leaked = [secret("ssn", n) for n in (*range(1, 9), 102)] + [secret("name", n) for n in (2, 6, 8)] + [secret("renamed", 2)]
    records = [
        record
        for name in (topic, f"{kafka_prefix}.public.plain", f"{kafka_prefix}.__schemas", f"{kafka_prefix}.__snapshots")
        for record in read_topic(settings, name)
    ]
    written = b"\n".join((r.key or b"") + b"\n" + (r.value or b"") for r in records)
    assert secret("name", 1) in written.decode()  # written under the first rule: the search finds values
    assert [value for value in leaked if value.encode() in written] == []
    assert files_holding(tmp_path, leaked) == {}
    broker_files = [Path(d) for d in glob.glob(f"{tempfile.gettempdir()}/cdc-kafka-*/data/{kafka_prefix}*")]
    assert broker_files or os.environ.get("CDC_TEST_KAFKA"), "the broker's files of the prefix's topics were not found"
    for directory in broker_files:
        assert files_holding(directory, leaked) == {}
    if broker_files:  # records are stored as written: the search finds a value that is there
        assert any(files_holding(directory, [secret("name", 1)]) for directory in broker_files)


def test_a_rule_changed_while_capture_streams_is_noticed(pg_url: str, tmp_path: Path) -> None:
    """A running capture notices the changed column list and filter at its next look at the publication
    and reads the table again; the changes it streams meanwhile follow the new rule too."""
    create_tables(pg_url)
    settings = settings_for(pg_url, tmp_path)
    running = Capture(settings)
    thread = threading.Thread(target=running.run, name="capture-under-test", daemon=True)
    thread.start()
    try:
        wait_for(lambda: _replayed(tmp_path) == published_people(pg_url), what="the snapshot under the first rule")
        execute(
            pg_url,
            "ALTER PUBLICATION cdc_publication SET TABLE people (id, region) WHERE (region = 'eu' AND id > 1), TABLE plain",
        )
        insert_person(pg_url, 11, "eu")
        new_rule = ("id", "region"), "region = 'eu' AND id > 1"
        wait_for(lambda: _replayed(tmp_path) == published_people(pg_url, *new_rule), what="the re-read under the new rule")
    finally:
        running.stop.set()
        thread.join(timeout=60)
    assert not thread.is_alive()
    assert schema_columns(tmp_path, "people") == ["id", "region"]


def _replayed(data_dir: Path) -> dict[bytes | None, dict[str, object]] | None:
    """``people`` as the log holds it, or None before its topic exists."""
    try:
        return replay(data_dir, "cdc.public.people")
    except (FileNotFoundError, LogStoreError):
        return None


@pytest.mark.parametrize("via_root", [True, False], ids=["via-root", "leaf"])
def test_a_partitioned_tables_rule_is_the_roots_or_each_leafs(pg_url: str, tmp_path: Path, via_root: bool) -> None:
    """Published via its root, a partitioned table is read through the root under the root's rule;
    otherwise each leaf is read under its own (PostgreSQL allows no rule on the root then)."""
    execute(
        pg_url,
        "CREATE TABLE parted (id int, region text, secret text, PRIMARY KEY (id, region)) PARTITION BY LIST (region)",
        "CREATE TABLE parted_eu PARTITION OF parted FOR VALUES IN ('eu')",
        "CREATE TABLE parted_us PARTITION OF parted FOR VALUES IN ('us')",
        "INSERT INTO parted SELECT g, CASE WHEN g % 2 = 0 THEN 'us' ELSE 'eu' END, 'secret-' || g FROM generate_series(1, 20) g",
    )
    if via_root:
        execute(
            pg_url,
            "CREATE PUBLICATION cdc_publication FOR TABLE parted (id, region) WHERE (id > 10) "
            "WITH (publish_via_partition_root = true)",
        )
        expected = {"cdc.public.parted": [(i, "us" if i % 2 == 0 else "eu") for i in range(11, 21)]}
    else:
        execute(pg_url, "CREATE PUBLICATION cdc_publication FOR TABLE parted_eu (id, region) WHERE (id > 10), TABLE parted_us")
        expected = {
            "cdc.public.parted_eu": [(i, "eu") for i in range(11, 21, 2)],
            "cdc.public.parted_us": [(i, "us", f"secret-{i}") for i in range(2, 21, 2)],
        }
    settings = settings_for(pg_url, tmp_path)
    capture(settings)
    execute(pg_url, "INSERT INTO parted VALUES (21, 'eu', 'secret-21'), (5, 'us', 'secret-5x'), (22, 'us', 'secret-22')")
    if via_root:
        expected["cdc.public.parted"] += [(21, "eu"), (22, "us")]
    else:
        expected["cdc.public.parted_eu"].append((21, "eu"))
        expected["cdc.public.parted_us"] += [(5, "us", "secret-5x"), (22, "us", "secret-22")]
    capture(settings)
    for topic, rows in expected.items():
        assert sorted(tuple(row.values()) for row in replay(tmp_path, topic).values()) == sorted(rows), topic
    if via_root:
        assert files_holding(tmp_path, ["secret-"]) == {}
    else:
        holding = files_holding(tmp_path, ["secret-"])
        assert holding and all(path.startswith("log/topics/cdc.public.parted_us/") for path in holding), holding


def test_a_log_written_without_the_rule_is_read_again_under_it(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A log that holds a table as read without its rule (as capture read it before it honoured column
    lists and row filters) is read again under the rule, and compaction then removes every value the
    rule excludes."""
    from cdc.capture import catalog
    from cdc.capture.published_tables import PublishedTable

    create_tables(pg_url)
    settings = settings_for(pg_url, tmp_path)
    published = catalog._published

    def unruled(*row: object, **marks: Any) -> PublishedTable:
        table = published(*row, **marks)
        membership = table.membership.partition(";rule=")[0]
        return dataclasses.replace(table, column_list=None, row_filter=None, membership=membership)

    with monkeypatch.context() as patch:
        patch.setattr(catalog, "_published", unruled)
        capture(settings)
    excluded = [secret("ssn", n) for n in range(1, 7)] + [secret("name", n) for n in (2, 4, 6)]
    leaked = files_holding(tmp_path, excluded)
    assert leaked and all(path.startswith("log/topics/cdc.public.people/") for path in leaked), leaked

    assert Capture(settings, once=True).run().tables_added == 1
    assert replay(tmp_path, "cdc.public.people") == published_people(pg_url)
    result = run_cdc(pg_url, tmp_path, "log", "compact", "--roll")
    assert result.returncode == 0, result.stderr
    assert files_holding(tmp_path, excluded) == {}
    assert files_holding(tmp_path, [secret("name", 1)]) != {}
