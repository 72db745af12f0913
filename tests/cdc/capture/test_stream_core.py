"""The streaming decisions without I/O (cdc.capture.stream_core): promise 1 and the loop's timing rules, driven
with plain values; the PostgreSQL tests (test_capture_pg, test_capture_cli, the fault suite) run the
same core behind a real replication connection."""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from cdc.capture.lsn import Lsn
from cdc.capture.stream_core import (
    AppendGroup,
    Command,
    Discover,
    Finish,
    Heartbeat,
    Retarget,
    SendStatus,
    Skip,
    StreamCore,
    StreamTuning,
    WriteSnapshot,
    group_position,
)


@dataclass(frozen=True)
class Tx:
    commit_lsn: int
    end_lsn: int
    change_count: int = 1


@dataclass(frozen=True)
class Snap:
    boundary: Lsn


def tx_at(commit: int, changes: int = 1) -> Tx:
    return Tx(commit, commit + 0x30, changes)


class Driver:
    """Carries commands out as Capture does, recording what the log and the server saw."""

    def __init__(self, core: StreamCore[Tx, Snap]) -> None:
        self.core = core
        self.durable_end = 0  # everything before it is in the log
        self.groups: list[list[Tx]] = []
        self.statuses: list[SendStatus] = []
        self.skipped: list[Tx] = []
        self.snapshots: list[Snap] = []
        self.heartbeats: list[Lsn] = []
        self.discoveries = 0
        self.finished = False

    def run(self, commands: Iterable[Command[Tx, Snap]]) -> None:
        for command in commands:
            match command:
                case AppendGroup(transactions=group):
                    self.groups.append(group)
                    self.durable_end = max(self.durable_end, group[-1].end_lsn)
                    self.status(self.core.group_durable(group))
                case Skip(transaction=tx):
                    self.skipped.append(tx)
                case WriteSnapshot(snapshot=snap):
                    self.snapshots.append(snap)
                    self.core.snapshot_durable(Lsn(snap.boundary - 1))
                case Heartbeat(end=end):
                    self.heartbeats.append(end)
                    self.durable_end = max(self.durable_end, end)
                    self.status(self.core.heartbeat_durable(end))
                case SendStatus():
                    self.status(command)
                case Discover():
                    self.discoveries += 1
                case Retarget():
                    self.core.retarget(self.core.server_end)
                case Finish(flushed=flushed):
                    self.status(SendStatus(flushed))
                    self.finished = True

    def status(self, status: SendStatus) -> None:
        self.statuses.append(status)

    def tick(self, now: float, *, got_frames: bool = False, stop: bool = False) -> None:
        self.run(self.core.tick(now, got_frames=got_frames, stop=stop, assembler_idle=True, wants_discovery=lambda: False))


TUNING = StreamTuning(batch_changes=100, batch_seconds=0.2, heartbeat_seconds=5, discover_seconds=5, status_seconds=10)


def test_a_group_is_confirmed_only_after_it_is_durable_and_at_its_end() -> None:
    core: StreamCore[Tx, Snap] = StreamCore(TUNING, Lsn(0))
    driver = Driver(core)
    driver.run(core.committed(tx_at(0x100), 1.0))
    driver.run(core.committed(tx_at(0x200), 1.0))
    assert driver.groups == [] and driver.statuses == []  # nothing is sent while the group fills
    driver.tick(1.05, got_frames=True)
    assert driver.groups == []
    driver.tick(1.1)  # a read came back empty: the group closes
    assert driver.groups == [[tx_at(0x100), tx_at(0x200)]]
    assert driver.statuses == [SendStatus(Lsn(0x230))]
    assert core.position == group_position(tx_at(0x200)) == 0x22F
    assert core.confirmed == core.position + 1


def test_transactions_the_log_holds_are_skipped_and_confirmed_without_a_group() -> None:
    core: StreamCore[Tx, Snap] = StreamCore(TUNING, Lsn(0x22F))  # a crash after the fsync, before the status
    driver = Driver(core)
    for commit in (0x100, 0x1FF):
        driver.run(core.committed(tx_at(commit), 1.0))
    driver.run(core.committed(tx_at(0x300), 1.0))
    driver.tick(1.1)
    assert driver.skipped == [tx_at(0x100), tx_at(0x1FF)]
    assert driver.groups == [[tx_at(0x300)]]


