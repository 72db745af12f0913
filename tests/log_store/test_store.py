"""The LogStore API as cdc/ and derived_views/ use it."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from log_store import LogConfig, LogStore, ProducerRecord, TopicPartition, Watermark
from log_store.errors import (
    InvalidRecordError,
    InvalidTopicNameError,
    LogFormatError,
    LogNotFoundError,
    ReadOnlyError,
    StorageIOError,
    TopicConfigMismatchError,
    UnknownTopicError,
    WriterFailedError,
)
from log_store.partitioner import partition_for_key
from log_store.segment import ActiveSegment
from tests.log_store.helpers import FakeClock, read_all, rec, small_config


def test_reader_of_a_missing_log(tmp_path: Path) -> None:
    with pytest.raises(LogNotFoundError, match="CDC_DATA_DIR"):
        LogStore.open(tmp_path / "nothing")


def test_topics_are_idempotent_and_fixed(tmp_path: Path) -> None:
    with LogStore.open(tmp_path, writer=True) as log:
        log.ensure_topic("cdc.public.users", 3)
        log.ensure_topic("cdc.public.users", 3)
        log.ensure_topic("events", 2, compacted=False)
        with pytest.raises(TopicConfigMismatchError, match="partitions=3"):
            log.ensure_topic("cdc.public.users", 4)
        with pytest.raises(TopicConfigMismatchError, match="compacted"):
            log.ensure_topic("events", 2)
        for bad in ("", ".", "..", "a/b", "x" * 250, "spaces no"):
            with pytest.raises(InvalidTopicNameError):
                log.ensure_topic(bad, 1)
        assert log.topics() == ["cdc.public.users", "events"]
        assert log.partitions("events") == 2
    with LogStore.open(tmp_path) as reader:
        assert reader.topics() == ["cdc.public.users", "events"]
        assert reader.topic_config("events").compacted is False
        with pytest.raises(UnknownTopicError, match="cdc log topics"):
            reader.partitions("nope")
        with pytest.raises(ReadOnlyError, match="writer=True"):
            reader.ensure_topic("x", 1)
        with pytest.raises(ReadOnlyError):
            reader.append_group([], "0")


def test_keys_go_to_kafkas_partition_in_order(tmp_path: Path) -> None:
    with LogStore.open(tmp_path, writer=True) as log:
        log.ensure_topic("t", 5)
        records = [rec("t", f"key-{i % 40}", f"v{i}") for i in range(400)]
        log.append_group(records, "01")
        for record in read_all(log, "t"):
            assert record.partition == partition_for_key(record.key or b"", 5)
        for key in (b"key-1", b"key-7"):
            values = [r.value for r in read_all(log, "t") if r.key == key]
            assert values == [r.value for r in records if r.key == key]


def test_keyless_records(tmp_path: Path) -> None:
    with LogStore.open(tmp_path, writer=True) as log:
        log.ensure_topic("compacted", 2)
        log.ensure_topic("plain", 3, compacted=False)
        with pytest.raises(InvalidRecordError, match="needs a key"):
            log.append_group([rec("compacted", None, "x")], "01")
        log.append_group([rec("plain", None, str(i)) for i in range(7)], "02")
        counts = [log.end_offset(TopicPartition("plain", p)) for p in range(3)]
        assert counts == [3, 2, 2]


def test_keyless_records_among_many_keyed_ones(tmp_path: Path) -> None:
    """Runs long enough for the vectorised partitioner: keyless records still go keyless records round-robin."""
    with LogStore.open(tmp_path, writer=True) as log:
        log.ensure_topic("compacted", 3)
        log.ensure_topic("plain", 3, compacted=False)
        keyed = [rec("plain", f"k{i}", "v") for i in range(100)]
        with pytest.raises(InvalidRecordError, match="needs a key"):
            log.append_group([*[rec("compacted", f"k{i}", "v") for i in range(100)], rec("compacted", None, "x")], "01")
        log.append_group([*keyed[:50], rec("plain", None, "a"), *keyed[50:], rec("plain", None, "b")], "02")
        records = read_all(log, "plain")
        keyless = sorted((r.value, r.partition) for r in records if r.key is None)
        assert keyless == [(b"a", 0), (b"b", 1)]  # the round-robin starts at 0: nothing advanced it
        for record in records:
            if record.key is not None:
                assert record.partition == partition_for_key(record.key, 3)


@pytest.mark.parametrize("partitions", [1, 3])
def test_bad_records_are_rejected_before_anything_is_written(tmp_path: Path, partitions: int) -> None:
    with LogStore.open(tmp_path, writer=True) as log:
        log.ensure_topic("t", partitions)
        good = [rec("t", f"k{i}", "v") for i in range(100)]
        for bad, field in (
            (ProducerRecord("t", "str-key", b"v", 0), "key is str"),  # type: ignore[arg-type]
            (ProducerRecord("t", 7, b"v", 0), "key is int"),  # type: ignore[arg-type]
            (ProducerRecord("t", b"k", "str-value", 0), "value is str"),  # type: ignore[arg-type]
            (ProducerRecord("t", b"k", b"v", 1.5), "timestamp_ms"),  # type: ignore[arg-type]
            (ProducerRecord("t", b"k", b"v", 1 << 63), "timestamp_ms"),
            (ProducerRecord("t", b"k", b"v", 0, (("h", "str"),)), "headers"),  # type: ignore[arg-type]
            (ProducerRecord("t", b"k", b"v", 0, ("h",)), "headers"),
        ):  # type: ignore[arg-type]
            with pytest.raises(InvalidRecordError, match=field):
                log.append_group([*good, bad], "01")
        with pytest.raises(UnknownTopicError):
            log.append_group([*good, rec("other", "k", "v")], "01")
        assert log.latest_watermark() is None
        assert all(p.next_offset == 0 for p in log._partitions.values())
        log.append_group(good, "02")
        assert sum(log.end_offset(TopicPartition("t", p)) for p in range(partitions)) == 100


def test_bytes_like_keys_and_values_are_stored_as_bytes(tmp_path: Path) -> None:
    with LogStore.open(tmp_path, writer=True) as log:
        log.ensure_topic("t", 3)
        log.append_group(
            [
                ProducerRecord("t", bytearray(b"k1"), memoryview(b"v1"), 1),  # type: ignore[arg-type]
                ProducerRecord("t", b"k2", bytearray(b"v2"), 2),
            ],
            "01",
        )  # type: ignore[arg-type]
        records = sorted(read_all(log, "t"), key=lambda r: r.key or b"")
        assert [(r.key, r.value) for r in records] == [(b"k1", b"v1"), (b"k2", b"v2")]
        assert all(type(r.key) is bytes and type(r.value) is bytes for r in records)
        assert records[0].partition == partition_for_key(b"k1", 3)


def test_watermark_bounds_every_read(tmp_path: Path) -> None:
    tp = TopicPartition("t", 0)
    with LogStore.open(tmp_path, small_config(), writer=True) as log:
        log.ensure_topic("t", 1)
        first = log.append_group([rec("t", f"k{i}", "a") for i in range(10)], "0000000000000001")
        second = log.append_group([rec("t", f"k{i}", "b") for i in range(10)], "0000000000000002")
        assert (first.sequence, second.sequence) == (1, 2)
        assert first.end_offsets == {tp: 10} and second.end_offsets == {tp: 20}
        assert [r.value for r in log.read(tp, 0, until=first)] == [b"a"] * 10
        assert log.read(tp, 10, until=first) == []
        assert len(log.read(tp, 0)) == 20
        with LogStore.open(tmp_path) as reader:
            latest = reader.latest_watermark()
            assert latest == second and latest.position == "0000000000000002"
            assert reader.end_offset(tp) == 20 and reader.start_offset(tp) == 0


def test_a_read_stops_below_end_as_the_kafka_log_does(tmp_path: Path) -> None:
    """``end`` bounds a read like a watermark (the interface both logs offer): ``min(end, watermark's)``."""
    tp = TopicPartition("t", 0)
    with LogStore.open(tmp_path, small_config(), writer=True) as log:
        log.ensure_topic("t", 1)
        first = log.append_group([rec("t", f"k{i}", "a") for i in range(10)], "0000000000000001")
        log.append_group([rec("t", f"k{i}", "b") for i in range(10)], "0000000000000002")
        assert [r.offset for r in log.read(tp, 3, end=7)] == [3, 4, 5, 6]
        assert [r.offset for r in log.read(tp, 8, end=15, until=first)] == [8, 9]
        assert len(log.read(tp, 0, end=100)) == 20
        assert log.read(tp, 5, end=5) == []


def test_watermark_lists_every_partition(tmp_path: Path) -> None:
    with LogStore.open(tmp_path, writer=True) as log:
        log.ensure_topic("a", 2)
        log.ensure_topic("b", 1)
        watermark = log.append_group([rec("a", "k", "v")], "01")
        assert set(watermark.end_offsets) == {TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)}
        assert sum(watermark.end_offsets.values()) == 1
        empty = log.append_group([], "02")
        assert empty.end_offsets == watermark.end_offsets and empty.sequence == 2


