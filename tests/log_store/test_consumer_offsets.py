"""Committed consumer offsets: atomic files, merges, resets to earliest/latest/watermark/time."""

from __future__ import annotations

from pathlib import Path

import pytest

from log_store import AtTime, LogStore, TopicPartition
from log_store.consumer_offsets import ConsumerOffsets
from log_store.errors import CorruptOffsetsError, InvalidGroupError, UnknownTopicError
from tests.log_store.helpers import rec, small_config

T0, T1 = TopicPartition("t", 0), TopicPartition("t", 1)


def _log(tmp_path: Path) -> LogStore:
    log = LogStore.open(tmp_path, small_config(), writer=True)
    log.ensure_topic("t", 2)
    for g in range(6):
        log.append_group([rec("t", f"k{g}-{i}", "v", ts=1000 * g) for i in range(10)], f"{g:016X}")
    return log


def test_commit_fetch_and_merge(tmp_path: Path) -> None:
    with _log(tmp_path) as log:
        assert log.committed_offsets("spark") == {}
        log.commit_offsets("spark", {T0: 5})
        log.commit_offsets("spark", {T1: 7}, metadata="batch 3")
        with LogStore.open(tmp_path) as reader:  # a reader process commits too
            assert reader.committed_offsets("spark") == {T0: 5, T1: 7}
            reader.commit_offsets("spark", {T0: 6})
        assert log.committed_offsets("spark") == {T0: 6, T1: 7}
        assert log.group_offsets("spark").metadata == ""
        assert log.consumer_groups() == ["spark"]
        assert not list((tmp_path / "consumer_offsets").glob("*.tmp"))


def test_resets(tmp_path: Path) -> None:
    with _log(tmp_path) as log:
        ends = {tp: log.end_offset(tp) for tp in (T0, T1)}
        assert log.reset_offsets("g", "t", "latest") == ends
        assert log.reset_offsets("g", "t", "earliest") == {T0: 0, T1: 0}
        old = log.latest_watermark()
        log.append_group([rec("t", "late", "v", ts=99_000)], "FF")
        assert old is not None
        assert log.reset_offsets("g", "t", old) == ends
        at_time = log.reset_offsets("g", "t", AtTime(3000))
        assert log.committed_offsets("g") == at_time
        for tp, offset in at_time.items():
            records = log.read(tp, offset, max_records=1)
            assert records and records[0].timestamp_ms >= 3000
            if offset > 0:
                assert log.read(tp, offset - 1, max_records=1)[0].timestamp_ms < 3000
        with pytest.raises(ValueError, match="earliest"):
            log.reset_offsets("g", "t", "middle")  # type: ignore[arg-type]


def test_bad_input(tmp_path: Path) -> None:
    with _log(tmp_path) as log:
        with pytest.raises(InvalidGroupError):
            log.commit_offsets("../escape", {T0: 1})
        with pytest.raises(ValueError, match="non-negative"):
            log.commit_offsets("g", {T0: -1})
        with pytest.raises(UnknownTopicError):
            log.commit_offsets("g", {TopicPartition("nope", 0): 1})


def test_corrupt_offsets_file_is_reported(tmp_path: Path) -> None:
    offsets = ConsumerOffsets(tmp_path)
    offsets.commit("g", {T0: 3}, now_ms=1)
    (tmp_path / "g.json").write_bytes(b'{"offsets": {"t": {"0": "x"')
    with pytest.raises(CorruptOffsetsError) as caught:
        offsets.fetch("g")
    assert str(tmp_path / "g.json") in str(caught.value) and "reset" in str(caught.value)
