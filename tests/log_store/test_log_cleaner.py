"""Compaction and retention on a real log: side files, atomic swaps, readers undisturbed."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from event_format import fold_after
from log_store import LogConfig, LogStore, TopicPartition
from log_store.log_cleaner import read_checkpoint
from log_store.segment import log_name
from tests.log_store.helpers import FakeClock, latest_by_key, read_all, rec, segment_files

DAY = 86_400_000


def _config(clock: FakeClock, **overrides: object) -> LogConfig:
    values: dict[str, object] = {"segment_bytes": 1024, "index_interval_bytes": 128, "clock": clock, "delete_retention_ms": DAY}
    values.update(overrides)
    return LogConfig(**values)  # type: ignore[arg-type]


def _fill(log: LogStore, groups: int, keys: int = 10) -> dict[bytes | None, bytes | None]:
    expected: dict[bytes | None, bytes | None] = {}
    for g in range(groups):
        batch = [rec("t", f"k{(g * 7 + i) % keys}", f"value-{g}-{i}") for i in range(6)]
        log.append_group(batch, f"{g:016X}")
        expected.update({r.key: r.value for r in batch})
    return expected


def test_compaction_keeps_latest_values_and_offsets(tmp_path: Path) -> None:
    clock = FakeClock()
    with LogStore.open(tmp_path, _config(clock), writer=True) as log:
        log.ensure_topic("t", 2)
        expected = _fill(log, 40)
        before = read_all(log, "t")
        log.roll()
        report = log.compact()
        after = read_all(log, "t")
        assert latest_by_key(after) == expected
        assert len(after) == len(expected) < len(before)
        offsets_before = {(r.partition, r.offset): r for r in before}
        for record in after:  # every survivor is an original record at its original offset
            assert offsets_before[(record.partition, record.offset)] == record
        assert report.records_read == len(before) and report.records_kept == len(after)
        for p in range(2):
            tp = TopicPartition("t", p)
            assert read_checkpoint(tmp_path / "topics" / "t" / str(p)) == log.end_offset(tp)
        again = log.compact()
        assert all(p.segments_rewritten == 0 for p in again.partitions)


def test_compaction_never_touches_the_active_segment_or_past_the_watermark(tmp_path: Path) -> None:
    clock = FakeClock()
    with LogStore.open(tmp_path, _config(clock), writer=True) as log:
        log.ensure_topic("t", 1)
        _fill(log, 20)
        active = segment_files(tmp_path, "t", 0)[-1]
        active_bytes = active.read_bytes()
        log.compact()
        assert active.read_bytes() == active_bytes
        assert segment_files(tmp_path, "t", 0)[-1] == active


def test_tombstones_outlive_compaction_for_the_retention(tmp_path: Path) -> None:
    clock = FakeClock()
    with LogStore.open(tmp_path, _config(clock), writer=True) as log:
        log.ensure_topic("t", 1)
        _fill(log, 10)
        log.append_group([rec("t", "k3", '{"op":"d"}'), rec("t", "k3", None)], "delete")
        log.roll()
        log.compact()
        assert latest_by_key(read_all(log, "t"))[b"k3"] is None  # the deletion is still visible
        clock.now += DAY
        log.append_group([rec("t", "k4", "later")], "later")
        log.roll()
        report = log.compact()
        assert b"k3" not in latest_by_key(read_all(log, "t"))
        assert report.partitions[0].tombstones_removed == 1


def _partial_rows(log: LogStore) -> None:
    """A full row, then 28 updates of it that leave ``doc`` out."""
    log.ensure_topic("t", 1)
    full = orjson.dumps({"after": {"id": 1, "doc": "x" * 50, "n": 1}, "op": "c"})
    log.append_group([rec("t", "1", full.decode())], "01")
    for n in range(2, 30):
        partial = orjson.dumps({"after": {"id": 1, "n": n}, "op": "u"}).decode()
        log.append_group([rec("t", "1", partial, headers=(("unchanged", b'["doc"]'),))], f"{n:02X}")
    log.roll()


def test_compaction_folds_unchanged_columns(tmp_path: Path) -> None:
    with LogStore.open(tmp_path, _config(FakeClock(), fold=fold_after), writer=True) as log:
        _partial_rows(log)
        log.compact()
        (only,) = read_all(log, "t")
        assert orjson.loads(only.value or b"")["after"] == {"id": 1, "doc": "x" * 50, "n": 29}
        assert only.headers == () and only.offset == 28


def test_without_a_fold_compaction_keeps_every_record_of_a_partial_row(tmp_path: Path) -> None:
    """The log does not know what a value holds: without the fold it was given, dropping the full row
    under the partial ones would lose ``doc``."""
    with LogStore.open(tmp_path, _config(FakeClock()), writer=True) as log:
        _partial_rows(log)
        log.compact()
        records = read_all(log, "t")
        assert len(records) == 29 and orjson.loads(records[0].value or b"")["after"]["doc"] == "x" * 50


def test_crash_during_compaction_leaves_valid_segments(tmp_path: Path) -> None:
    clock = FakeClock()
    with LogStore.open(tmp_path, _config(clock), writer=True) as log:
        log.ensure_topic("t", 1)
        expected = _fill(log, 30)
        log.roll()
        directory = tmp_path / "topics" / "t" / "0"
        first = segment_files(tmp_path, "t", 0)[0]
        original = first.read_bytes()
        # a crashed cleaner left a half-written side file behind
        (directory / (log_name(0) + ".cleaned")).write_bytes(original[: len(original) // 2])
        with LogStore.open(tmp_path, log.config) as reader:
            assert latest_by_key(read_all(reader, "t")) == expected
            reader.compact()
            assert not list(directory.glob("*.cleaned"))
            assert latest_by_key(read_all(reader, "t")) == expected


def test_reader_holding_a_segment_open_keeps_reading_it(tmp_path: Path) -> None:
    clock = FakeClock()
    with LogStore.open(tmp_path, _config(clock), writer=True) as log:
        log.ensure_topic("t", 1)
        _fill(log, 30)
        log.roll()
        tp = TopicPartition("t", 0)
        reader = LogStore.open(tmp_path)
        head = reader.read(tp, 0, max_records=3)  # opens (and caches) the first segment
        log.compact()
        rest = reader.read(tp, head[-1].offset + 1)
        offsets = [r.offset for r in head + rest]
        assert offsets == sorted(set(offsets))
        assert latest_by_key(head + rest) == latest_by_key(read_all(log, "t"))
        reader.close()


def test_retention_by_size_and_time(tmp_path: Path) -> None:
    clock = FakeClock()
    config = _config(clock, retention_bytes=3000, retention_ms=10 * DAY)
    with LogStore.open(tmp_path, config, writer=True) as log:
        log.ensure_topic("t", 1, compacted=False)
        _fill(log, 60)
        tp = TopicPartition("t", 0)
        total = sum(p.stat().st_size for p in segment_files(tmp_path, "t", 0))
        assert total > 3000
        log.compact()
        kept = sum(p.stat().st_size for p in segment_files(tmp_path, "t", 0))
        assert 3000 <= kept < total
        start = log.start_offset(tp)
        assert start > 0 and read_all(log, "t")[0].offset == start
        assert [r.offset for r in read_all(log, "t")] == list(range(start, 360))
        clock.now += 11 * DAY
        log.compact()
        assert len(segment_files(tmp_path, "t", 0)) == 1  # the active segment always stays
        assert log.end_offset(tp) == 360


@pytest.mark.parametrize("topic", [None, "t"])
def test_compaction_from_a_reader_beside_the_writer(tmp_path: Path, topic: str | None) -> None:
    clock = FakeClock()
    with LogStore.open(tmp_path, _config(clock), writer=True) as log:
        log.ensure_topic("t", 1)
        expected = _fill(log, 30)
        with LogStore.open(tmp_path, log.config) as reader:
            report = reader.compact(topic)
            assert report.partitions and report.records_kept < report.records_read
        more = _fill(log, 5)  # the writer carries on appending
        expected.update(more)
        assert latest_by_key(read_all(log, "t")) == expected
        assert not [p for p in (tmp_path / "topics" / "t" / "0").iterdir() if p.name.endswith((".cleaned", ".tmp"))]
        assert os.path.exists(tmp_path / "topics" / "t" / "0" / "cleaner.checkpoint")


class _TwoTicks:
    """A stop event whose wait() says 'not stopped' once, then 'stopped'."""

    def __init__(self) -> None:
        self.answers = [False, True]

    def wait(self, timeout: float | None = None) -> bool:
        return self.answers.pop(0)


def test_periodic_runner_runs_passes_until_stopped(tmp_path: Path) -> None:
    clock = FakeClock()
    with LogStore.open(tmp_path, _config(clock), writer=True) as log:
        log.ensure_topic("t", 1)
        expected = _fill(log, 30)
        log.cleaner().run_periodically(_TwoTicks(), 0.01)  # type: ignore[arg-type]
        assert read_checkpoint(tmp_path / "topics" / "t" / "0") > 0
        assert latest_by_key(read_all(log, "t")) == expected
