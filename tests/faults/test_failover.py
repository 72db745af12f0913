"""A primary that fails over while capture streams: the log replays to exactly the new primary's tables.

A primary and a physical standby (``pg_basebackup -R``, :mod:`local_servers.standby_pair`) on loopback
ports, a write load through the multi-host URL, ``cdc capture`` as a subprocess on the same URL; at a
seeded random moment the primary is stopped as a crash stops it (``pg_ctl stop -m immediate``) and the
standby promoted. The load goes on against the new primary, then stops, and capture drains.

* PostgreSQL 17 (failover slots): capture reconnects by itself to the promoted standby and resumes from
  the synced slot. The log then holds every transaction the new primary has exactly once and whole, none
  it lacks (``synchronized_standby_slots`` kept the slot from getting ahead of the standby: the
  transactions the promotion lost never reached the log), in commit order per partition.
* PostgreSQL 16 (no failover slots): the slot is missing on the new primary: capture stops with one
  line saying so and how to recover; ``cdc setup`` and capture then re-read the tables (the slot does
  not continue the log), and the log replays to exactly the new primary's tables.

Each transaction of the load is known by the ``note`` every row it writes carries (``tx<seq>``), not by
its transaction id: ids the promotion lost are handed out again on the new timeline. Moments come from
``FAULTS_SEED`` (printed in every assertion message), like the rest of the fault suite.
"""

from __future__ import annotations

import os
import random
import re
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from cdc.capture.lsn import Lsn
from local_servers.pg_builds import installed_client_bindir
from local_servers.postgres import find_server_bindir
from local_servers.standby_pair import PHYSICAL_SLOT, StandbyPair
from tests.cdc.helpers import read_topic, replay
from tests.faults.harness import LoadThread, Running, cdc_env, first_reads_done, poll, run_cdc, wal_lsn, watermark
from tests.faults.test_faults import SEED

pytestmark = [pytest.mark.faults, pytest.mark.pg, pytest.mark.slow]

DATABASE = "shop"
TOPIC = "cdc.public.ledger"


def _pair_or_skip(major: int) -> StandbyPair:
    try:
        find_server_bindir(major)
    except Exception as exc:  # noqa: BLE001 - the pinned build is not fetched here
        pytest.skip(f"no PostgreSQL {major}: {exc}")
    if installed_client_bindir(18) is None:
        pytest.skip("no pg_basebackup: the PostgreSQL 18 client programs are not fetched (scripts/setup)")
    return StandbyPair(major)


@pytest.fixture
def running() -> Iterator[Running]:
    started = Running()
    yield started
    started.close()


@dataclass(eq=False)
class LedgerLoad(LoadThread):
    """Transactions of one to five new ledger rows, half of them also updating a row of an earlier one,
    through the multi-host URL; a lost connection is opened again (to whichever server is primary)."""

    url: str
    rng: random.Random
    stop: threading.Event = field(default_factory=threading.Event)
    #: rows written by each transaction (by its number), committed or cut off at its commit
    rows: dict[int, int] = field(default_factory=dict)
    reconnects: int = 0
    error: BaseException | None = None

    def __post_init__(self) -> None:
        super().__init__(name="ledger-load", daemon=True)

    def _connect(self) -> psycopg.Connection[Any]:
        deadline = time.monotonic() + 120
        while True:
            try:
                return psycopg.connect(self.url, autocommit=True)
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                self.stop.wait(0.1)  # no primary yet: the standby is being promoted

    def _run(self) -> None:
        conn = self._connect()
        seq = 0
        while not self.stop.is_set():
            seq += 1
            lines = self.rng.randint(1, 5)
            try:
                with conn.transaction():
                    conn.execute(
                        "INSERT INTO ledger (seq, line, note) SELECT %s, g, %s FROM generate_series(1, %s) g",
                        (seq, f"tx{seq}", lines),
                    )
                    updated = 0
                    if seq > 1 and self.rng.random() < 0.5:
                        updated = conn.execute(
                            "UPDATE ledger SET note = %s WHERE seq = %s AND line = 1", (f"tx{seq}", self.rng.randint(1, seq - 1))
                        ).rowcount
                    self.rows[seq] = lines + updated
            except psycopg.OperationalError:
                conn.close()
                self.reconnects += 1
                conn = self._connect()
                continue
            self.stop.wait(0.01)
        conn.close()


