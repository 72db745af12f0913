"""Groups larger than the append chunk: invisible until complete, cut whole by recovery, undone on error."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from log_store import LogStore, ProducerRecord, TopicPartition
from log_store.errors import InvalidRecordError
from tests.log_store.helpers import read_all, rec, small_config

CHUNK = 10


def _first_group(root: Path) -> None:
    with LogStore.open(root, small_config(), writer=True) as log:
        log.ensure_topic("t", 2)
        log.append_group([rec("t", f"a{i}", "first") for i in range(5)], "01")


def _committed(root: Path) -> list[bytes | None]:
    with LogStore.open(root) as reader:
        return [r.value for r in read_all(reader, "t")]


def test_a_group_larger_than_the_chunk_is_invisible_until_complete(tmp_path: Path) -> None:
    _first_group(tmp_path)
    seen_mid_group: list[list[bytes | None]] = []

    def records() -> Iterator[ProducerRecord]:
        for i in range(3 * CHUNK + 5):
            if i == 2 * CHUNK + 1:  # two whole chunks are written by now
                seen_mid_group.append(_committed(tmp_path))
            yield rec("t", f"b{i}", "second")

    with LogStore.open(tmp_path, small_config(), writer=True) as log:
        written_before = sum(p.next_offset for p in log._partitions.values())
        watermark = log.append_group(records(), "02", chunk_records=CHUNK)
        assert sum(watermark.end_offsets.values()) == written_before + 3 * CHUNK + 5
    assert seen_mid_group == [[b"first"] * 5]
    assert sorted(_committed(tmp_path)) == [b"first"] * 5 + [b"second"] * (3 * CHUNK + 5)


_CRASH_MID_GROUP = """
import os, sys
from pathlib import Path
from log_store import LogStore
from tests.log_store.helpers import rec, small_config

root = Path(sys.argv[1])
log = LogStore.open(root, small_config(), writer=True)

def records():
    for i in range(10 * 3 + 5):
        if i == 10 * 2 + 1:
            for partition in log._partitions.values():
                partition.sync()  # the written chunks are on disk, the watermark is not
            os._exit(9)
        yield rec("t", f"b{i}", "lost" * 20)

log.append_group(records(), "02", chunk_records=10)
"""


def test_a_crash_mid_group_is_cut_whole_by_recovery(tmp_path: Path) -> None:
    _first_group(tmp_path)
    crashed = subprocess.run(
        [sys.executable, "-c", _CRASH_MID_GROUP, str(tmp_path)], cwd=Path(__file__).parents[2], capture_output=True, check=False
    )
    assert crashed.returncode == 9, crashed.stderr.decode()
    assert _committed(tmp_path) == [b"first"] * 5
    with LogStore.open(tmp_path, small_config(), writer=True) as log:
        report = log.recovery
        assert report is not None and not report.clean_shutdown
        assert sum(cut.truncated_records for cut in report.partitions) == 2 * CHUNK
        assert sorted(r.value for r in read_all(log, "t")) == [b"first"] * 5
        log.append_group([rec("t", "c", "third")], "03")
    assert sorted(_committed(tmp_path)) == [b"first"] * 5 + [b"third"]


@pytest.mark.parametrize("failure", ["iterator", "bad record"])
def test_a_group_failing_after_written_chunks_is_undone(tmp_path: Path, failure: str) -> None:
    _first_group(tmp_path)

    def records() -> Iterator[ProducerRecord]:
        for i in range(2 * CHUNK + 3):
            yield rec("t", f"b{i}", "never")
        if failure == "iterator":
            raise RuntimeError("the producer failed")
        yield ProducerRecord("t", None, b"keyless", 0)

    with LogStore.open(tmp_path, small_config(), writer=True) as log:
        expected = RuntimeError if failure == "iterator" else InvalidRecordError
        with pytest.raises(expected):
            log.append_group(records(), "02", chunk_records=CHUNK)
        assert log.latest_watermark() is not None and log.latest_watermark().position == "01"  # type: ignore[union-attr]
        log.append_group([rec("t", "c", "third")], "03")
        offsets = {tp: log.end_offset(tp) for tp in (TopicPartition("t", 0), TopicPartition("t", 1))}
    assert sum(offsets.values()) == 6  # the undone records left no offsets behind
    assert sorted(_committed(tmp_path)) == [b"first"] * 5 + [b"third"]
