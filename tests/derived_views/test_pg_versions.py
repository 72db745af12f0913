"""One conformance scenario on each supported PostgreSQL major version (14 to 18), each its own server.

The scenario: ``cdc setup``; the initial snapshot of every type of the type-coverage table; the same
rows again through the stream; TOAST values an update leaves unchanged and TOASTed keys; a
transaction large enough that the server streams it before its commit (``logical_decoding_work_mem``
is 64 kB here, and pgoutput streams in-progress transactions from 14 on: capture asks for protocol
version 2 with ``streaming``); every step of the DDL conformance script (columns added, renamed,
retyped, dropped, replica identity, a table renamed, truncate); logical messages, which capture does
not carry; then one Spark sync of the warehouse, ``verify`` and a read of every view table with
``deltalake``.

The log is checked against the source after each step (cheap, no Spark): replaying each topic gives
the source's keys. The values are compared once per version, by ``verify`` after the sync: every value of
the type-coverage table, infinity, BC dates, NaN in arrays, timetz and inet included.

Where the versions differ, both sides are run: 14 takes the replication slot command without the
parenthesised options 15 introduced; on 15 and later the publication is ``FOR TABLES IN SCHEMA``
(which 14 lacks), on 14 ``FOR ALL TABLES``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
import psycopg
import pytest
from psycopg import sql

from cdc.config.log_backend import open_log
from tests.cdc.all_types import COLUMNS, ROWS, TYPES
from tests.cdc.helpers import read_topic, replay, run_cdc, wait_for
from tests.derived_views.pipeline import capture, context, execute, read_every_view_table, settings_for, sync, verify_views
from tests.derived_views.test_ddl_conformance import SCRIPT, TABLES
from tests.fix_pg import PG_VERSIONS, local_server

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.pg, pytest.mark.spark, pytest.mark.slow, pytest.mark.pgversions]

#: Rows of the transaction the server streams before its commit (about 500 kB of changes)
LARGE_ROWS = 5_000
#: Each table of the scenario with its key column
KEYS = {"alltypes": "id", "toasty": "id", "bulk": "id", "conf_a": "id", "conf_b": "id", "conf_b2": "id", "conf_k": "k"}


@pytest.fixture(params=PG_VERSIONS, ids=[f"pg{major}" for major in PG_VERSIONS])
def versioned_url(request: pytest.FixtureRequest) -> Iterator[tuple[int, str]]:
    """(major version, superuser URL) of a new server of each supported version, streaming large
    transactions from 64 kB of changes on."""
    server = local_server(request.param, logical_decoding_work_mem="64kB")
    url = server.start()
    try:
        yield request.param, url
    finally:
        server.stop()


def _server_major(url: str) -> int:
    with psycopg.connect(url) as conn:
        return int(conn.info.server_version) // 10000


def _log_has_the_source_keys(url: str, data_dir: Path, tables: dict[str, str], step: str) -> None:
    """Replaying each table's topic (strictly: an impossible history fails) gives the source's keys (an int or
    a text key: its event key is ``{"<column>": value}`` as compact JSON)."""
    for table, key in tables.items():
        logged = set(replay(data_dir, f"cdc.public.{table}"))
        with psycopg.connect(url) as conn:
            query = sql.SQL("SELECT {} FROM {}").format(sql.Identifier(key), sql.Identifier(table))
            expected = {orjson.dumps({key: value}) for (value,) in conn.execute(query).fetchall()}
        assert logged == expected, f"after {step}: {table}: log-only {logged - expected}, source-only {expected - logged}"


def _exists(url: str, table: str) -> bool:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f"public.{table}",)).fetchone() == (True,)


def _streamed_transactions(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT stream_txns FROM pg_stat_replication_slots WHERE slot_name = 'cdc_slot'").fetchone()
    return int(row[0]) if row else 0


def _reads_and_changes(data_dir: Path, topic: str) -> tuple[list[object], list[object]]:
    reads, changes = [], []
    for record in read_topic(data_dir, topic):
        if record.value is not None:
            value = orjson.loads(record.value)
            (reads if value["op"] == "r" else changes).append((record.key, value["after"]))
    return sorted(reads, key=repr), sorted(changes, key=repr)


def test_the_pipeline_conforms_on_each_supported_version(
    spark: SparkSession, versioned_url: tuple[int, str], tmp_path: Path
) -> None:
    major, url = versioned_url
    assert _server_major(url) == major
    publication = "FOR TABLES IN SCHEMA public" if major >= 15 else "FOR ALL TABLES"
    execute(
        url,
        *TYPES,
        f"CREATE TABLE alltypes (id int PRIMARY KEY, {COLUMNS})",
        f"INSERT INTO alltypes VALUES {', '.join(ROWS)}",
        "CREATE TABLE toasty (id int PRIMARY KEY, big text, n int)",
        "INSERT INTO toasty SELECT g, (SELECT string_agg(md5(h::text || g::text), '') FROM generate_series(1, 3000) h), g "
        "FROM generate_series(1, 3) g",
        "CREATE TABLE bulk (id int PRIMARY KEY, payload text)",
        *TABLES,
        f"CREATE PUBLICATION cdc_publication {publication}",
    )
    setup = run_cdc(url, tmp_path, "setup")
    assert setup.returncode == 0, setup.stderr + setup.stdout
    assert "ok   server version" in setup.stdout and "slot cdc_slot: created" in setup.stdout
    settings = settings_for(url, tmp_path)

    # the snapshot, then the same rows through the stream: an update that changes nothing carries the whole row
    capture(settings)
    _log_has_the_source_keys(url, tmp_path, {"alltypes": "id", "toasty": "id"}, "the snapshot")
    execute(url, "UPDATE alltypes SET id = id")
    capture(settings)
    reads, changes = _reads_and_changes(tmp_path, "cdc.public.alltypes")
    assert len(reads) == len(ROWS) and reads == changes

    # TOAST values an update leaves unchanged: the log holds the value pgoutput left out
    execute(url, "UPDATE toasty SET n = n + 10")
    capture(settings)
    records = read_topic(tmp_path, "cdc.public.toasty")
    assert any(record.header("unchanged") is not None for record in records), "no update left a TOAST value out"
    with psycopg.connect(url) as conn:
        big = dict(conn.execute("SELECT id, big FROM toasty").fetchall())
    logged = replay(tmp_path, "cdc.public.toasty")
    assert {row["id"]: (row["big"], row["n"]) for row in logged.values()} == {i: (big[i], i + 10) for i in big}

    # a transaction the server streams in pieces before its commit: whole in the log, in one commit
    execute(url, f"INSERT INTO bulk SELECT g, md5(g::text) || repeat('x', 64) FROM generate_series(1, {LARGE_ROWS}) g")
    capture(settings)
    wait_for(lambda: _streamed_transactions(url) > 0, 30, "the server's count of streamed transactions")
    bulk = [orjson.loads(r.value) for r in read_topic(tmp_path, "cdc.public.bulk") if r.value is not None]
    assert len(bulk) == LARGE_ROWS and len({event["source"]["lsn"] for event in bulk}) == 1

    # logical messages (transactional and not) beside a change: capture carries the change, never the message
    execute(
        url,
        "BEGIN; SELECT pg_logical_emit_message(true, 'cdc-test', 'message-payload'); "
        "INSERT INTO conf_a (id, name) VALUES (500, 'beside a message'); COMMIT",
        "SELECT pg_logical_emit_message(false, 'cdc-test', 'message-payload')",
    )
    capture(settings)
    assert 500 in {orjson.loads(key)["id"] for key in replay(tmp_path, "cdc.public.conf_a") if key is not None}

    # every DDL step of the conformance script, the log checked against the source after each
    for what, statements in SCRIPT:
        execute(url, *statements)
        capture(settings)
        _log_has_the_source_keys(url, tmp_path, {t: k for t, k in KEYS.items() if _exists(url, t)}, what)
    with open_log(settings) as log:
        topics = log.topics()
    every_record = [bytes(r.key or b"") + bytes(r.value or b"") for topic in topics for r in read_topic(tmp_path, topic)]
    assert len(every_record) > LARGE_ROWS and not any(b"message-payload" in record for record in every_record)

    # the values: one sync of the warehouse, verify against the source, every view table read by deltalake
    capture(settings)
    ctx = context(spark, settings)
    sync(ctx, ["warehouse"])
    assert verify_views(ctx, url, ["warehouse"]) > LARGE_ROWS
    bulk_tables = [count for path, count in read_every_view_table(tmp_path).items() if "bulk" in path]
    assert bulk_tables and all(count == LARGE_ROWS for count in bulk_tables)  # current state and history
