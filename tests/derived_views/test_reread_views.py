"""A table read again beside the stream (``cdc snapshot``) while it is written: the views are exact after it."""

from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
import pytest

from cdc.capture.lsn import Lsn
from cdc.commands.snapshot_cmd import request_snapshot
from cdc.observe.read_status import read_status
from cdc.run.coordinator import Capture
from tests.cdc.helpers import wait_for
from tests.derived_views.pipeline import context, execute, settings_for, sync, through, verify_views

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.pg, pytest.mark.spark, pytest.mark.slow]

ROWS = 20_000


def _write(url: str, stop: threading.Event, counts: list[int]) -> None:
    """Small transactions on t until stopped: updates (some leaving the TOASTed document out), deletes,
    key changes and inserts, anywhere in the table."""
    pick = random.Random(5)
    with psycopg.connect(url, autocommit=True) as conn:
        while not stop.is_set():
            key = pick.randint(1, ROWS)
            with conn.transaction():
                match pick.randrange(4):
                    case 0:
                        conn.execute("UPDATE t SET v = v + 1 WHERE id = %s", (key,))  # doc left out
                    case 1:
                        conn.execute("DELETE FROM t WHERE id = %s", (key,))
                    case 2:
                        conn.execute("UPDATE t SET id = id + 1000000 WHERE id = %s AND doc NOT LIKE 'big%%'", (key,))
                    case _:
                        conn.execute("INSERT INTO t VALUES (%s, 0, 'new') ON CONFLICT DO NOTHING", (2_000_000 + counts[0],))
            counts[0] += 1


def test_a_table_read_again_while_written_syncs_and_verifies_exactly(spark: SparkSession, pg_url: str, tmp_path: Path) -> None:
    """``cdc snapshot`` of t while a writer changes it: a sync during the read goes through, and once the
    read is in the log a sync makes the warehouse equal to the source (``cdc verify``); so does a partial
    read (``--where``), whose ``op=r`` rows are of keys the warehouse already holds."""
    execute(
        pg_url,
        "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL, doc text)",
        "CREATE PUBLICATION cdc_publication FOR ALL TABLES",
        "INSERT INTO t SELECT g, 0, CASE WHEN g % 1000 = 0 THEN 'big' || "
        "(SELECT string_agg(md5(s::text || g::text), '') FROM generate_series(1, 200) s) ELSE 'd' || g END "
        f"FROM generate_series(1, {ROWS}) g",
    )
    settings = settings_for(pg_url, tmp_path, snapshot_chunk_rows=200, request_key="a-request-key-of-32-characters..")
    ctx = context(spark, settings)
    through(settings, ctx)
    stop, stop_writing, counts = threading.Event(), threading.Event(), [0]
    capture = Capture(settings, stop=stop)
    running = threading.Thread(target=capture.run)
    writer = threading.Thread(target=_write, args=(pg_url, stop_writing, counts), daemon=True)
    running.start()
    try:
        writer.start()
        request_snapshot(settings, ("public.t",))
        wait_for(lambda: bool(read_status(settings)), what="the read under way")
        sync(ctx, ["warehouse"])  # a sync in the middle of the read
        wait_for(lambda: capture.stats.reads_requested == 1 and not read_status(settings) and not capture.reads, what="the read")
        request_snapshot(settings, ("public.t",), where="id % 10 = 0")
        wait_for(
            lambda: capture.stats.reads_requested == 2 and not capture.ledger.asked and not capture.reads,
            what="the partial read",
        )
        stop_writing.set()
        writer.join(30)
        assert not writer.is_alive(), "the writer did not stop: the source would move past what is compared"
        with psycopg.connect(pg_url) as conn:
            written = Lsn.parse(str(conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]))  # type: ignore[index]
        wait_for(lambda: capture.confirmed >= written, what="capture to catch up with the writer")
    finally:
        stop_writing.set()
        stop.set()
        running.join(60)
    assert not running.is_alive(), "capture did not stop"
    assert counts[0] > 50, counts
    sync(ctx, ["warehouse"])
    assert verify_views(ctx, pg_url, ["warehouse"]) >= ROWS - counts[0]
