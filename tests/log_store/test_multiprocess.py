"""One writer process and a reader process at the same time: whole groups only, never past the watermark."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from log_store import LogStore, Record, TopicPartition

GROUPS = 60
PER_GROUP = 25
PARTITIONS = 3

_WRITER = f"""
import sys
from pathlib import Path
from log_store import LogConfig, LogStore, ProducerRecord
log = LogStore.open(Path(sys.argv[1]), LogConfig(segment_bytes=4096), writer=True)
log.ensure_topic("t", {PARTITIONS})
print("ready", flush=True)
for g in range({GROUPS}):
    records = [ProducerRecord("t", b"k%d" % ((g * 7 + i) % 40), b"%d:%d" % (g, i), g)
               for i in range({PER_GROUP})]
    watermark = log.append_group(records, "%016X" % g)
    print(watermark.sequence, flush=True)
log.close()
print("closed", flush=True)
"""


def _drain(log: LogStore, positions: dict[TopicPartition, int], seen: list[Record]) -> int:
    watermark = log.latest_watermark()
    if watermark is None:
        return 0
    for tp in positions:
        while batch := log.read(tp, positions[tp], max_records=50, until=watermark):
            assert batch[-1].offset < watermark.end_offset(tp)
            seen += batch
            positions[tp] = batch[-1].offset + 1
        assert positions[tp] <= watermark.end_offset(tp)
    groups: dict[int, int] = {}
    for record in seen:
        group = int((record.value or b"").split(b":")[0])
        groups[group] = groups.get(group, 0) + 1
    assert all(count == PER_GROUP for count in groups.values()), "a partial group was visible"
    assert sorted(groups) == list(range(len(groups)))
    assert len(groups) >= watermark.sequence
    return watermark.sequence


def test_reader_process_follows_a_writer_process(tmp_path: Path) -> None:
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2]
    )
    assert writer.stdout is not None
    try:
        assert writer.stdout.readline().strip() == "ready"
        log = LogStore.open(tmp_path)
        positions = {TopicPartition("t", p): 0 for p in range(PARTITIONS)}
        seen: list[Record] = []
        acknowledged = 0
        while acknowledged < GROUPS:
            acknowledged = int(writer.stdout.readline())
            # the writer has returned from append_group: the reader must see at least that much
            assert _drain(log, positions, seen) >= acknowledged
        assert writer.stdout.readline().strip() == "closed"
        assert len(seen) == GROUPS * PER_GROUP
        offsets = {(r.partition, r.offset) for r in seen}
        assert len(offsets) == len(seen)
        log.close()
    finally:
        writer.wait(timeout=60)
    assert writer.returncode == 0
