"""The pipeline under real faults: ``kill -9`` of capture and of sync, a PostgreSQL restart, a full disk,
a replication slot dropped behind capture's back.

Every case runs ``cdc`` as subprocesses under a write load on the reference schema, and ends the same
way: the load stops, ``cdc capture --once`` drains, the log replayed from offset 0 equals the source row
for row and holds every transaction of the load once and whole, and ``cdc verify warehouse`` (a sync, then
the comparison: one Spark run, in the test session's Spark) exits 0 with every warehouse table as of the
log's watermark. Each case prints its counts (``-s`` shows them). Kill moments come from a seeded random
generator; the seed is printed and in every assertion message, and ``FAULTS_SEED=<n>`` draws the same
moments again.
"""

from __future__ import annotations

import concurrent.futures
import errno
import os
import random
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import psycopg
import pytest

from cdc.capture.lsn import Lsn
from local_servers.postgres import LocalPostgres
from tests.faults.harness import (
    CdcProcess,
    Load,
    Running,
    cdc_env,
    compare_log,
    poll,
    run_cdc,
    seed,
    slot_confirmed,
    transaction_differences,
    truncate_markers,
    verify_warehouse,
    wal_lsn,
    watermark,
)
from tests.fix_fs import SmallFilesystem
from tests.fix_pg import PgServer

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

T = TypeVar("T")

pytestmark = [pytest.mark.faults, pytest.mark.pg, pytest.mark.spark, pytest.mark.slow]

SEED = int(os.environ.get("FAULTS_SEED") or random.SystemRandom().randrange(1 << 32))
#: how many times each side is killed in the kill case; a soak run raises them
#: (``FAULTS_CAPTURE_KILLS=200 FAULTS_SYNC_KILLS=50``), every run draws new moments from its seed
CAPTURE_KILLS = int(os.environ.get("FAULTS_CAPTURE_KILLS") or 20)
SYNC_KILLS = int(os.environ.get("FAULTS_SYNC_KILLS") or 3)


class Phases:
    """Seconds each phase of a case took, for its report line."""

    def __init__(self) -> None:
        self.started = self.mark = time.monotonic()
        self.seconds: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self.mark
        self.mark = now

    def line(self) -> str:
        shown = " ".join(f"{name} {seconds:.0f}" for name, seconds in self.seconds.items())
        return f"{time.monotonic() - self.started:.0f} s ({shown})"


def _progress_past(data_dir: Path, position: int) -> bool:
    current = watermark(data_dir)
    return current is not None and current > position


def _stop_when_caught_up(capture: CdcProcess, data_dir: Path, load: Load, context: str, phases: Phases) -> None:
    """Stop the load, let the running capture hold its last transaction, then stop it (SIGTERM: exit 0)."""
    phases.lap("faults")
    load.finish()
    last = load.last_commit
    poll(
        lambda: (watermark(data_dir) or 0) + 1 >= last or not capture.running(),
        120,
        f"capture to hold the load's last commit {last} ({context})",
    )
    assert capture.running(), f"{context}: capture exited {capture.process.returncode}: {capture.stderr()}"
    status = capture.terminate()
    assert status == 0, f"{context}: capture exited {status} on SIGTERM: {capture.stderr()}"
    phases.lap("catch-up")


def _drain_check_and_report(
    case: str,
    context: str,
    env: dict[str, str],
    url: str,
    data_dir: Path,
    load: Load,
    phases: Phases,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    **counts: object,
) -> None:
    """The end of every case, once the load stopped: ``cdc capture --once`` drains; the log replayed from
    offset 0 equals the source row for row and holds every transaction of the load exactly once and
    whole; ``cdc verify warehouse`` passes with every table as of the log's watermark. Prints the counts
    (also in every assertion message)."""
    drained = run_cdc(env, "capture", "--once")
    assert drained.returncode == 0, f"{context}: cdc capture --once exited {drained.returncode}: {drained.stderr}"
    phases.lap("drain")
    context = f"{context}; {load.line()}"
    rows = compare_log(url, data_dir)
    assert not rows.differences, f"{context}; {rows.line()}; first differences: {rows.differences[:5]}"
    transactions, wrong = transaction_differences(data_dir, load)
    assert not wrong, f"{context}; transactions compared {transactions}, differences {len(wrong)}: {wrong[:5]}"
    phases.lap("replay")
    verified = verify_warehouse(url, data_dir, monkeypatch, capsys)
    assert verified.compared == rows.compared, f"{context}; {rows.line()}; {verified.line()}"
    phases.lap("verify")
    counts.update(
        rows_written=load.rows,
        transactions=load.transactions,
        large_transactions=load.big_transactions,
        rows_compared=rows.compared,
        transactions_compared=transactions,
        differences=len(rows.differences) + len(wrong),
        verify=verified.line(),
        seconds=phases.line(),
    )
    shown = ", ".join(f"{name.replace('_', ' ')} {value}" for name, value in counts.items())
    line = f"[faults seed={SEED}] {case}: {shown}"
    with capsys.disabled():  # verify's output was read through capsys
        print(line)


