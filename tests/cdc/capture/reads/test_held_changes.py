"""The holding file of a read beside the stream: records come back in order, a reopen keeps exactly the
records of transactions the log's watermark covers, and a torn tail is cut at every byte."""

from __future__ import annotations

from pathlib import Path

from cdc.capture.reads.held_changes import HeldChanges
from cdc.capture.visibility import SnapshotXids
from log_store import ProducerRecord


def _records(n: int) -> list[ProducerRecord]:
    return [
        ProducerRecord("cdc.public.t", b'{"id":%d}' % i, None if i % 3 == 0 else b'{"after":%d}' % i, 1000 + i, (("h", b"v"),))
        for i in range(n)
    ]


def test_records_come_back_in_order_marked_with_the_first_run_that_sees_them(tmp_path: Path) -> None:
    held = HeldChanges(tmp_path / "held" / "t.held")
    held.run_started(0, SnapshotXids(100, 105, frozenset({102})))  # sees 99, 100, 101, 103, 104
    held.run_started(1, SnapshotXids(102, 110))  # sees up to 109
    records = _records(6)
    for xid, record in zip((99, 102, 104, 105, 112, None), records, strict=True):
        held.add(1000 + len(record.topic), [record], xid)
    held.sync()
    assert list(held.records()) == records
    runs = [run for run in range(3) for _ in held.records(lambda r, key, run=run: r == run)]  # type: ignore[misc]
    assert runs == [0, 0, 1, 1, 2, 2]  # 99 and 104 by run 0, 102 and 105 by run 1, the rest by the next
    assert list(held.records(lambda run, key: run >= 1 or key == b'{"id":0}')) == [records[0], *records[1:2], *records[3:]]
    assert (tmp_path / "held" / "t.held").stat().st_mode & 0o777 == 0o600
    held.discard()
    assert not (tmp_path / "held" / "t.held").exists()


def test_a_reopen_keeps_the_records_the_watermark_covers_and_cuts_a_torn_tail_at_every_byte(tmp_path: Path) -> None:
    path = tmp_path / "t.held"
    records = _records(4)
    held = HeldChanges(path)
    for lsn, record in zip((10, 20, 20, 30), records, strict=True):
        held.add(lsn, [record])
    held.sync()
    whole = path.read_bytes()
    held.discard()
    path.write_bytes(whole)
    reopened = HeldChanges.reopen(path, 20)  # the transaction at 30 is not in the log: the slot sends it again
    assert list(reopened.records()) == records[:3] and reopened.count == 3
    reopened.add(25, [records[3]])
    assert list(reopened.records()) == records
    reopened.discard()
    # a crash mid-write leaves any prefix of the last entry: it is cut, the whole entries stay
    first_three = len(whole) - len(_entry_bytes(tmp_path, 30, records[3]))
    for cut in range(first_three, len(whole)):
        path.write_bytes(whole[:cut])
        torn = HeldChanges.reopen(path, 1 << 62)
        assert list(torn.records()) == records[:3], cut
        assert path.stat().st_size == first_three
        torn.discard()


def _entry_bytes(tmp_path: Path, lsn: int, record: ProducerRecord) -> bytes:
    single = HeldChanges(tmp_path / "single.held")
    single.add(lsn, [record])
    single.sync()
    data = single.path.read_bytes()
    single.discard()
    return data[len(b"CDCHELD2") :]  # past the file's magic


def test_a_file_of_another_layout_is_emptied_when_reopened(tmp_path: Path) -> None:
    path = tmp_path / "old.held"
    path.write_bytes(b"\x00" * 40)
    reopened = HeldChanges.reopen(path, 1 << 62)
    assert list(reopened.records()) == [] and reopened.count == 0
    reopened.add(5, _records(1))
    assert list(reopened.records()) == _records(1)
    reopened.discard()


def test_a_cap_that_lowers_marks_lasts_through_a_reopen(tmp_path: Path) -> None:
    """A run that wrote nothing gives its number to the next, whose snapshot sees what the file holds: the
    records marked for a later run are read as that run's, also by a process that reopens the file with
    the caps kept in the read's progress."""
    path = tmp_path / "t.held"
    records = _records(3)
    held = HeldChanges(path)
    held.run_started(0, SnapshotXids(10, 10))
    held.run_started(1, SnapshotXids(20, 20))  # wrote nothing
    held.add(100, [records[0]], 25)  # unseen: marked 2
    held.run_started(1, SnapshotXids(30, 30), taken_now=True)  # run 1 again, from a later snapshot
    held.add(101, [records[1]], 26)  # seen by the new run 1
    held.add(102, [records[2]], 35)  # unseen: marked 2
    held.sync()
    marks = [
        run for record in held.records() for run in range(3) if list(held.records(lambda r, k, run=run: r == run)).count(record)
    ]  # type: ignore[misc]
    assert marks == [1, 1, 2]
    caps = tuple(held.lasting_caps)
    held.close()
    reopened = HeldChanges.reopen(path, 1 << 62, next_run=2)
    reopened.remember((), caps)
    assert [
        run
        for record in reopened.records()
        for run in range(3)
        if list(reopened.records(lambda r, k, run=run: r == run)).count(record)
    ] == [1, 1, 2]  # type: ignore[misc]
    reopened.discard()


def _marks(held: HeldChanges, runs: int) -> list[int]:
    """The run each record is read as marked with, in the file's order."""
    marked: dict[bytes | None, int] = {}
    for run in range(runs):
        for record in held.records(lambda r, key, run=run: r == run):  # type: ignore[misc]
            marked[record.key] = run
    return [marked[record.key] for record in held.records()]


def test_only_a_truncate_marker_starts_the_read_over_not_a_keyless_tables_changes(tmp_path: Path) -> None:
    """A keyless table's changes have a null key, as a truncate marker has on a log whose records take an
    explicit partition: only the marker (``op`` ``"t"``, or a truncate key) marks the held changes truncated,
    also when a reopen reads them back."""
    from event_format import truncate_key

    path = tmp_path / "t.held"
    change = ProducerRecord("cdc.public.ledger", None, b'{"before":null,"after":{"tid":1},"op":"c"}', 1000, ())
    marker = ProducerRecord("cdc.public.ledger", None, b'{"before":null,"after":null,"op":"t"}', 1001, ())
    held = HeldChanges(path)
    held.add(10, [change, change])
    assert not held.truncated
    held.add(20, [marker])
    assert held.truncated
    held.sync()
    assert HeldChanges.reopen(path, 20).truncated
    assert not HeldChanges.reopen(path, 10).truncated  # the marker's transaction cut off: changes alone
    keyed = HeldChanges(tmp_path / "k.held")
    keyed.add(30, [ProducerRecord("cdc.public.t", truncate_key(0), b'{"op":"t"}', 1002, ())])
    assert keyed.truncated
