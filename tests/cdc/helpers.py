"""Helpers of the capture integration tests: settings for a test database, reading the log back, replaying it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from cdc.config.log_backend import open_log
from cdc.config.settings import Settings, load_settings
from log_store import LogStore, Record, TopicPartition
from log_store.log import Log

#: The ``cdc`` command of the environment running the tests.
CDC = Path(sys.executable).with_name("cdc")


def execute(url: str, *statements: str) -> None:
    """Run ``statements`` in autocommit mode, one after the other."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def settings_for(url: str, data_dir: Path, **extra: object) -> Settings:
    return load_settings(database_url=url, data_dir=str(data_dir), **extra)


def first_reads(url: str, data_dir: Path, **extra: object) -> None:
    """A new log's first reads of the tables ``extra``'s settings capture, in chunks of the default size
    (``cdc capture --once`` in this process): a test that reads in small chunks to watch a read go from
    chunk to chunk starts past them."""
    from cdc.run.coordinator import Capture

    settings = settings_for(url, data_dir, **{name: value for name, value in extra.items() if name != "snapshot_chunk_rows"})
    Capture(settings, once=True).run()


def read_topic(where: Path | Settings, topic: str) -> list[Record]:
    """Every committed record of ``topic``, partition by partition, in the embedded log under a data directory
    or in the log ``Settings`` name (either backend)."""
    with open_log(where) if isinstance(where, Settings) else LogStore.open(where / "log") as log:
        return read_log_topic(log, topic)


def read_log_topic(log: Log, topic: str) -> list[Record]:
    """Every committed record of ``topic`` in ``log`` (either backend), partition by partition."""
    if topic not in log.topics():
        return []
    out: list[Record] = []
    for partition in range(log.partitions(topic)):
        offset = 0
        while batch := log.read(TopicPartition(topic, partition), offset):
            out.extend(batch)
            offset = batch[-1].offset + 1
    return out


def events(data_dir: Path, topic: str) -> list[dict[str, object]]:
    """Decoded non-tombstone values of ``topic`` in (lsn, sequence) order."""
    values = [orjson.loads(r.value) for r in read_topic(data_dir, topic) if r.value is not None]
    return sorted(values, key=lambda v: (v["source"]["lsn"], v["source"]["sequence"]))


def wait_for(condition: Callable[[], bool], timeout: float = 60.0, what: str = "condition") -> None:
    """Poll ``condition`` until true (raises after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def replay(where: Path | Settings, topic: str, *, strict: bool = True) -> dict[bytes | None, dict[str, object]]:
    """:func:`replay_records` of ``topic`` (``where`` as for :func:`read_topic`), with the values of added
    columns' older rows that the topic's schema record carries."""
    return replay_records(read_topic(where, topic), strict=strict, filled=filled_columns(where, topic))


#: ``(column, value, lsn, sequence)``: every row whose last event is before ``(lsn, sequence)`` holds ``value``.
Filled = tuple[str, object, int, int]


def filled_columns(where: Path | Settings, topic: str) -> list[Filled]:
    """The ``filled`` facts of the latest schema record naming ``topic`` (docs/event-format.md)."""
    prefix = topic.rsplit(".", 2)[0]  # <prefix>.<schema>.<table> (plain names)
    records = [orjson.loads(r.value) for r in read_topic(where, f"{prefix}.__schemas") if r.value is not None]
    latest = [record for record in records if record["topic"] == topic][-1:]
    return [
        (str(c["name"]), c["filled"]["value"], int(c["filled"]["lsn"]), int(c["filled"]["sequence"]))
        for record in latest
        for c in record["columns"]
        if "filled" in c
    ]


def replay_records(
    records: list[Record],
    *,
    strict: bool = True,
    filled: list[Filled] = (),  # type: ignore[assignment]
) -> dict[bytes | None, dict[str, object]]:
    """The table a consumer derives from a topic's ``records``: events applied in (lsn, sequence) order, key -> row.

    A truncate marker empties the table; an update naming unchanged columns keeps their previous
    values; at the position of each of ``filled`` every row then in the table (its last event is
    before it) gets the column's value. ``strict`` also checks that the history is possible: a read or
    create only of an absent key, an update or delete only of a present one (a compacted topic has lost
    the earlier events).
    """
    changes = []
    for record in records:
        if record.value is not None:
            value = orjson.loads(record.value)
            changes.append((value["source"]["lsn"], value["source"]["sequence"], value, record))
    changes.sort(key=lambda change: (change[0], change[1]))
    table: dict[bytes | None, dict[str, object]] = {}
    facts = sorted(filled, key=lambda fact: (fact[2], fact[3]))

    def fill_before(position: tuple[int, int]) -> None:
        while facts and (facts[0][2], facts[0][3]) <= position:
            column, fill, _, _ = facts.pop(0)
            for row in table.values():
                row[column] = fill

    for lsn, sequence, value, record in changes:
        fill_before((lsn, sequence))
        op, key, where = value["op"], record.key, f"{value['op']} of {record.key!r} at ({lsn}, {sequence})"
        if op == "t":
            table.clear()
        elif op in ("r", "c"):
            assert not strict or key not in table, f"{where}: the key is already present"
            table[key] = value["after"]
        elif op == "u":
            assert not strict or key in table, f"{where}: the key is absent"
            partial = record.header("unchanged") is not None
            table[key] = {**table.get(key, {}), **value["after"]} if partial else value["after"]
        elif op == "d":
            assert not strict or key in table, f"{where}: the key is absent"
            table.pop(key, None)
    fill_before((1 << 64, 0))
    return table


def source_table(url: str, table: str, key: str = "id") -> dict[bytes | None, dict[str, object]]:
    """The rows of ``table`` (plain int and text columns) keyed as capture keys them."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(url) as conn:
        rows = conn.execute(sql.SQL("SELECT to_jsonb(t) FROM {} t").format(sql.Identifier(table))).fetchall()
    return {orjson.dumps({key: row[0][key]}): row[0] for row in rows}


def snapshot_threads() -> list[str]:
    """Names of the snapshot reader's threads still alive in this process."""
    return [t.name for t in threading.enumerate() if t.name.startswith("snapshot-")]


def run_cdc(url: str, data_dir: Path, *args: str, **settings: str) -> subprocess.CompletedProcess[str]:
    """``cdc ARGS`` as a subprocess with only the given settings (``CDC_<NAME>``) in its environment."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("CDC_")}
    env.update(CDC_DATABASE_URL=url, CDC_DATA_DIR=str(data_dir))
    env.update({f"CDC_{name.upper()}": value for name, value in settings.items()})
    return subprocess.run([str(CDC), *args], env=env, capture_output=True, text=True, timeout=120)


def slot_names(url: str) -> list[str]:
    """The replication slots of ``url``'s database."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE database = current_database() ORDER BY 1"
        ).fetchall()
    return [str(row[0]) for row in rows]
