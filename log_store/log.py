"""The log's interface: what its readers and its writer use, offered by the embedded log and by Kafka.

:class:`~log_store.LogStore` (the embedded log, on local disk) and :class:`~log_store.kafka.log.KafkaLog`
(the same log in Kafka) both offer it, so capture, ``cdc log``, ``cdc lag`` and the views are written
once against these protocols and run on either backend.

The guarantees behind it are the same for both: ``append_group`` returns only once the group and its
watermark are durable (fsync; a Kafka commit), a reader never sees past the latest watermark (nor past
``end`` when given), and a writer's ``latest_watermark`` is the position capture resumes after.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Protocol

from log_store.producer_columns import ProducerColumns
from log_store.record import ProducerRecord, Record, TopicPartition
from log_store.store import PartitionInfo
from log_store.topic import TopicConfig
from log_store.watermark import Watermark


class LogReader(Protocol):
    """What a reader of the log uses: topics, offsets, watermarks and committed records."""

    @property
    def root(self) -> Path | str:
        """Where the log is: the embedded log's directory, or a description of the Kafka cluster and prefix."""
        ...

    def topics(self) -> list[str]: ...
    def partitions(self, topic: str) -> int: ...
    def topic_config(self, topic: str) -> TopicConfig: ...
    def read(
        self,
        tp: TopicPartition,
        offset: int,
        *,
        max_records: int = 10_000,
        max_bytes: int = 16 << 20,
        until: Watermark | None = None,
        end: int | None = None,
    ) -> list[Record]:
        """Committed records of ``tp`` from ``offset``, below the end offset ``until`` (default: the latest
        watermark) gives ``tp``, and below ``end`` when given."""
        ...

    def start_offset(self, tp: TopicPartition) -> int: ...
    def end_offset(self, tp: TopicPartition) -> int: ...
    def latest_watermark(self) -> Watermark | None: ...
    def require_published_watermark(self) -> None: ...
    def verify(self, tp: TopicPartition) -> None: ...
    def describe(self, topic: str) -> list[PartitionInfo]: ...
    def close(self) -> None: ...
    def __enter__(self) -> LogReader: ...
    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None: ...


class Log(LogReader, Protocol):
    """What the log's one writer (capture) uses besides reading: topics made, groups appended."""

    def ensure_topic(self, name: str, partitions: int, *, compacted: bool = True) -> None: ...
    def append_group(
        self, records: Iterable[ProducerRecord | ProducerColumns], position: str, *, chunk_records: int = ...
    ) -> Watermark: ...
    def __enter__(self) -> Log: ...