def test_unknown_partition(tmp_path: Path) -> None:
    with LogStore.open(tmp_path, writer=True) as log:
        log.ensure_topic("t", 2)
        with pytest.raises(UnknownTopicError, match="0 to 1"):
            log.read(TopicPartition("t", 2), 0)


def test_segments_roll_by_size_and_age(tmp_path: Path) -> None:
    clock = FakeClock()
    config = LogConfig(segment_bytes=1024, segment_ms=60_000, clock=clock)
    with LogStore.open(tmp_path, config, writer=True) as log:
        log.ensure_topic("t", 1)
        directory = tmp_path / "topics" / "t" / "0"
        log.append_group([rec("t", "k", "x" * 100)], "01")
        log.append_group([rec("t", "k", "x" * 100)], "02")
        assert len(list(directory.glob("*.log"))) == 1
        clock.now += 60_000
        log.append_group([rec("t", "k", "x" * 100)], "03")
        assert len(list(directory.glob("*.log"))) == 2  # aged out
        log.append_group([rec("t", f"k{i}", "x" * 100) for i in range(30)], "04")
        assert len(list(directory.glob("*.log"))) == 3  # size
        assert [r.offset for r in read_all(log, "t")] == list(range(33))


def test_large_group_is_split_into_batches(tmp_path: Path) -> None:
    config = LogConfig(max_batch_bytes=1000, segment_bytes=4096)
    with LogStore.open(tmp_path, config, writer=True) as log:
        log.ensure_topic("t", 1)
        log.append_group([rec("t", f"k{i}", "v" * 90) for i in range(100)], "01")
        assert len(list((tmp_path / "topics" / "t" / "0").glob("*.log"))) > 2
        assert [r.offset for r in read_all(log, "t")] == list(range(100))


