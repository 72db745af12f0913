"""Which log the pipeline uses: the embedded one under ``CDC_DATA_DIR`` or the one in Kafka (``CDC_LOG``).

Both offer the interface capture and the log's readers use (topics, ``append_group``, ``read``, offsets,
watermarks), with the same records, placement and watermark rules, so the capture loop's exactly-once
restart (:mod:`cdc.coordinator`) is one piece of code for both.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Protocol

from cdc.settings import Settings
from log_store import LogStore, PartitionInfo, ProducerColumns, ProducerRecord, Record, TopicConfig, TopicPartition
from log_store.watermark import Watermark


class Log(Protocol):
    """What capture, ``cdc log``, ``cdc lag`` and the key-change read-back use of a log, which both
    :class:`~log_store.LogStore` and :class:`~log_store.kafka_log.KafkaLog` offer.

    The guarantees behind it are the same for both: ``append_group`` returns only once the group and its
    watermark are durable (fsync; a Kafka commit), a reader never sees past the latest watermark, and a
    writer's ``latest_watermark`` is the position capture resumes after.
    """

    @property
    def root(self) -> Path | str:
        """Where the log is: the embedded log's directory, or a description of the Kafka cluster and prefix."""
        ...

    def topics(self) -> list[str]: ...
    def partitions(self, topic: str) -> int: ...
    def topic_config(self, topic: str) -> TopicConfig: ...
    def ensure_topic(self, name: str, partitions: int, *, compacted: bool = True) -> None: ...
    def append_group(self, records: Iterable[ProducerRecord | ProducerColumns], position: str, *,
                     chunk_records: int = ...) -> Watermark: ...
    def read(self, tp: TopicPartition, offset: int, *, max_records: int = 10_000, max_bytes: int = 16 << 20,
             until: Watermark | None = None) -> list[Record]: ...
    def start_offset(self, tp: TopicPartition) -> int: ...
    def end_offset(self, tp: TopicPartition) -> int: ...
    def latest_watermark(self) -> Watermark | None: ...
    def require_published_watermark(self) -> None: ...
    def verify(self, tp: TopicPartition) -> None: ...
    def describe(self, topic: str) -> list[PartitionInfo]: ...
    def close(self) -> None: ...
    def __enter__(self) -> Log: ...
    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None: ...


def open_log(settings: Settings, *, writer: bool = False) -> Log:
    """The log ``settings`` name, opened for reading or (one process at a time) for writing.

    A Kafka writer fences any earlier writer of the same topic prefix (its next commit fails) and aborts
    the group that writer left open; an embedded writer takes the log's writer lock.
    """
    if settings.uses_kafka:
        from log_store.kafka_log import KafkaLog

        return KafkaLog.open(settings.kafka_settings(), writer=writer)
    if writer:
        return LogStore.open(settings.log_dir, settings.log_config(), writer=True)
    return LogStore.open(settings.log_dir)