def test_a_group_closes_at_its_size_or_age_and_on_stop() -> None:
    core: StreamCore[Tx, Snap] = StreamCore(TUNING, Lsn(0))
    driver = Driver(core)
    driver.run(core.committed(tx_at(0x100, changes=60), 1.0))
    driver.tick(1.01, got_frames=True)
    driver.run(core.committed(tx_at(0x200, changes=60), 1.02))
    driver.tick(1.03, got_frames=True)  # 120 changes >= 100
    driver.run(core.committed(tx_at(0x300), 2.0))
    driver.tick(2.1, got_frames=True)
    driver.tick(2.2, got_frames=True)  # 0.2 s old
    driver.run(core.committed(tx_at(0x400), 3.0))
    driver.tick(3.01, got_frames=True, stop=True)
    assert [[t.commit_lsn for t in g] for g in driver.groups] == [[0x100, 0x200], [0x300], [0x400]]
    assert driver.finished


def test_an_idle_stream_heartbeats_to_the_server_end_and_once_drains_to_its_target() -> None:
    core: StreamCore[Tx, Snap] = StreamCore(TUNING, Lsn(0x0FF))
    driver = Driver(core)
    core.drain_to(0x900, retarget_at=50.0)
    core.begin_session(0.0)
    driver.run(core.keepalive(0x500, False, 1.0))
    driver.tick(1.0)
    assert driver.heartbeats == [] and driver.statuses == [SendStatus(Lsn(0), reply=True)]  # asks where WAL ends
    driver.tick(5.5)  # heartbeat due
    assert driver.heartbeats == [Lsn(0x500)] and core.position == 0x4FF and core.confirmed == 0x500
    driver.run(core.keepalive(0x900, False, 6.0))
    driver.tick(6.0)  # drained: the heartbeat reaches the target, then the session ends
    assert driver.heartbeats == [Lsn(0x500), Lsn(0x900)]
    assert driver.finished and driver.statuses[-1] == SendStatus(Lsn(0x900))


def test_a_waiting_snapshot_is_written_after_every_transaction_before_its_boundary() -> None:
    core: StreamCore[Tx, Snap] = StreamCore(TUNING, Lsn(0))
    driver = Driver(core)
    core.waiting.append(Snap(Lsn(0x250)))
    driver.run(core.committed(tx_at(0x100), 1.0))
    driver.run(core.committed(tx_at(0x300), 1.0))  # commits past the boundary
    assert driver.groups == [[tx_at(0x100)]] and driver.snapshots == [Snap(Lsn(0x250))]
    assert core.position == 0x24F and core.pending == [tx_at(0x300)]
    driver.tick(1.1)
    assert driver.groups[-1] == [tx_at(0x300)]


def test_once_lowers_its_target_to_the_flushed_wal() -> None:
    core: StreamCore[Tx, Snap] = StreamCore(TUNING, Lsn(0x0FF))
    driver = Driver(core)
    core.drain_to(0x10_000, retarget_at=2.0)
    driver.run(core.keepalive(0x400, False, 1.0))
    driver.tick(1.0)
    assert not driver.finished
    driver.tick(2.0)  # retarget to what the server flushed: drained at once
    assert core.target == 0x400 and driver.finished


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=2**32), st.integers(min_value=0, max_value=40))
def test_no_status_ever_confirms_past_what_is_durable(seed: int, resent: int) -> None:
    """Random interleavings of commits (some resent after a crash), keepalives, stops and passes of the
    loop: every status the server gets is at most the end of what the log holds."""
    rng = random.Random(seed)
    commits = [0x100 * (i + 1) for i in range(60)]
    position = Lsn(group_position(tx_at(commits[resent - 1]))) if resent else Lsn(0)
    core: StreamCore[Tx, Snap] = StreamCore(TUNING, position)
    driver = Driver(core)
    driver.durable_end = position + 1 if resent else 0
    now = 0.0
    for commit in commits:
        now += rng.random() / 10
        step = rng.random()
        if step < 0.2:
            driver.run(core.keepalive(commit, rng.random() < 0.5, now))
        driver.run(core.committed(tx_at(commit, rng.randint(1, 50)), now))
        if step > 0.6:
            driver.tick(now, got_frames=rng.random() < 0.7)
        for status in driver.statuses:
            assert status.flushed <= driver.durable_end
    driver.tick(now + 1, stop=True)
    assert driver.finished
    assert [t.commit_lsn for g in driver.groups for t in g] == commits[resent:]
    assert [t.commit_lsn for t in driver.skipped] == commits[:resent]
    assert all(status.flushed <= driver.durable_end for status in driver.statuses)