def test_failed_append_stops_the_writer_until_reopened(tmp_path: Path) -> None:
    log = LogStore.open(tmp_path, writer=True)
    log.ensure_topic("t", 1)
    log.append_group([rec("t", "k", "v")], "01")

    def broken(_watermark: Watermark) -> None:
        raise OSError(28, "No space left on device")

    log._watermarks.write = broken  # type: ignore[method-assign,assignment]
    with pytest.raises(StorageIOError, match="no space left on device") as failed:
        log.append_group([rec("t", "k", "lost")], "02")
    assert failed.value.path == tmp_path and failed.value.error.errno == 28
    with pytest.raises(WriterFailedError, match="reopen"):
        log.append_group([rec("t", "k", "v")], "03")
    log.close()
    with LogStore.open(tmp_path, writer=True) as again:
        assert again.recovery is not None and again.recovery.partitions[0].truncated_records == 1
        assert [r.value for r in read_all(again, "t")] == [b"v"]


@pytest.mark.parametrize("which", [0, 2])
def test_failed_segment_sync_is_never_published_and_stops_the_writer(tmp_path: Path, which: int) -> None:
    """A segment whose fdatasync fails (on this thread or a pool thread) leaves the group unpublished."""
    log = LogStore.open(tmp_path, writer=True)
    log.ensure_topic("t", 3)
    keys = [f"k{i}" for i in range(30)]
    log.append_group([rec("t", k, "v") for k in keys], "01")
    reader = LogStore.open(tmp_path)

    def broken() -> None:
        raise OSError(5, "Input/output error")

    log._partitions[TopicPartition("t", which)].sync = broken  # type: ignore[method-assign]
    with pytest.raises(StorageIOError, match="input/output error"):
        log.append_group([rec("t", k, "lost") for k in keys], "02")
    latest = reader.latest_watermark()
    assert latest is not None and latest.position == "01"
    assert {r.value for r in read_all(reader, "t")} == {b"v"}
    with pytest.raises(WriterFailedError):
        log.append_group([rec("t", "k0", "v")], "03")
    reader.close()
    log.close()
    with LogStore.open(tmp_path, writer=True) as again:
        latest = again.latest_watermark()
        assert latest is not None and latest.position in ("01", "02")  # "02" only if all of it is durable
        values = {r.value for r in read_all(again, "t")}
        assert values == ({b"v"} if latest.position == "01" else {b"v", b"lost"})


