"""Property tests: random appends, crashes that cut files at random bytes, recovery and compaction.

Invariants checked after every step, through a fresh reader:

* every key read from offset 0 shows its latest acknowledged value (tombstones included);
* offsets only grow within a partition, and no offset is ever handed out twice to different records;
* nothing past the watermark is visible, and a group cut short by a crash is visible whole or not at all.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from log_store import LogConfig, LogStore, ProducerRecord, Record, TopicPartition, Watermark
from tests.log_store.helpers import FakeClock

KEYS = [f"k{i}".encode() for i in range(6)]
PARTITIONS = 2

record_strategy = st.tuples(st.sampled_from(KEYS), st.one_of(st.none(), st.binary(max_size=60)))
group_strategy = st.lists(record_strategy, max_size=14)
step_strategy = st.one_of(
    st.tuples(st.just("append"), group_strategy),
    st.tuples(st.just("crash"), group_strategy),
    st.tuples(st.just("compact"), st.booleans()),
    st.tuples(st.just("reopen"), st.none()),
)


def _files(root: Path) -> dict[Path, int]:
    paths = [p for p in (root / "topics").rglob("*") if p.suffix in (".log", ".index")]
    paths.append(root / "watermarks.log")
    return {p: p.stat().st_size for p in paths}


def _abandon(log: LogStore) -> None:
    """Drop a writer the way a crash does: no sealing, no clean-shutdown marker."""
    for partition in log._partitions.values():
        if partition.active is not None:
            partition.active.close()
    log._watermarks.close()
    if log._sync_pool is not None:
        log._sync_pool.close()
    assert log._writer_lock is not None
    log._writer_lock.release()


class Model:
    """What the log must show: the acknowledged records per partition."""

    def __init__(self) -> None:
        self.latest: dict[bytes, bytes | None] = {}
        self.seen: dict[tuple[int, int], Record] = {}  # every record ever visible, by position

    def acknowledge(self, records: list[ProducerRecord]) -> None:
        for record in records:
            assert record.key is not None
            self.latest[record.key] = record.value


def _check(root: Path, config: LogConfig, model: Model, inflight: list[ProducerRecord]) -> None:
    with LogStore.open(root, config) as reader:
        watermark = reader.latest_watermark()
        visible: list[Record] = []
        for p in range(PARTITIONS):
            tp = TopicPartition("t", p)
            end = watermark.end_offset(tp) if watermark is not None else 0
            records: list[Record] = []
            offset = 0
            while batch := reader.read(tp, offset, max_records=7):
                records += batch
                offset = batch[-1].offset + 1
            offsets = [r.offset for r in records]
            assert offsets == sorted(set(offsets))
            assert all(o < end for o in offsets)
            for record in records:
                earlier = model.seen.setdefault((p, record.offset), record)
                assert earlier == record, "an offset now names a different record"
            visible += records
    latest = {r.key: r.value for r in visible}
    assert latest == model.latest
    del inflight


@settings(
    max_examples=int(os.environ.get("LOG_PROPERTY_EXAMPLES", "30")), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(steps=st.lists(step_strategy, min_size=1, max_size=8), data=st.data())
def test_appends_crashes_recovery_and_compaction_keep_the_invariants(
    steps: list[tuple[str, object]],
    data: st.DataObject,
) -> None:
    clock = FakeClock()
    config = LogConfig(segment_bytes=600, index_interval_bytes=100, clock=clock, delete_retention_ms=10**12)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = Model()
        log = LogStore.open(root, config, writer=True)
        log.ensure_topic("t", PARTITIONS)
        try:
            for n, (kind, arg) in enumerate(steps):
                inflight: list[ProducerRecord] = []
                if kind == "append":
                    records = [ProducerRecord("t", k, v, n) for k, v in arg]  # type: ignore[union-attr]
                    log.append_group(records, f"{n:016X}")
                    model.acknowledge(records)
                elif kind == "compact":
                    if arg:
                        log.roll()
                    with LogStore.open(root, config) as cleaner:
                        cleaner.compact()
                elif kind == "reopen":
                    log.close()
                    log = LogStore.open(root, config, writer=True)
                    assert log.recovery is not None and not log.recovery.cut_anything
                else:
                    inflight = [ProducerRecord("t", k, v, n) for k, v in arg]  # type: ignore[union-attr]
                    log = _crash_and_recover(log, root, config, inflight, model, data)
                _check(root, config, model, inflight)
        finally:
            log.close()


def _crash_and_recover(
    log: LogStore,
    root: Path,
    config: LogConfig,
    inflight: list[ProducerRecord],
    model: Model,
    data: st.DataObject,
) -> LogStore:
    acknowledged = log.latest_watermark()
    before = _files(root)
    groups = log._encoder.place(inflight)
    for tp, batch in groups.items():
        log._partitions[tp].append(batch, config.clock())
    if data.draw(st.booleans(), label="watermark written"):
        previous = log._watermarks.current
        log._watermarks.append(
            Watermark(
                (previous.sequence + 1) if previous is not None else 1,
                "inflight",
                0,
                {tp: p.next_offset for tp, p in log._partitions.items()},
            )
        )
    _abandon(log)
    for path, size in _files(root).items():  # the crash keeps a random prefix of unsynced bytes
        cut = data.draw(st.integers(before.get(path, 0), size), label=f"cut {path.name}")
        os.truncate(path, cut)
    log = LogStore.open(root, config, writer=True)
    recovered = log.latest_watermark()
    acked_seq = acknowledged.sequence if acknowledged is not None else 0
    assert recovered is None or recovered.sequence in (acked_seq, acked_seq + 1)
    if recovered is not None and recovered.sequence == acked_seq + 1:
        model.acknowledge(inflight)  # the whole group made it
    else:
        assert recovered == acknowledged
    return log
