"""The holding file of a read beside the stream: records come back in order, a reopen keeps exactly the
records of transactions the log's watermark covers, and a torn tail is cut at every byte."""

from __future__ import annotations

from pathlib import Path

from cdc.capture.held_changes import HeldChanges
from log_store import ProducerRecord


def _records(n: int) -> list[ProducerRecord]:
    return [
        ProducerRecord("cdc.public.t", b'{"id":%d}' % i, None if i % 3 == 0 else b'{"after":%d}' % i, 1000 + i, (("h", b"v"),))
        for i in range(n)
    ]


def test_records_come_back_in_order_and_a_filter_picks_by_lsn_and_key(tmp_path: Path) -> None:
    held = HeldChanges(tmp_path / "held" / "t.held")
    records = _records(6)
    for lsn, record in enumerate(records, start=100):
        held.add(lsn, [record])
    held.sync()
    assert list(held.records()) == records
    assert list(held.records(lambda lsn, key: lsn >= 103 or key == b'{"id":0}')) == [records[0], *records[3:]]
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
    return data
