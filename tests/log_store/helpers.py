"""Helpers shared by the log store tests: record factories and whole-log readers."""

from __future__ import annotations

from pathlib import Path

from log_store import LogConfig, LogStore, ProducerRecord, Record, TopicPartition


class FakeClock:
    """A settable millisecond clock for LogConfig.clock."""

    def __init__(self, now: int = 1_700_000_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def rec(
    topic: str, key: str | None, value: str | None, ts: int = 1_000, headers: tuple[tuple[str, bytes], ...] = ()
) -> ProducerRecord:
    """A producer record from text."""
    return ProducerRecord(topic, None if key is None else key.encode(), None if value is None else value.encode(), ts, headers)


def read_all(log: LogStore, topic: str) -> list[Record]:
    """Every committed record of ``topic``, partition by partition, in offset order."""
    out: list[Record] = []
    for p in range(log.partitions(topic)):
        tp = TopicPartition(topic, p)
        offset = 0
        while True:
            batch = log.read(tp, offset, max_records=500)
            if not batch:
                break
            out += batch
            offset = batch[-1].offset + 1
    return out


def latest_by_key(records: list[Record]) -> dict[bytes | None, bytes | None]:
    """The last value seen per key."""
    return {r.key: r.value for r in records}


def segment_files(root: Path, topic: str, partition: int) -> list[Path]:
    """The segment files of one partition, in offset order."""
    return sorted((root / "topics" / topic / str(partition)).glob("*.log"))


def small_config(**overrides: object) -> LogConfig:
    """A config with tiny segments so tests produce several of them."""
    values: dict[str, object] = {"segment_bytes": 2048, "index_interval_bytes": 256}
    values.update(overrides)
    return LogConfig(**values)  # type: ignore[arg-type]
