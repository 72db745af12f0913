"""The watermark file: a crash at any byte keeps the previous watermark; damage is never skipped."""

from __future__ import annotations

from pathlib import Path

import pytest

from log_store.errors import CorruptWatermarkError
from log_store.record import TopicPartition
from log_store.watermark import (
    FILE_HEADER_SIZE,
    PUB_HEADER_SIZE,
    PUBLISHED_NAME,
    Watermark,
    WatermarkLog,
    encode_record,
    read_published,
)

A0, A1, B0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)


def _wm(seq: int) -> Watermark:
    return Watermark(seq, f"{seq:016X}", 1000 + seq, {A0: seq * 3, A1: seq, B0: 7})


def _log(tmp_path: Path, count: int, roll_bytes: int = 1 << 20) -> WatermarkLog:
    path = tmp_path / "watermarks.log"
    WatermarkLog.create(path)
    log = WatermarkLog(path, roll_bytes)
    log.open_for_append()
    for seq in range(1, count + 1):
        log.append(_wm(seq))
        log.publish(_wm(seq))
    return log


def test_payload_round_trip() -> None:
    watermark = _wm(5)
    assert Watermark.decode(watermark.encode()) == watermark
    assert watermark.end_offset(TopicPartition("zz", 0)) == 0


def test_truncation_at_every_byte_keeps_the_previous_watermark(tmp_path: Path) -> None:
    log = _log(tmp_path, 3)
    log.close()
    data = log.path.read_bytes()
    last = len(encode_record(_wm(3)))
    for cut in range(len(data) - last, len(data) + 1):
        log.path.write_bytes(data[:cut])
        scan = WatermarkLog(log.path).scan()
        expected = 3 if cut == len(data) else 2
        assert scan.latest == _wm(expected), cut
        assert scan.valid_end + scan.torn_bytes == cut


def test_writer_truncates_a_torn_tail_and_continues(tmp_path: Path) -> None:
    log = _log(tmp_path, 2)
    log.close()
    log.path.write_bytes(log.path.read_bytes() + b"\x00\x00\x01")
    again = WatermarkLog(log.path)
    scan = again.open_for_append()
    assert (scan.latest, scan.torn_bytes) == (_wm(2), 3)
    again.append(_wm(3))
    again.close()
    assert WatermarkLog(log.path).scan().latest == _wm(3)


def test_damage_followed_by_valid_records_is_an_error(tmp_path: Path) -> None:
    log = _log(tmp_path, 3)
    log.close()
    data = bytearray(log.path.read_bytes())
    data[FILE_HEADER_SIZE + 12] ^= 0x01  # inside the first record's payload
    log.path.write_bytes(bytes(data))
    with pytest.raises(CorruptWatermarkError) as caught:
        WatermarkLog(log.path).scan()
    assert caught.value.position == FILE_HEADER_SIZE and str(log.path) in str(caught.value)


def test_roll_keeps_the_two_latest_records(tmp_path: Path) -> None:
    log = _log(tmp_path, 50, roll_bytes=600)
    log.close()
    assert log.path.stat().st_size <= 600 + 2 * len(encode_record(_wm(50)))
    scan = WatermarkLog(log.path).scan()
    assert (scan.latest, scan.previous) == (_wm(50), _wm(49))


def test_published_slots_survive_a_torn_slot(tmp_path: Path) -> None:
    log = _log(tmp_path, 4)
    log.close()
    pub = tmp_path / PUBLISHED_NAME
    assert read_published(pub) == _wm(4)
    assert WatermarkLog(log.path).latest() == _wm(4)
    data = bytearray(pub.read_bytes())
    data[PUB_HEADER_SIZE + 10] ^= 0x40  # slot 0 holds sequence 4: tear it
    pub.write_bytes(bytes(data))
    assert read_published(pub) == _wm(3)


def test_published_file_grows_its_slots(tmp_path: Path) -> None:
    path = tmp_path / "watermarks.log"
    WatermarkLog.create(path)
    log = WatermarkLog(path)
    log.open_for_append()
    log.publish(None)
    assert log.latest() is None
    big = Watermark(1, "p", 0, {TopicPartition(f"topic-{i}", 0): i for i in range(200)})
    log.append(big)
    log.publish(big)
    log.close()
    assert WatermarkLog(path).latest() == big
