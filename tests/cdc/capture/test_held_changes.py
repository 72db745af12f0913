"""The holding file of a read beside the stream: records come back in order, a reopen keeps exactly the
records of transactions the log's watermark covers, and a torn tail is cut at every byte."""

from __future__ import annotations

from pathlib import Path

from cdc.capture.held_changes import HeldChanges
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
