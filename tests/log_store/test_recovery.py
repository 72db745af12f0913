"""Writer recovery: cut exactly what is past the last whole watermark, report it, never cut more."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from log_store import LogStore, TopicPartition
from log_store.errors import CorruptSegmentError, RecoveryError
from log_store.offset_index import index_path
from log_store.segment import BatchWalker, log_name
from log_store.watermark import FILE_NAME
from tests.log_store.helpers import read_all, rec, segment_files, small_config

TP = TopicPartition("t", 0)


def _write(root: Path, groups: int, partitions: int = 1) -> None:
    with LogStore.open(root, small_config(), writer=True) as log:
        log.ensure_topic("t", partitions)
        for g in range(groups):
            log.append_group([rec("t", f"k{g}-{i}", f"v{g}-{i}" * 4) for i in range(5)], f"{g:016X}")


def _crash(root: Path) -> None:
    """Make the next open look like it follows a crash (no clean-shutdown marker)."""
    (root / "clean_shutdown").unlink(missing_ok=True)


def _append_unwatermarked(root: Path, records: int) -> None:
    """Simulate a group whose data was written but whose watermark never was."""
    log = LogStore.open(root, small_config(), writer=True)
    partition = log._partitions[TP]
    for start in range(0, records, 50):  # several appends: the tail rolls into new segments
        partition.append([rec("t", f"x{i}", "lost") for i in range(start, start + 50)], 0)
    partition.sync()
    for p in log._partitions.values():  # drop descriptors without a clean close
        if p.active is not None:
            p.active.close()
    log._watermarks.close()
    assert log._writer_lock is not None
    log._writer_lock.release()


def test_clean_reopen_cuts_nothing(tmp_path: Path) -> None:
    _write(tmp_path, 5)
    with LogStore.open(tmp_path, small_config(), writer=True) as log:
        assert log.recovery is not None and log.recovery.clean_shutdown
        assert not log.recovery.cut_anything
        assert log.end_offset(TP) == 25


def test_unwatermarked_tail_is_cut_and_reported(tmp_path: Path) -> None:
    _write(tmp_path, 5)
    _append_unwatermarked(tmp_path, 200)
    before = len(segment_files(tmp_path, "t", 0))
    with LogStore.open(tmp_path, small_config(), writer=True) as log:
        report = log.recovery
        assert report is not None and not report.clean_shutdown
        (cut,) = report.partitions
        assert cut.tp == TP and cut.end_offset == 25 and cut.truncated_records == 200
        assert cut.removed_segments  # the tail rolled into new segments, which are gone
        assert len(segment_files(tmp_path, "t", 0)) < before
        assert "200 record(s)" in report.summary()
        assert [r.offset for r in read_all(log, "t")] == list(range(25))
        wm = log.append_group([rec("t", "k", "new")], "0000000000000099")
        assert wm.end_offset(TP) == 26  # offset 25 is handed out again only because nobody saw it
    with LogStore.open(tmp_path) as reader:
        assert read_all(reader, "t")[-1].value == b"new"


@pytest.mark.parametrize("garbage", [b"\x00" * 100, os.urandom(77), b"\xff" * 3], ids=["zeros", "random", "ones"])
def test_garbage_past_the_watermark_is_truncated(tmp_path: Path, garbage: bytes) -> None:
    _write(tmp_path, 3)
    last = segment_files(tmp_path, "t", 0)[-1]
    size = last.stat().st_size
    with open(last, "ab") as handle:
        handle.write(garbage)
    _crash(tmp_path)
    with LogStore.open(tmp_path, small_config(), writer=True) as log:
        assert log.recovery is not None and log.recovery.partitions[0].truncated_bytes == len(garbage)
        assert last.stat().st_size == size
        assert len(read_all(log, "t")) == 15


def test_lost_data_below_an_older_watermark_is_not_cut(tmp_path: Path) -> None:
    _write(tmp_path, 6)
    last = segment_files(tmp_path, "t", 0)[-1]
    os.truncate(last, last.stat().st_size - 300)  # more than the last group's batch
    _crash(tmp_path)
    with pytest.raises(CorruptSegmentError) as caught:
        LogStore.open(tmp_path, small_config(), writer=True)
    assert caught.value.path == last
    assert "durable" in str(caught.value)
    with LogStore.open(tmp_path) as reader:  # nothing was cut: a reader still sees the watermark
        assert reader.end_offset(TP) == 30


def test_last_watermark_ahead_of_its_data_falls_back_one(tmp_path: Path) -> None:
    _write(tmp_path, 4, partitions=2)
    # the last group's batches in partition 0 never reached the disk, its watermark did
    with LogStore.open(tmp_path) as reader:
        ends = {p: reader.end_offset(TopicPartition("t", p)) for p in range(2)}
        last_group = [r for r in read_all(reader, "t") if r.key is not None and r.key.startswith(b"k3-")]
    cut_from = min(r.offset for r in last_group if r.partition == 0)
    last = segment_files(tmp_path, "t", 0)[-1]
    fd = os.open(last, os.O_RDONLY)
    try:
        starts = [pos for pos, header, _b, _a in BatchWalker(fd, 28) if header.base_offset >= cut_from]
    finally:
        os.close(fd)
    os.truncate(last, starts[0])  # the last group's batch is gone from partition 0
    _crash(tmp_path)
    with LogStore.open(tmp_path, small_config(), writer=True) as log:
        assert log.recovery is not None and log.recovery.watermark_dropped
        assert log.recovery.watermark_sequence == 3
        watermark = log.latest_watermark()
        assert watermark is not None and watermark.sequence == 3
        assert watermark.end_offset(TP) == cut_from
        assert watermark.end_offset(TopicPartition("t", 1)) < ends[1]
        keys = {r.key for r in read_all(log, "t")}
        assert not any(k is not None and k.startswith(b"k3-") for k in keys)  # whole group gone
        assert len(keys) == 15


def test_index_is_rebuilt_after_a_crash(tmp_path: Path) -> None:
    _write(tmp_path, 6)
    last = segment_files(tmp_path, "t", 0)[-1]
    index_path(last).write_bytes(b"junk")
    _crash(tmp_path)
    with LogStore.open(tmp_path, small_config(), writer=True) as log:
        assert log.recovery is not None and log.recovery.rebuilt_indexes == 1
        assert index_path(last).read_bytes().startswith(b"CIDX")
        assert len(read_all(log, "t")) == 30


def test_leftovers_and_unfinished_topics_are_removed(tmp_path: Path) -> None:
    _write(tmp_path, 2)
    directory = tmp_path / "topics" / "t" / "0"
    (directory / (log_name(0) + ".cleaned")).write_bytes(b"partial compaction output")
    (tmp_path / "topics" / "half-created" / "0").mkdir(parents=True)
    with LogStore.open(tmp_path, small_config(), writer=True) as log:
        assert log.recovery is not None
        removed = log.recovery.removed_files
        assert any(name.endswith(".cleaned") for name in removed)
        assert any(name.endswith("half-created") for name in removed)
        assert log.topics() == ["t"]
    assert not (directory / (log_name(0) + ".cleaned")).exists()


def test_missing_watermark_file_is_not_treated_as_empty(tmp_path: Path) -> None:
    _write(tmp_path, 2)
    (tmp_path / FILE_NAME).unlink()
    with pytest.raises(RecoveryError, match="watermarks.log is missing"):
        LogStore.open(tmp_path, small_config(), writer=True)
    assert len(segment_files(tmp_path, "t", 0)) >= 1


@pytest.mark.parametrize("header_bytes", [0, 10])
def test_torn_header_of_a_segment_the_last_group_created_drops_that_group(
    tmp_path: Path,
    header_bytes: int,
) -> None:
    """A segment's header becomes durable with its first group's fdatasync. A crash after the
    group's watermark record (synced concurrently) but before the segment's data leaves a watermark
    ahead of a torn header: recovery drops that watermark and the segment, and keeps the rest."""
    with LogStore.open(tmp_path, small_config(), writer=True) as log:
        log.ensure_topic("t", 1)
        log.append_group([rec("t", "a", "1")], "01")
        log.roll()  # the next group starts a new segment
        log.append_group([rec("t", "b", "2")], "02")
    _crash(tmp_path)
    newest = segment_files(tmp_path, "t", 0)[-1]
    assert newest.name == log_name(1)
    os.truncate(newest, header_bytes)  # the crash kept none of its header, or part of it
    with LogStore.open(tmp_path, small_config(), writer=True) as log:
        assert log.recovery is not None and log.recovery.watermark_dropped
        latest = log.latest_watermark()
        assert latest is not None and latest.position == "01"
        assert [r.value for r in read_all(log, "t")] == [b"1"]
        assert [p.name for p in segment_files(tmp_path, "t", 0)] == [log_name(0)]
        log.append_group([rec("t", "c", "3")], "03")
        assert [r.value for r in read_all(log, "t")] == [b"1", b"3"]


def _two_groups_in_a_second_segment(tmp_path: Path) -> None:
    """Group 01 in the first segment, groups 02 and 03 in the second, then a crash."""
    with LogStore.open(tmp_path, small_config(), writer=True) as log:
        log.ensure_topic("t", 1)
        log.append_group([rec("t", "a", "1")], "01")
        log.roll()
        log.append_group([rec("t", "b", "2")], "02")
        log.append_group([rec("t", "c", "3")], "03")
    _crash(tmp_path)


def test_torn_header_below_an_earlier_watermark_is_reported(tmp_path: Path) -> None:
    """Two groups into the segment: its header was durable with the first, so a torn one now is
    lost data, never silently cut."""
    _two_groups_in_a_second_segment(tmp_path)
    os.truncate(segment_files(tmp_path, "t", 0)[-1], 10)
    with pytest.raises(CorruptSegmentError, match="header"):
        LogStore.open(tmp_path, small_config(), writer=True)


def test_reported_corruption_leaves_the_latest_watermark_for_a_restored_file(tmp_path: Path) -> None:
    """Recovery that stops on lost durable data changes nothing: once the operator restores the file,
    the latest group (durable and acknowledged) is all there."""
    import shutil

    _two_groups_in_a_second_segment(tmp_path)
    segment = segment_files(tmp_path, "t", 0)[-1]
    shutil.copy(segment, tmp_path / "backup")
    os.truncate(segment, 10)  # the header of a segment an earlier group created
    with pytest.raises(CorruptSegmentError):
        LogStore.open(tmp_path, small_config(), writer=True)
    shutil.copy(tmp_path / "backup", segment)
    with LogStore.open(tmp_path, small_config(), writer=True) as log:
        watermark = log.latest_watermark()
        assert watermark is not None and watermark.position == "03"
        assert [r.value for r in read_all(log, "t")] == [b"1", b"2", b"3"]


def test_damaged_page_inside_the_latest_groups_batch_drops_that_group(tmp_path: Path) -> None:
    """The latest group's batch is whole in length but a page of it never reached the disk (its
    watermark did: they are fsynced concurrently): the group is dropped, as for a short tail."""
    with LogStore.open(tmp_path, small_config(), writer=True) as log:
        log.ensure_topic("t", 1)
        log.append_group([rec("t", "a", "1" * 100)], "01")
        log.append_group([rec("t", "b", "2" * 5000)], "02")
    _crash(tmp_path)
    newest = segment_files(tmp_path, "t", 0)[-1]
    with open(newest, "r+b") as handle:
        handle.seek(newest.stat().st_size - 2000)
        handle.write(b"\0" * 1000)
    with LogStore.open(tmp_path, small_config(), writer=True) as log:
        assert log.recovery is not None and log.recovery.watermark_dropped
        watermark = log.latest_watermark()
        assert watermark is not None and watermark.position == "01"
        assert [r.value for r in read_all(log, "t")] == [b"1" * 100]


def test_damaged_batch_of_an_earlier_group_is_corruption(tmp_path: Path) -> None:
    """The same damage one group earlier (both groups in the segment recovery walks) is lost durable data."""
    with LogStore.open(tmp_path, small_config(segment_bytes=1 << 20), writer=True) as log:
        log.ensure_topic("t", 1)
        log.append_group([rec("t", "a", "1" * 5000)], "01")
        log.append_group([rec("t", "b", "2" * 100)], "02")
    _crash(tmp_path)
    (only,) = segment_files(tmp_path, "t", 0)
    with open(only, "r+b") as handle:
        handle.seek(2000)
        handle.write(b"\0" * 100)
    with pytest.raises(CorruptSegmentError, match="CRC32C"):
        LogStore.open(tmp_path, small_config(segment_bytes=1 << 20), writer=True)