def _writeback_starts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The active segment's size at every start of its writeback from now on."""
    started: list[int] = []
    original = ActiveSegment.start_writeback

    def counted(self: ActiveSegment) -> None:
        started.append(self.size)
        original(self)

    monkeypatch.setattr(ActiveSegment, "start_writeback", counted)
    return started


@pytest.mark.parametrize("writeback_bytes", [0, 64 << 10])
def test_a_large_group_starts_its_writeback_as_it_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writeback_bytes: int
) -> None:
    """Every ``writeback_bytes`` a partition writes, its segment's writeback starts (0: only at the end)."""
    started = _writeback_starts(monkeypatch)
    with LogStore.open(tmp_path, LogConfig(writeback_bytes=writeback_bytes), writer=True) as log:
        log.ensure_topic("t", 1)
        # about 1 MB in chunks of 50 records (about 50 kB each)
        log.append_group((rec("t", f"k{i}", "v" * 1000) for i in range(1000)), "01", chunk_records=50)
        assert len(read_all(log, "t")) == 1000
    if not writeback_bytes:
        assert len(started) == 1  # before the group's fsync
    else:
        # after every second chunk, then before the group's fsync
        assert len(started) >= 8 and started == sorted(started), started
        assert all(later - earlier >= writeback_bytes for earlier, later in zip(started, started[1:-1])), started


