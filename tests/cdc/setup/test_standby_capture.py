"""Capture from a hot standby (:mod:`cdc.setup.standby_source`): setup, reads and the stream on the standby, what
must be written on the primary, a ``kill -9``, a ``cdc snapshot`` request, then a promotion of that standby.

A PostgreSQL 16 primary and its physical standby (:mod:`local_servers.standby_pair`), a write load through the
multi-host URL (the primary, then the promoted standby), ``cdc`` as processes given the standby's URL.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from pathlib import Path

import orjson
import psycopg
import pytest

from cdc.config.settings import load_settings
from cdc.run.coordinator import Capture
from cdc.setup.source_objects import ensure_publication, ensure_slot
from local_servers.standby_pair import StandbyPair
from tests.cdc.all_types import COLUMNS, ROWS, TYPES
from tests.cdc.helpers import read_topic, replay, source_table, wait_for
from tests.faults.harness import CdcProcess, cdc_env, first_reads_done, run_cdc, wal_lsn, watermark
from tests.faults.test_failover import _pair_or_skip

pytestmark = [pytest.mark.pg, pytest.mark.slow]

DATABASE = "shop"
TABLES = "public.items,public.notes"


class _Writes(threading.Thread):
    """Updates, inserts and deletes of both tables through ``url`` (whichever server is primary) until stopped."""

    def __init__(self, url: str) -> None:
        super().__init__(name="writes", daemon=True)
        self.url, self.stop, self.error, self.transactions = url, threading.Event(), None, 0
        self.rng = random.Random(7)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                with psycopg.connect(self.url, autocommit=True, connect_timeout=3) as conn:
                    while not self.stop.is_set():
                        n = self.rng.randint(1, 20_000)
                        with conn.transaction():
                            conn.execute("UPDATE items SET v = v + 1 WHERE id = %s", (n,))
                            conn.execute(
                                "INSERT INTO notes (id, note) VALUES (%s, 'w') ON CONFLICT (id) DO UPDATE SET note = 'u'", (n,)
                            )
                            conn.execute("DELETE FROM notes WHERE id = %s", (self.rng.randint(1, 20_000),))
                        self.transactions += 1
            except psycopg.OperationalError:
                self.stop.wait(0.2)  # a promotion: the multi-host URL reaches the new primary
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                self.error = exc
                return


@pytest.fixture
def pair() -> Iterator[StandbyPair]:
    with _pair_or_skip(16) as pair:
        pair.start(DATABASE)
        with psycopg.connect(_url(pair.primary.url()), autocommit=True) as conn:
            conn.execute("CREATE TABLE items (id int PRIMARY KEY, v int NOT NULL, doc text)")
            conn.execute("CREATE TABLE notes (id int PRIMARY KEY, note text NOT NULL)")
            conn.execute("INSERT INTO items SELECT g, 0, repeat('d', g % 50) FROM generate_series(1, 20000) g")
        yield pair


def _url(server_url: str) -> str:
    return server_url.rsplit("/", 1)[0] + f"/{DATABASE}"


def test_capture_from_a_standby_is_exact_through_a_kill_a_request_and_its_promotion(pair: StandbyPair, tmp_path: Path) -> None:
    """``cdc setup`` against the standby refuses without ``CDC_PRIMARY_URL`` (one line), then makes the
    publication on the primary and the slot on the standby. Capture reads and streams from the standby
    while the primary is written, is killed and goes on, serves a ``cdc snapshot`` request (sent to the
    primary), and keeps going when the standby is promoted; the log then replays to the promoted server."""
    primary, standby = _url(pair.primary.url()), _url(pair.standby.url())
    data_dir = tmp_path / "data"
    refused = run_cdc(cdc_env(standby, data_dir, tables=TABLES), "setup")
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert refused.returncode != 0 and len(errors) == 1 and "CDC_PRIMARY_URL" in errors[0], refused.stdout + refused.stderr
    env = cdc_env(standby, data_dir, tables=TABLES, primary_url=primary, snapshot_chunk_rows="1000")
    setup = run_cdc(env, "setup")
    assert setup.returncode == 0, setup.stdout + setup.stderr
    with psycopg.connect(primary, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM pg_publication WHERE pubname = 'cdc_publication'").fetchone() == (1,)
        assert conn.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_type = 'logical'").fetchone() == (0,)

    writes = _Writes(pair.url(DATABASE))  # target_session_attrs=primary: never the standby while it is promoted
    writes.start()
    capture = CdcProcess(env, ["capture"], tmp_path / "capture-0.err")
    try:
        wait_for(lambda: first_reads_done(standby, data_dir), timeout=120, what="the first reads, from the standby")
        wait_for(lambda: writes.transactions > 200, what="writes on the primary")
        assert capture.kill9(), capture.stderr()
        capture = CdcProcess(env, ["capture"], tmp_path / "capture-1.err")
        asked = run_cdc(env, "snapshot", "public.items")
        assert asked.returncode == 0, asked.stderr
        wait_for(lambda: "is read again, as asked" in capture.stderr(), what="the request, through the primary")
        wait_for(lambda: first_reads_done(standby, data_dir), timeout=120, what="the read asked for")
        promoted_at = writes.transactions
        pair.fail_over()  # the primary stops as a crash stops it; the standby capture reads from is promoted
        wait_for(
            lambda: writes.error is not None or writes.transactions > promoted_at + 100,
            timeout=60,
            what="writes on the promoted standby",
        )
        assert writes.error is None, writes.error
        writes.stop.set()
        writes.join(30)
        assert writes.error is None, writes.error
        end = wal_lsn(standby)
        wait_for(lambda: (watermark(data_dir) or 0) >= end - 1, timeout=120, what="capture past the promotion")
        assert capture.running(), capture.stderr()
        assert capture.terminate() == 0, capture.stderr()
    finally:
        writes.stop.set()
        if capture.running():
            capture.kill9()
    for table in ("items", "notes"):
        assert replay(data_dir, f"cdc.public.{table}", strict=False) == source_table(standby, table), table


def test_a_standby_of_postgresql_15_is_refused_in_one_line(tmp_path: Path) -> None:
    """Decoding on a standby needs 16: setup and capture given a 15 standby each say so in one line."""
    with _pair_or_skip(15) as old:
        old.start(DATABASE)
        env = cdc_env(_url(old.standby.url()), tmp_path / "data", primary_url=_url(old.primary.url()))
        for command in (("setup",), ("capture", "--once")):
            result = run_cdc(env, *command)
            errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
            assert result.returncode != 0 and len(errors) == 1, result.stdout + result.stderr
            assert "PostgreSQL 15" in errors[0] and "16 and later" in errors[0], errors[0]


def test_changes_of_every_type_and_ddl_come_out_of_the_standby_as_out_of_the_primary(pair: StandbyPair, tmp_path: Path) -> None:
    """The same workload (a column of every type, rows at their edges, updates, a delete, an added column with
    a stored default, a dropped column) captured through a slot on the primary and one on the standby: the
    two logs hold the same records (the standby replays the primary's WAL, so commit LSNs, transaction
    IDs and commit times are the same), but for when capture wrote each."""
    primary, standby = _url(pair.primary.url()), _url(pair.standby.url())
    with psycopg.connect(primary, autocommit=True) as conn:
        for statement in (*TYPES, f"CREATE TABLE alltypes (id int PRIMARY KEY, {COLUMNS})"):
            conn.execute(statement)
    sources = {
        "primary": load_settings(database_url=primary, data_dir=str(tmp_path / "p"), tables="public.alltypes"),
        "standby": load_settings(
            database_url=standby, data_dir=str(tmp_path / "s"), tables="public.alltypes", primary_url=primary, slot="cdc_standby"
        ),
    }
    ensure_publication(sources["primary"])
    for settings in sources.values():
        ensure_slot(settings)
        Capture(settings, once=True).run()  # the first read (an empty table): the slots sit before the workload
    with psycopg.connect(primary, autocommit=True) as conn:
        conn.execute(f"INSERT INTO alltypes VALUES {', '.join(ROWS)}")
        conn.execute("UPDATE alltypes SET t = 'changed', a_int = '{9}' WHERE id IN (2, 3)")
        conn.execute("DELETE FROM alltypes WHERE id = 4")
        conn.execute("ALTER TABLE alltypes ADD COLUMN extra int NOT NULL DEFAULT 5")
        conn.execute("ALTER TABLE alltypes DROP COLUMN vc")
        conn.execute("UPDATE alltypes SET extra = 6, n = -0.5 WHERE id = 2")
        end = str(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])  # type: ignore[index]
    with psycopg.connect(standby, autocommit=True) as conn:
        wait_for(lambda: conn.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (end,)).fetchone() == (True,))
    logs = {}
    for name, settings in sources.items():
        Capture(settings, once=True).run()
        logs[name] = [
            (r.partition, r.key, _without_capture_time(r.value), r.headers) for r in read_topic(settings, "cdc.public.alltypes")
        ]
    assert len(logs["primary"]) >= 9 and logs["standby"] == logs["primary"]


def _without_capture_time(value: bytes | None) -> object:
    """An event's value less the envelope's ``ts_ms`` (when capture wrote it; ``source.ts_ms`` is the commit's)."""
    if value is None:
        return None
    event = orjson.loads(value)
    event.pop("ts_ms", None)
    return event
