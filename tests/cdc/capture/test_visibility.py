"""Which committed transactions a snapshot sees, judged from the stream's 32-bit IDs (pure, no database)."""

from __future__ import annotations

from cdc.capture.visibility import SnapshotXids


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