def _source(url: str) -> dict[tuple[int, int], str]:
    with psycopg.connect(url) as conn:
        return {(int(s), int(n)): str(note) for s, n, note in conn.execute("SELECT seq, line, note FROM ledger").fetchall()}


def _check_log(data_dir: Path, source: dict[tuple[int, int], str], load: LedgerLoad, context: str, *, resnapshot: bool) -> str:
    """The log against the new primary: replayed equal; every transaction the new primary has streamed
    once and whole (or, after a re-read, in the snapshot); none it lacks (unless a re-read superseded it);
    commit LSNs in order per partition. Returns the counts."""
    replayed = {
        (int(row["seq"]), int(row["line"])): str(row["note"])  # type: ignore[call-overload]
        for row in replay(data_dir, TOPIC).values()
    }
    missing = sorted(source.keys() - replayed.keys())[:5]
    extra = sorted(replayed.keys() - source.keys())[:5]
    wrong = sorted(k for k in source.keys() & replayed.keys() if source[k] != replayed[k])[:5]
    assert not missing and not extra and not wrong, f"{context}: missing {missing}, extra {extra}, different {wrong}"
    events: dict[int, int] = {}
    last_lsn: dict[int, int] = {}
    snapshot_point = 0
    for record in read_topic(data_dir, TOPIC):
        if record.value is None:
            continue
        value = orjson.loads(record.value)
        lsn = int(value["source"]["lsn"])
        if value["source"]["snapshot"] != "false":
            snapshot_point = max(snapshot_point, lsn + 1)
            continue
        assert lsn >= last_lsn.get(record.partition, 0), f"{context}: partition {record.partition} goes back to LSN {lsn}"
        last_lsn[record.partition] = lsn
        seq = int(value["after"]["note"].removeprefix("tx"))
        events[seq] = events.get(seq, 0) + 1
    kept = {seq for seq, _ in source}
    problems = [
        f"tx{seq}: {count} events for {load.rows.get(seq)} rows" for seq, count in events.items() if count != load.rows.get(seq)
    ]
    lost_in_log = sorted(seq for seq in events if seq not in kept)
    if not resnapshot:
        problems += [f"tx{seq}: on the new primary, not in the log" for seq in sorted(kept - events.keys())]
        problems += [f"tx{seq}: in the log, lost by the promotion" for seq in lost_in_log]
    assert not problems, f"{context}: {len(problems)} wrong transactions: {problems[:5]}"
    lost = sorted(load.rows.keys() - kept)
    return (
        f"rows {len(source)}, transactions on the new primary {len(kept)}, lost by the promotion {len(lost)} "
        f"(streamed into the log before the failover: {len(lost_in_log)}), streamed {len(events)}"
    )


def _starve_standby(pair: StandbyPair, data_dir: Path, rng: random.Random) -> tuple[int, int, Lsn]:
    """Stop the primary's walsender to the standby for a seeded second or two of load, then kill it: what
    it had not sent dies with the primary. Returns how far the standby was behind, the log's watermark,
    and what the standby had flushed."""
    with psycopg.connect(pair.primary.url(), autocommit=True) as conn:
        sender = conn.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (PHYSICAL_SLOT,)).fetchone()
        assert sender is not None and sender[0] is not None, "the standby does not stream"
        os.kill(int(sender[0]), signal.SIGSTOP)
        time.sleep(rng.uniform(1.0, 2.0))
        logged = watermark(data_dir) or 0
        flushed, written = conn.execute(
            "SELECT restart_lsn::text, pg_current_wal_lsn()::text FROM pg_replication_slots WHERE slot_name = %s",
            (PHYSICAL_SLOT,),
        ).fetchone()  # type: ignore[misc]
    os.kill(int(sender[0]), signal.SIGKILL)
    return Lsn.parse(written) - Lsn.parse(flushed), logged, Lsn.parse(flushed)


def _setup(env: dict[str, str], context: str) -> str:
    result = run_cdc(env, "setup")
    assert result.returncode == 0, f"{context}: cdc setup exited {result.returncode}: {result.stdout}{result.stderr}"
    return result.stdout


