"""The group consumer of the embedded log: order per partition, commits, resumption, watermark visibility."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from log_store import LogStore, ProducerRecord, TopicPartition
from log_store.consumer import Consumer
from tests.log_store.helpers import rec, small_config


def _values(records: list[object]) -> list[str]:
    return [r.value.decode() for r in records]  # type: ignore[attr-defined]


def test_poll_in_order_commit_and_resume(tmp_path: Path) -> None:
    with LogStore.open(tmp_path, small_config(), writer=True) as log:
        log.ensure_topic("t", 2)
        log.append_group([rec("t", f"k{i % 4}", f"{i}") for i in range(40)], f"{1:016X}")
        with LogStore.open(tmp_path) as reader:
            first = Consumer(reader, "a")
            first.subscribe(["t", "later"])  # a topic that does not exist yet is waited for
            got = first.poll(max_records=15)
            assert len(got) == 15
            first.commit()
            committed = first.committed()
            assert committed == {tp: first.position(tp) for tp in first.assignment()}
            more = first.poll(max_records=5)  # polled, never committed: read again after a restart
            again = Consumer(reader, "a")
            again.subscribe(["t", "later"])
            rest = again.poll(max_records=1000)
            assert {(r.partition, r.offset) for r in more} <= {(r.partition, r.offset) for r in rest}
            seen = got + rest
            assert sorted((r.partition, r.offset) for r in seen) == sorted(
                (p, o) for p in range(2) for o in range(log.end_offset(TopicPartition("t", p)))
            )
            for partition in range(2):
                offsets = [r.offset for r in seen if r.partition == partition]
                assert offsets == sorted(offsets) == list(range(len(offsets)))
            other = Consumer(reader, "b")  # another group reads everything on its own
            other.subscribe(["t"])
            assert len(other.poll(max_records=1000)) == 40 and reader.consumer_groups() == ["a"]
            log.ensure_topic("later", 1)
            log.append_group([rec("later", "x", "late")], f"{2:016X}")
            assert _values(again.poll(timeout_s=5.0)) == ["late"]
            assert again.commit() and again.commit() == {}  # nothing moved: nothing written
            latest = Consumer(reader, "c", reset="latest")
            latest.subscribe(["t"])
            assert latest.poll() == []


def test_a_group_being_appended_is_invisible_until_its_watermark(tmp_path: Path) -> None:
    with LogStore.open(tmp_path, small_config(), writer=True) as log:
        log.ensure_topic("t", 1)
        log.append_group([rec("t", "k", "before")], f"{1:016X}")
        reader = LogStore.open(tmp_path)
        consumer = Consumer(reader, "g")
        consumer.subscribe(["t"])
        assert _values(consumer.poll()) == ["before"]
        seen_mid_group: list[list[object]] = []

        def group() -> Iterator[ProducerRecord]:
            for i in range(3000):  # several chunks: the first ones are on disk before the last is made
                if i == 2500:
                    seen_mid_group.append(list(consumer.poll()))
                yield rec("t", "k", f"in-{i}")

        log.append_group(group(), f"{2:016X}", chunk_records=1000)
        assert seen_mid_group == [[]]
        assert len(consumer.poll(max_records=5000)) == 3000
        reader.close()
