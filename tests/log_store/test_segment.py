"""Segment files: naming, reads through the index, and damage that must never be returned as data."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from log_store import LogStore, TopicPartition
from log_store.batch_encoding import Columns
from log_store.errors import CorruptSegmentError
from log_store.offset_index import OffsetIndex, index_path
from log_store.record import ProducerRecord
from log_store.segment import (
    FILE_HEADER_SIZE,
    ActiveSegment,
    SegmentFile,
    list_segments,
    log_name,
    parse_log_name,
)
from tests.log_store.helpers import read_all, rec, segment_files, small_config

TP = TopicPartition("t", 0)


def _filled(root: Path, groups: int = 30) -> LogStore:
    log = LogStore.open(root, small_config(), writer=True)
    log.ensure_topic("t", 1)
    for g in range(groups):
        log.append_group([rec("t", f"k{i}", f"value-{g}-{i}" * 3) for i in range(8)], f"{g:016X}")
    return log


def test_names_sort_by_offset(tmp_path: Path) -> None:
    assert log_name(1234) == "00000000000000001234.log"
    assert parse_log_name("00000000000000001234.log") == 1234
    assert parse_log_name("00000000000000001234.index") is None
    assert parse_log_name("junk.log") is None
    for base in (0, 9, 10, 100):
        (tmp_path / log_name(base)).touch()
    (tmp_path / "00000000000000000005.log.cleaned").touch()
    assert list_segments(tmp_path) == [0, 9, 10, 100]


def test_active_segment_writes_header_index_and_batches(tmp_path: Path) -> None:
    segment = ActiveSegment.create(tmp_path, 40, index_interval_bytes=1)
    for base in (40, 42, 44):
        batch = Columns([ProducerRecord("t", b"k", b"v", 1)] * 2).encode(base, 0, 2, 5)
        segment.append([batch], len(batch), base, 5)
    segment.seal()
    segment.close()
    reader = SegmentFile(tmp_path / log_name(40), 40)
    try:
        assert [r.offset for r in reader.read("t", 0, 43, 1000, 10, sealed=True)] == [43, 44, 45]
        assert [r.offset for r in reader.read("t", 0, 0, 44, 10, sealed=False)] == [40, 41, 42, 43]
        index = OffsetIndex.load(index_path(tmp_path / log_name(40)), reader.nonce)
        assert index is not None and list(index.offsets) == [2, 4]  # every batch after the first
        assert reader.locate(45) > reader.locate(41) == FILE_HEADER_SIZE
    finally:
        reader.close()


def test_reads_cross_segments(tmp_path: Path) -> None:
    with _filled(tmp_path) as log:
        assert len(segment_files(tmp_path, "t", 0)) > 3
        records = read_all(log, "t")
        assert [r.offset for r in records] == list(range(240))
        assert [r.offset for r in log.read(TP, 117, max_records=5)] == [117, 118, 119, 120, 121]


def test_max_bytes_returns_at_least_one_record(tmp_path: Path) -> None:
    with _filled(tmp_path) as log:
        assert len(log.read(TP, 0, max_bytes=1)) == 1
        some = log.read(TP, 0, max_bytes=200)
        assert 1 < len(some) < 10


def test_every_flipped_byte_of_a_sealed_segment_is_reported(tmp_path: Path) -> None:
    _filled(tmp_path).close()
    sealed = segment_files(tmp_path, "t", 0)[1]
    original = sealed.read_bytes()
    rng = random.Random(7)
    positions = sorted(rng.sample(range(len(original)), 60)) + [0, 27, 28, len(original) - 1]
    for position in positions:
        damaged = bytearray(original)
        damaged[position] ^= 1 << rng.randrange(8)
        sealed.write_bytes(bytes(damaged))
        reader = LogStore.open(tmp_path)
        with pytest.raises(CorruptSegmentError) as caught:
            read_all(reader, "t")
        reader.close()
        assert caught.value.path == sealed
        assert str(sealed) in str(caught.value) and "\n" not in str(caught.value)
    sealed.write_bytes(original)
    with LogStore.open(tmp_path) as reader:
        assert len(read_all(reader, "t")) == 240


def test_reads_before_the_damage_still_work(tmp_path: Path) -> None:
    _filled(tmp_path).close()
    files = segment_files(tmp_path, "t", 0)
    damaged = bytearray(files[2].read_bytes())
    damaged[-5] ^= 0xFF
    files[2].write_bytes(bytes(damaged))
    first_of_damaged = int(files[2].name[:20])
    with LogStore.open(tmp_path) as reader:
        assert len(reader.read(TP, 0, max_records=first_of_damaged)) == first_of_damaged
        with pytest.raises(CorruptSegmentError) as caught:
            reader.read(TP, first_of_damaged, max_records=10_000)
        assert caught.value.offset >= first_of_damaged


def test_garbage_appended_to_a_sealed_segment_is_reported(tmp_path: Path) -> None:
    _filled(tmp_path).close()
    sealed = segment_files(tmp_path, "t", 0)[0]
    with open(sealed, "ab") as handle:
        handle.write(os.urandom(100))
    with LogStore.open(tmp_path) as reader, pytest.raises(CorruptSegmentError):
        read_all(reader, "t")


def test_stale_or_damaged_index_is_only_a_hint(tmp_path: Path) -> None:
    _filled(tmp_path).close()
    files = segment_files(tmp_path, "t", 0)
    index_path(files[0]).write_bytes(index_path(files[1]).read_bytes())  # another file's index
    data = bytearray(index_path(files[1]).read_bytes())
    data[20:28] = b"\x00\x00\x00\x01\x00\x00\x00\x40"  # an entry pointing mid-batch
    index_path(files[1]).write_bytes(bytes(data))
    index_path(files[2]).unlink()
    with LogStore.open(tmp_path) as reader:
        assert [r.offset for r in read_all(reader, "t")] == list(range(240))
        for offset in (1, 50, 77, 100, 239):
            assert reader.read(TP, offset, max_records=1)[0].offset == offset


def test_damaged_file_header_is_reported(tmp_path: Path) -> None:
    _filled(tmp_path).close()
    sealed = segment_files(tmp_path, "t", 0)[0]
    data = bytearray(sealed.read_bytes())
    data[20] ^= 0x10  # the nonce, covered by the header CRC
    sealed.write_bytes(bytes(data))
    with LogStore.open(tmp_path) as reader, pytest.raises(CorruptSegmentError, match="header"):
        reader.read(TP, 0)