@pytest.mark.parametrize("run", [0, 1])
def test_failover_slots_keep_capture_going_across_a_promotion(run: int, tmp_path: Path, running: Running) -> None:
    """PostgreSQL 17: capture follows the promotion by itself and the log equals the new primary's tables."""
    rng = random.Random(SEED + run)
    context = f"seed {SEED} run {run}"
    started = time.monotonic()
    with _pair_or_skip(17) as pair:
        pair.start(DATABASE)
        url = pair.url(DATABASE)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE ledger (seq bigint, line int, note text NOT NULL, PRIMARY KEY (seq, line))")
        data_dir = tmp_path / "data"
        env = cdc_env(url, data_dir, standby_url=pair.standby.url(DATABASE))
        if run == 0:  # setup names each missing piece of the standby's settings, with its fix
            with psycopg.connect(pair.standby.url(), autocommit=True) as conn:
                conn.execute("ALTER SYSTEM SET hot_standby_feedback = off")
                conn.execute("SELECT pg_reload_conf()")
                poll(lambda: conn.execute("SHOW hot_standby_feedback").fetchone()[0] == "off", 10, "the reload")  # type: ignore[index]
                refused = run_cdc(env, "setup", "--check-only")
                assert refused.returncode != 0, f"{context}: {refused.stdout}"
                assert "hot_standby_feedback is off on the standby" in refused.stdout, refused.stdout
                assert "ALTER SYSTEM SET hot_standby_feedback = on" in refused.stdout, refused.stdout
                conn.execute("ALTER SYSTEM SET hot_standby_feedback = on")
                conn.execute("SELECT pg_reload_conf()")
                poll(lambda: conn.execute("SHOW hot_standby_feedback").fetchone()[0] == "on", 10, "the reload")  # type: ignore[index]
        if run == 1:  # a slot made before failover was configured: setup makes it a failover slot
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("SELECT pg_create_logical_replication_slot('cdc_slot', 'pgoutput')")
        out = _setup(env, context)
        ready = "warn failover: replication slot cdc_slot is no failover slot: `cdc setup` makes" if run else "ok   failover"
        assert ready in out, f"{context}: {out}"
        with psycopg.connect(url, autocommit=True) as conn:
            made = conn.execute("SELECT failover FROM pg_replication_slots WHERE slot_name = 'cdc_slot'").fetchone()
        assert made == (True,), f"{context}: setup left the slot without failover: {made}"
        capture = running.cdc(env, ["capture"], tmp_path / "capture.err")
        poll(lambda: first_reads_done(url, data_dir) or not capture.running(), 60, "the first reads")
        assert capture.running(), capture.stderr()
        with psycopg.connect(url, autocommit=True) as conn:
            failover = conn.execute("SELECT failover FROM pg_replication_slots WHERE slot_name = 'cdc_slot'").fetchone()
        assert failover == (True,), f"{context}: the slot is no failover slot: {failover}"
        load = LedgerLoad(url, rng)
        load.start()
        with psycopg.connect(pair.standby.url(DATABASE), autocommit=True) as standby:
            poll(
                lambda: (
                    standby.execute(
                        "SELECT synced AND NOT temporary FROM pg_replication_slots WHERE slot_name = 'cdc_slot'"
                    ).fetchone()
                    == (True,)
                ),
                60,
                "the slot to be synced to the standby",
            )
        if run == 0:  # lag names the server it reads and whether the slot survives a promotion
            lag = run_cdc(env, "lag", "--json")
            source = orjson.loads(lag.stdout)["source"]
            assert (source["server"], source["role"]) == (f"127.0.0.1:{pair.primary.port}", "primary"), source
            assert (source["failover"], source["synced_on_standby"]) == (True, True), source
            text = run_cdc(env, "lag").stdout
            assert re.search(r"failover-ready\W+yes \(failover slot, synced on the standby\)", text), text
        time.sleep(rng.uniform(0.5, 3.0))  # the seeded moment of the crash: the load and capture run meanwhile
        behind = 0
        if run == 1:  # the standby falls behind: what it lacks when the primary dies is lost by the promotion
            behind, logged, flushed = _starve_standby(pair, data_dir, rng)
            # synchronized_standby_slots: capture got nothing the standby has not flushed
            assert logged < flushed, f"{context}: the log is at {Lsn(logged)}, the standby has {flushed}"
        pair.fail_over()
        crashed = time.monotonic()
        with psycopg.connect(url, autocommit=True) as conn:
            assert conn.info.port == pair.standby.port
        promoted_at = wal_lsn(url)
        poll(lambda: (watermark(data_dir) or 0) >= promoted_at or not capture.running(), 90,
             "capture to stream from the new primary")  # fmt: skip
        assert capture.running(), f"{context}: capture exited: {capture.stderr()}"
        time.sleep(1.0)  # writes to the new primary while capture streams from it
        load.finish()
        assert load.reconnects >= 1, context
        assert capture.terminate() == 0, capture.stderr()
        drained = run_cdc(env, "capture", "--once")
        assert drained.returncode == 0, f"{context}: {drained.stderr}"
        reconnects = capture.stderr().count("reconnecting after")
        assert reconnects >= 1, capture.stderr()
        counts = _check_log(data_dir, _source(url), load, context, resnapshot=False)
        source = orjson.loads(run_cdc(env, "lag", "--json").stdout)["source"]
        assert (source["server"], source["role"], source["failover"]) == (f"127.0.0.1:{pair.standby.port}", "primary", True)
        if run == 0:  # the views, synced from the log, equal the new primary's tables
            verified = run_cdc(env, "verify", "warehouse", timeout=600)
            assert verified.returncode == 0, f"{context}: cdc verify: {verified.stdout}{verified.stderr}"
            assert re.search(r"warehouse equals the source: [1-9]\d* rows compared", verified.stdout), verified.stdout
            counts += f", {verified.stdout.strip().splitlines()[-1]}"
        took = f"{time.monotonic() - crashed:.1f} s from the crash to drained, {time.monotonic() - started:.1f} s in all"
        print(
            f"[failover seed={SEED} run={run}] PostgreSQL 17: {counts}, capture reconnects {reconnects}, "
            f"standby behind by {behind} bytes at the crash, {took}"
        )


