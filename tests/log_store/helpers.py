"""Helpers shared by the log store tests: record factories and whole-log readers."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from crc32c import crc32c

from log_store import LogConfig, LogStore, ProducerRecord, Record, TopicPartition
from log_store.record_batch import (
    ATTR_COMPACTED,
    CRC,
    HEADER_SIZE,
    HEADER_TAIL,
    MAGIC_ROWS,
    RECORD,
    encode_headers,
)


class FakeClock:
    """A settable millisecond clock for LogConfig.clock."""

    def __init__(self, now: int = 1_700_000_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def rec(topic: str, key: str | None, value: str | None, ts: int = 1_000,
        headers: tuple[tuple[str, bytes], ...] = ()) -> ProducerRecord:
    """A producer record from text."""
    return ProducerRecord(topic, None if key is None else key.encode(),
                          None if value is None else value.encode(), ts, headers)


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


def encode_rows(
    base_offset: int, last_offset_delta: int, records: Iterable[Record], append_time_ms: int,
    attributes: int = ATTR_COMPACTED,
) -> bytes:
    """A row-layout (magic 1) batch, as versions before the column layout wrote them."""
    parts: list[bytes] = []
    max_ts, count = -1, 0
    for record in records:
        block = encode_headers(record.headers) if record.headers else b""
        parts.append(RECORD.pack(record.offset - base_offset, record.timestamp_ms,
                                 -1 if record.key is None else len(record.key),
                                 -1 if record.value is None else len(record.value), len(block)))
        parts += (record.key or b"", record.value or b"", block)
        max_ts = max(max_ts, record.timestamp_ms)
        count += 1
    body = b"".join(parts)
    tail = HEADER_TAIL.pack(HEADER_SIZE + len(body), base_offset, MAGIC_ROWS, attributes,
                            last_offset_delta, count, append_time_ms, max_ts)
    return CRC.pack(crc32c(body, crc32c(tail))) + tail + body
