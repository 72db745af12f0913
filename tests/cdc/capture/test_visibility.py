"""Which committed transactions a snapshot sees, judged from the stream's 32-bit IDs (pure, no database), and
the received IDs kept bounded (the server's snapshot now is read from PostgreSQL in one test)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import psycopg

from cdc.capture.catalog import Catalog
from cdc.capture.lsn import Lsn
from cdc.capture.reads.read_settings import ReadStats, ReadTuning
from cdc.capture.reads.scheduler import ReadScheduler
from cdc.capture.stream_core import StreamCore, StreamTuning
from cdc.capture.streaming import Transaction
from cdc.capture.table_snapshots import PendingSnapshot
from cdc.capture.visibility import ReceivedXids, SnapshotXids


def test_a_snapshot_sees_ids_below_xmin_and_those_below_xmax_not_in_progress() -> None:
    snapshot = SnapshotXids.parse("100:105:100,103")
    assert snapshot == SnapshotXids(100, 105, frozenset({100, 103}))
    assert [xid for xid in range(95, 110) if snapshot.sees(xid)] == [95, 96, 97, 98, 99, 101, 102, 104]
    assert SnapshotXids.parse("7:7:").sees(6) and not SnapshotXids.parse("7:7:").sees(7)


def test_the_stream_ids_are_placed_in_the_snapshot_epoch_across_a_wraparound() -> None:
    epoch = 1 << 32
    snapshot = SnapshotXids(epoch + 3, epoch + 10, frozenset({epoch + 5}))  # epoch 1, IDs 3 to 10
    assert snapshot.sees(epoch - 20 & 0xFFFFFFFF)  # 4294967276 of epoch 0: long committed
    assert snapshot.sees(4) and not snapshot.sees(5) and not snapshot.sees(10) and not snapshot.sees(11)
    late = SnapshotXids(epoch * 2 - 20, epoch * 2 - 10)  # the epoch ends just after the snapshot
    assert not late.sees(3) and not late.sees(0xFFFFFFF7) and late.sees(0xFFFFFFF0 - 20)
    before = SnapshotXids(epoch - 10, epoch + 2)  # the wraparound happens inside the snapshot
    assert before.sees(0xFFFFFFF8) and before.sees(1) and not before.sees(2) and not before.sees(3)


class _Server:
    """The catalog as discovery asks it: no table to read; a snapshot now sees every transaction committed
    so far but the ``invisible`` ones (commit records written, not made visible yet)."""

    def __init__(self) -> None:
        self.next_xid = 1_000
        self.invisible: frozenset[int] = frozenset()

    def published_tables(self, publication: str) -> list[object]:
        return []

    def current_snapshot(self) -> SnapshotXids:
        return SnapshotXids(min(self.invisible, default=self.next_xid), self.next_xid, self.invisible)


def _scheduler(server: _Server, received: ReceivedXids, tmp_path: Path) -> ReadScheduler:
    settings = SimpleNamespace(
        database_url="", publication="cdc_publication", slot="cdc_slot", data_dir=tmp_path, snapshot_concurrency=1,
        snapshot_sessions=1, snapshot_rows_per_second=0, request_key_bytes=None,
    )  # fmt: skip
    core: StreamCore[Transaction, PendingSnapshot] = StreamCore(StreamTuning(), Lsn(0x1000))
    return ReadScheduler(settings, ReadTuning(), ReadStats(), server, core, received, lambda written: None)  # type: ignore[arg-type]


def test_the_received_ids_stay_bounded_over_many_transactions_without_a_read(tmp_path: Path) -> None:
    """The stream adds every transaction's ID; with no read beside it for months, discovery still forgets
    those the server sees, so capture's memory stays flat (promise 11)."""
    server, received = _Server(), ReceivedXids(forget_after=1_000)
    scheduler = _scheduler(server, received, tmp_path)
    largest = 0
    for _ in range(200):  # 200 discoveries, 100 transactions between two: 20,000 transactions
        for _ in range(100):
            received.add(server.next_xid)
            server.next_xid += 1
        scheduler.discover()
        largest = max(largest, len(received))
    assert largest <= 1_100
    assert len(received) < 1_100


def test_ids_a_snapshot_does_not_see_yet_are_kept_and_do_not_make_every_discovery_ask(tmp_path: Path) -> None:
    server, received = _Server(), ReceivedXids(forget_after=1_000)
    for _ in range(1_000):
        received.add(server.next_xid)
        server.next_xid += 1
    server.invisible = frozenset({server.next_xid - 2, server.next_xid - 1})  # a synchronous standby holds them back
    asked = 0
    snapshot = server.current_snapshot

    def counted() -> SnapshotXids:
        nonlocal asked
        asked += 1
        return snapshot()

    server.current_snapshot = counted  # type: ignore[method-assign]
    scheduler = _scheduler(server, received, tmp_path)
    scheduler.discover()
    assert (asked, len(received)) == (1, 2)
    received.add(server.next_xid)
    scheduler.discover()
    assert asked == 1  # the two kept do not count towards the next pruning
    # a read's snapshot that sees them still makes sure: those it sees are forgotten, none is unseen
    assert received.unseen_by(SnapshotXids(server.next_xid + 1, server.next_xid + 1)) == 0 and not received


def test_the_server_snapshot_now_sees_what_committed_and_not_what_is_open(pg_url: str) -> None:
    catalog = Catalog(pg_url)
    try:
        with psycopg.connect(pg_url, autocommit=True) as conn, psycopg.connect(pg_url) as open_conn:
            committed = int(conn.execute("SELECT pg_current_xact_id()::text").fetchone()[0])  # type: ignore[index]
            running = int(open_conn.execute("SELECT pg_current_xact_id()::text").fetchone()[0])  # type: ignore[index]
            snapshot = catalog.current_snapshot()
            assert snapshot.sees(committed & 0xFFFFFFFF) and not snapshot.sees(running & 0xFFFFFFFF)
            open_conn.rollback()
    finally:
        catalog.close()