def test_a_failover_without_failover_slots_stops_capture_and_setup_recovers_exactly(tmp_path: Path, running: Running) -> None:
    """PostgreSQL 16: the slot is lost by the promotion; capture says so in one line, and ``cdc setup`` +
    capture re-read the tables: the log replays to exactly the new primary's tables."""
    rng = random.Random(SEED + 16)
    context = f"seed {SEED}"
    with _pair_or_skip(16) as pair:
        pair.start(DATABASE)
        url = pair.url(DATABASE)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE ledger (seq bigint, line int, note text NOT NULL, PRIMARY KEY (seq, line))")
        data_dir = tmp_path / "data"
        env = cdc_env(url, data_dir)
        _setup(env, context)
        capture = running.cdc(env, ["capture"], tmp_path / "capture.err")
        poll(lambda: first_reads_done(url, data_dir) or not capture.running(), 60, "the first reads")
        load = LedgerLoad(url, rng)
        load.start()
        time.sleep(rng.uniform(0.5, 3.0))
        behind, _, _ = _starve_standby(pair, data_dir, rng)
        pair.fail_over()
        status = capture.wait(150)
        assert status != 0, f"{context}: capture exited 0 after losing its slot: {capture.stderr()}"
        errors = [line for line in capture.stderr().splitlines() if line.startswith("error:")]
        assert len(errors) == 1, f"{context}: {capture.stderr()}"
        assert "replication slot is gone" in errors[0] and "cdc setup" in errors[0], errors[0]
        time.sleep(1.0)  # writes to the new primary while nothing captures
        _setup(env, context)
        capture = running.cdc(env, ["capture"], tmp_path / "capture-again.err")
        target = wal_lsn(url)
        # the old log's watermark may already lie past the new primary's position (the standby was behind):
        # the new capture must have found the gap, read again and streamed past the target
        poll(
            lambda: (
                not capture.running()
                or (
                    "every captured table is read again" in capture.stderr()
                    and first_reads_done(url, data_dir)
                    and (watermark(data_dir) or 0) >= target
                )
            ),
            90,
            "capture to re-read and stream",
        )
        assert capture.running(), f"{context}: capture exited: {capture.stderr()}"
        load.finish()
        assert capture.terminate() == 0, capture.stderr()
        assert "every captured table is read again" in capture.stderr(), capture.stderr()
        drained = run_cdc(env, "capture", "--once")
        assert drained.returncode == 0, f"{context}: {drained.stderr}"
        counts = _check_log(data_dir, _source(url), load, context, resnapshot=True)
        print(
            f"[failover seed={SEED}] PostgreSQL 16: {counts}, standby behind by {behind} bytes at the crash; "
            f"capture stopped with: {errors[0]}"
        )