def _fill(filesystem: SmallFilesystem, capture: CdcProcess) -> Path | None:
    """Fill the filesystem but for 64 KiB (capture then runs out of room within a group or two); ``None``
    when capture's own writes filled it first (the load can outrun the polls on a slow machine): the disk
    is full either way."""
    try:
        return filesystem.fill(leave=64 << 10)
    except OSError as exc:
        if exc.errno == errno.ENOSPC and shutil.disk_usage(filesystem.path).free < 64 << 10:
            return None
        usage = subprocess.run(["df", "-h", str(filesystem.path)], capture_output=True, text=True).stdout
        files = subprocess.run(["du", "-a", str(filesystem.path)], capture_output=True, text=True).stdout
        raise AssertionError(f"could not fill {filesystem.path}: {exc}\n{usage}{files[-2000:]}{capture.stderr()}") from exc


@pytest.fixture
def running() -> Iterator[Running]:
    """What the test starts (loads, ``cdc`` processes), stopped at its end."""
    started = Running()
    yield started
    started.close()


# -- 1 + 2: kill -9 of capture and of sync under load ------------------------------------------------------


def test_kill_9_of_capture_and_of_sync_under_load_loses_and_doubles_nothing(
    reference_db: str,
    tmp_path: Path,
    running: Running,
    spark: SparkSession,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Capture is killed :data:`CAPTURE_KILLS` times while it starts, recovers and streams; meanwhile, once
    the snapshot is in the log, ``cdc sync warehouse --once`` is killed :data:`SYNC_KILLS` times at random
    moments after its Spark session is up, each kill followed by another sync. The two share one database,
    one load and one log."""
    phases = Phases()
    data_dir = tmp_path / "data"
    env = cdc_env(reference_db, data_dir)
    seed(reference_db, products=500, orders=150)
    load = running.load(reference_db, SEED, big_every=800, pace=0.04)
    context = f"seed {SEED}"
    capture_rng, sync_rng = random.Random(SEED), random.Random(SEED + 1)
    moments: dict[str, list[str]] = {"capture": [], "sync": []}
    failed = threading.Event()  # one side failed: the other stops before its next run

    def kill_captures() -> CdcProcess:
        for kill in range(CAPTURE_KILLS):
            assert not failed.is_set(), "stopped: killing sync failed"
            before = watermark(data_dir) or 0
            capture = running.cdc(env, ["capture"], tmp_path / f"capture-{kill}.err")
            if kill % 2:
                # a moment while it streams: after its first group, within the next second
                poll(lambda: _progress_past(data_dir, before) or not capture.running(), 120, "capture progress")
                moment, since = capture_rng.uniform(0.0, 1.0), "progress"
            else:
                # any moment of a run's first seconds: start-up, recovery of the log, the slot's resend, streaming
                moment, since = capture_rng.uniform(0.0, 2.5), "start"
            try:
                capture.process.wait(moment)
            except subprocess.TimeoutExpired:
                pass
            assert capture.kill9(), f"{context}: capture {kill} exited by itself: {capture.stderr()}"
            moved = "+" if (watermark(data_dir) or 0) > before else ""
            moments["capture"].append(f"{since}+{moment:.2f}s{moved}")
        # the last restart streams on while sync is killed, so that every sync finds new events
        return running.cdc(env, ["capture"], tmp_path / "capture-last.err")

    def kill_syncs() -> int:
        poll(lambda: load.note_first_reads(data_dir), 180, "the first reads in the log")
        work = 0.0
        for name in ("first", "second"):
            # the first sync writes the snapshot; the second, like every later one, what came since: how
            # long it works once its session is up is the range of the kill moments
            complete = running.cdc(env, ["sync", "warehouse", "--once"], tmp_path / f"sync-{name}.err")
            poll(lambda: "view job" in complete.stderr() or not complete.running(), 180, f"the {name} sync's Spark session")
            working = time.monotonic()
            assert complete.wait(300) == 0, f"{context}: the {name} sync failed: {complete.stderr()}"
            work = time.monotonic() - working
        kills, runs = 0, 1
        while kills < SYNC_KILLS:
            assert not failed.is_set(), "stopped: killing capture failed"
            runs += 1
            sync = running.cdc(env, ["sync", "warehouse", "--once"], tmp_path / f"sync-{runs}.err")
            poll(lambda: "view job" in sync.stderr() or not sync.running(), 180, "a sync's Spark session")
            moment = sync_rng.uniform(0.0, work)
            try:
                sync.process.wait(moment)
            except subprocess.TimeoutExpired:
                pass
            if sync.kill9():
                kills += 1
                moments["sync"].append(f"{moment:.2f}s")
            else:
                assert sync.process.returncode == 0, f"{context}: sync {runs} failed: {sync.stderr()}"
                moments["sync"].append(f"({moment:.2f}s: it had ended)")
        return runs + 1

    def failing(side: Callable[[], T]) -> Callable[[], T]:
        def run() -> T:
            try:
                return side()
            except BaseException:
                failed.set()
                raise

        return run

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        captures, syncs = pool.submit(failing(kill_captures)), pool.submit(failing(kill_syncs))
    last, sync_runs = captures.result(), syncs.result()
    with capsys.disabled():
        print(f"\n[faults seed={SEED}] capture kill moments (+: the log moved in that run): {' '.join(moments['capture'])}")
        print(f"[faults seed={SEED}] sync kill moments after its Spark session was up: {' '.join(moments['sync'])}")
    context = f"seed {SEED}, capture kills {CAPTURE_KILLS}, sync kills {SYNC_KILLS} in {sync_runs} runs"
    position = watermark(data_dir) or 0
    poll(lambda: _progress_past(data_dir, position) or not last.running(), 120, "capture progress after the last restart")
    _stop_when_caught_up(last, data_dir, load, context, phases)
    _drain_check_and_report(
        "kill -9 of capture and of sync",
        context,
        env,
        reference_db,
        data_dir,
        load,
        phases,
        capsys,
        monkeypatch,
        capture_kills=CAPTURE_KILLS,
        sync_kills=SYNC_KILLS,
        sync_runs=sync_runs,
    )


# -- 3: PostgreSQL restarted while capture streams ---------------------------------------------------------


@pytest.fixture
def restartable(pg_server: PgServer, reference_db: str) -> Iterator[tuple[str, LocalPostgres]]:
    """A migrated database on a server this test may restart: the session's local cluster, or a cluster
    of its own when the session's server is not one."""
    if pg_server.local is not None:
        yield reference_db, pg_server.local
        return
    from cdc.setup import migrate

    server = LocalPostgres()
    try:
        url = server.start()
    except Exception as exc:  # noqa: BLE001 - no server binaries here
        pytest.skip(f"no local PostgreSQL to restart: {exc}")
    try:
        migrate.upgrade(url)
        yield url, server
    finally:
        server.stop()


def test_a_postgresql_restart_mid_stream_loses_nothing(
    restartable: tuple[str, LocalPostgres],
    tmp_path: Path,
    running: Running,
    spark: SparkSession,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``pg_ctl restart`` twice while capture streams under load: a clean (fast) shutdown, then an
    immediate one (a crash: the server recovers from its WAL and the slot may have to resend). Capture
    keeps running, reconnects and goes on."""
    phases = Phases()
    url, server = restartable
    data_dir = tmp_path / "data"
    env = cdc_env(url, data_dir)
    seed(url, products=300, orders=100)
    context = f"seed {SEED}"
    load = running.load(url, SEED)
    capture = running.cdc(env, ["capture"], tmp_path / "capture.err")
    for mode in ("fast", "immediate"):
        position = watermark(data_dir) or 0
        poll(lambda: _progress_past(data_dir, position) or not capture.running(), 120, "capture progress")
        assert capture.running(), f"{context}: capture exited: {capture.stderr()}"
        server.restart(mode)
        after = wal_lsn(url)
        # capture reconnects by itself: commits made after the restart reach the log
        poll(
            lambda: _progress_past(data_dir, after) or not capture.running(),
            180,
            f"capture to stream past {after} after a {mode} restart",
        )
        assert capture.running(), f"{context}: capture exited after a {mode} restart: {capture.stderr()}"
    poll(lambda: load.note_first_reads(data_dir) or not capture.running(), 120, "the first reads")
    _stop_when_caught_up(capture, data_dir, load, context, phases)
    reconnects = capture.stderr().count("reconnecting after")
    assert reconnects >= 2, f"{context}: {capture.stderr()}"
    _drain_check_and_report(
        "PostgreSQL restarted mid-stream",
        context,
        env,
        url,
        data_dir,
        load,
        phases,
        capsys,
        monkeypatch,
        restarts="fast + immediate",
        capture_reconnects=reconnects,
        load_reconnects=load.reconnects,
    )


# -- 4: a full disk while capture streams ------------------------------------------------------------------


def test_a_full_disk_while_streaming_under_load_loses_nothing(
    reference_db: str,
    small_filesystem: SmallFilesystem,
    tmp_path: Path,
    running: Running,
    spark: SparkSession,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``CDC_DATA_DIR`` on a tmpfs that fills up while capture streams under load: capture exits 5 with
    one error line, the slot confirmed no further than the log holds; with the filler file deleted,
    capture goes on from there."""
    phases = Phases()
    small_filesystem.resize("32m")
    data_dir = small_filesystem.path / "data"
    env = cdc_env(reference_db, data_dir)
    seed(reference_db, products=300, orders=100)
    context = f"seed {SEED}"
    load = running.load(reference_db, SEED)
    capture = running.cdc(env, ["capture"], tmp_path / "capture.err")
    poll(lambda: load.note_first_reads(data_dir) or not capture.running(), 120, "the first reads")
    position = watermark(data_dir) or 0
    poll(lambda: _progress_past(data_dir, position) or not capture.running(), 120, "capture streaming")
    filler = _fill(small_filesystem, capture)
    status = capture.wait(120)
    stderr = capture.stderr()
    lines = [line for line in stderr.strip().splitlines() if not line.startswith("ts=")]
    assert status == 5 and len(lines) == 1 and lines[0].startswith("error: "), f"{context}: exit {status}: {stderr}"
    assert "no space left" in lines[0] and str(data_dir / "log") in lines[0], lines[0]
    assert "nothing was confirmed to the source past LSN" in lines[0], lines[0]
    confirmed, held = slot_confirmed(reference_db), watermark(data_dir)
    assert confirmed is not None and held is not None and confirmed <= held + 1, (
        f"{context}: the slot is confirmed at {confirmed}, past what the log holds ({Lsn(held or 0)})"
    )
    if filler is not None:
        filler.unlink()
    else:
        small_filesystem.resize("64m")
    capture = running.cdc(env, ["capture"], tmp_path / "capture-resumed.err")
    position = watermark(data_dir) or 0
    poll(lambda: _progress_past(data_dir, position) or not capture.running(), 120, "capture after the disk got room")
    _stop_when_caught_up(capture, data_dir, load, context, phases)
    small_filesystem.resize("512m")  # room for the warehouse's tables
    _drain_check_and_report(
        "full disk while streaming", context, env, reference_db, data_dir, load, phases, capsys, monkeypatch, capture_exit=status
    )


# -- 5: the slot dropped while capture is stopped ----------------------------------------------------------


def test_a_slot_dropped_behind_captures_back_is_superseded_by_a_new_snapshot(
    reference_db: str,
    tmp_path: Path,
    running: Running,
    spark: SparkSession,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The slot is dropped while capture is stopped and the load goes on; ``cdc setup`` makes a new one.
    What committed in between is in no slot's stream: capture takes a new snapshot whose truncate markers
    supersede the log's rows."""
    phases = Phases()
    data_dir = tmp_path / "data"
    env = cdc_env(reference_db, data_dir)
    seed(reference_db, products=300, orders=100)
    context = f"seed {SEED}"
    load = running.load(reference_db, SEED)
    capture = running.cdc(env, ["capture"], tmp_path / "capture.err")
    poll(lambda: load.note_first_reads(data_dir) or not capture.running(), 120, "the first reads")
    position = watermark(data_dir) or 0
    poll(lambda: _progress_past(data_dir, position) or not capture.running(), 120, "capture streaming")
    assert capture.terminate() == 0, capture.stderr()
    with psycopg.connect(reference_db, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot('cdc_slot')")
    written = load.transactions
    poll(lambda: load.transactions >= written + 100, 60, "writes while there is no slot")
    setup = run_cdc(env, "setup")
    assert setup.returncode == 0, setup.stdout + setup.stderr
    capture = running.cdc(env, ["capture"], tmp_path / "capture-again.err")
    poll(lambda: all(truncate_markers(data_dir).values()) or not capture.running(), 120, "every table read again")
    load.reads_end = 0  # transactions before the ends of these reads may be in their rows, in part
    poll(lambda: load.note_first_reads(data_dir) or not capture.running(), 120, "the reads again")
    _stop_when_caught_up(capture, data_dir, load, context, phases)
    assert "every captured table is read again, superseding the log's rows" in capture.stderr(), capture.stderr()
    markers = truncate_markers(data_dir)
    assert all(markers.values()), f"{context}: no truncate marker superseding the topics' rows: {markers}"
    _drain_check_and_report(
        "slot dropped while capture was stopped",
        context,
        env,
        reference_db,
        data_dir,
        load,
        phases,
        capsys,
        monkeypatch,
        resnapshots=1,
        truncate_markers=sum(markers.values()),
    )