def test_each_group_counts_its_writeback_bytes_from_zero(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started = _writeback_starts(monkeypatch)
    with LogStore.open(tmp_path, LogConfig(writeback_bytes=64 << 10), writer=True) as log:
        log.ensure_topic("t", 1)
        # 19 chunks of about 50 kB: the last one's bytes are left over when the group ends
        log.append_group((rec("t", f"k{i}", "v" * 1000) for i in range(950)), "01", chunk_records=50)
        first_group = len(started)
        # about 40 kB: below the threshold on its own, above it with the leftover of the group before
        log.append_group([rec("t", f"k{i}", "w" * 1000) for i in range(40)], "02")
    assert len(started) == first_group + 1  # only the start before the group's fsync


def test_offset_for_time(tmp_path: Path) -> None:
    tp = TopicPartition("t", 0)
    with LogStore.open(tmp_path, small_config(), writer=True) as log:
        log.ensure_topic("t", 1)
        for g in range(10):
            log.append_group([rec("t", f"k{i}", "v", ts=1000 * g + i) for i in range(5)], f"{g:02X}")
        assert log.offset_for_time(tp, 0) == 0
        assert log.offset_for_time(tp, 3002) == 17
        assert log.offset_for_time(tp, 3005) == 20
        assert log.offset_for_time(tp, 99_999) == 50  # nothing that late: the end


def test_context_manager_and_repr(tmp_path: Path) -> None:
    with LogStore.open(tmp_path, writer=True) as log:
        assert "writer=True" in repr(log)
    with pytest.raises(ReadOnlyError, match="after close"):
        log.ensure_topic("t", 1)


def test_a_log_declaring_another_format_is_refused_by_readers_and_writers_alike(tmp_path: Path) -> None:
    """Only format 2 is read: a log declaring any other format is one clear error, never read as corrupt
    and never rewritten."""
    with LogStore.open(tmp_path, writer=True) as log:
        log.ensure_topic("t", 1)
        log.append_group([rec("t", "a", "1")], "01")
    store_file = tmp_path / "store.json"
    created = orjson.loads(store_file.read_bytes())["created_ms"]
    for other in (1, 3):
        declared = orjson.dumps({"format": other, "created_ms": created})
        store_file.write_bytes(declared)
        for writer in (False, True):
            with pytest.raises(LogFormatError, match=f"declares log format {other} but this version reads format 2"):
                LogStore.open(tmp_path, writer=writer)
        assert store_file.read_bytes() == declared
    store_file.write_bytes(orjson.dumps({"format": 2, "created_ms": created}))
    with LogStore.open(tmp_path) as reader:
        assert [r.value for r in read_all(reader, "t")] == [b"1"]


def test_groups_given_as_list_tuple_or_generator_append_alike(tmp_path: Path) -> None:
    with LogStore.open(tmp_path, writer=True) as log:
        log.ensure_topic("t", 2)
        records = [rec("t", f"k{i}", f"v{i}") for i in range(30)]
        log.append_group(records, "01", chunk_records=10)  # a list longer than a chunk
        log.append_group(tuple(records), "02")
        log.append_group(iter(records), "03", chunk_records=7)
        log.append_group(records[:5], "04")
        assert records == [rec("t", f"k{i}", f"v{i}") for i in range(30)]  # never modified
        values = sorted((r.key or b"", r.offset) for r in read_all(log, "t"))
        assert len(values) == 95
        for p in range(2):
            offsets = [r.offset for r in read_all(log, "t") if r.partition == p]
            assert offsets == list(range(len(offsets)))


def test_a_buffer_of_multibyte_items_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    import array

    from log_store.errors import InvalidRecordError

    with LogStore.open(tmp_path, writer=True) as log:
        log.ensure_topic("t", 1)
        with pytest.raises(InvalidRecordError, match="memoryview of 'i' items"):
            log.append_group([ProducerRecord("t", b"k", memoryview(array.array("i", [1, 2, 3])), 1)], "01")
        assert log.latest_watermark() is None
        log.append_group([ProducerRecord("t", b"k", memoryview(b"fine"), 1)], "02")
        assert [r.value for r in log.read(TopicPartition("t", 0), 0)] == [b"fine"]


def test_read_columns_gives_the_records_read_gives(tmp_path: Path) -> None:
    """Across segments, compaction gaps, null keys and values, headers, any window and ``end``."""
    from tests.log_store.test_record_batch import as_records

    tp = TopicPartition("t", 0)
    with LogStore.open(tmp_path, small_config(), writer=True) as log:
        log.ensure_topic("t", 1)
        for round_ in range(6):
            log.append_group(
                [
                    rec(
                        "t",
                        f"k{i % 7}",
                        None if i % 5 == 0 else f"v{round_}-{i}",
                        headers=(("unchanged", b'["a"]'),) if i % 3 == 0 else (),
                    )
                    for i in range(12)
                ],
                f"{round_ + 1:016x}",
            )
        log.roll()
        log.compact()
        log.append_group([rec("t", "k1", "after compaction")], "0000000000000010")
        stored = log.read(tp, 0, max_records=1_000)
        assert 8 <= len(stored) < log.end_offset(tp)  # compaction left gaps
        end = log.end_offset(tp)
        for start in (0, 5, stored[len(stored) // 2].offset, end - 1):
            for stop in (None, start + 3, end):
                expected = [r for r in stored if r.offset >= start and (stop is None or r.offset < stop)]
                chunks = log.read_columns(tp, start, max_records=1_000, end=stop)
                got = [record for chunk in chunks for record in as_records(chunk, "t", 0)]
                assert got == expected, (start, stop)
        assert sum(map(len, log.read_columns(tp, 0, max_records=1))) < len(stored)  # stops after a batch
        assert sum(map(len, log.read_columns(tp, 0, max_bytes=1))) < len(stored)
        log.ensure_topic("u", 1, compacted=False)
        log.append_group([rec("u", None, "keyless"), rec("u", "k", None), rec("u", None, None)], "0000000000000011")
        keyless = TopicPartition("u", 0)
        assert [r for c in log.read_columns(keyless, 0) for r in as_records(c, "u", 0)] == log.read(keyless, 0)
