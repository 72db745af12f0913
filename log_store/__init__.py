"""A durable, compacted, partitioned, append-only log modelled on Kafka's: embedded on local disk
(:class:`LogStore`), or kept in Apache Kafka (:mod:`log_store.kafka`), both behind one interface
(:mod:`log_store.log`: :class:`~log_store.log.LogReader` for readers, :class:`~log_store.log.Log` for
the writer).

Public API (see ``API.md``)::

    from log_store import LogStore, LogConfig, ProducerRecord, Record, Watermark, TopicPartition

The embedded log's on-disk format is specified in the docstrings of :mod:`log_store.store` (root layout),
:mod:`log_store.segment`, :mod:`log_store.record_batch`, :mod:`log_store.offset_index`,
:mod:`log_store.watermark`, :mod:`log_store.topic`, :mod:`log_store.consumer_offsets` and
:mod:`log_store.log_cleaner`; recovery is described in :mod:`log_store.recovery`. The package knows
nothing of PostgreSQL or Spark.
"""

from __future__ import annotations

from log_store.batch_decoding import RecordColumns
from log_store.cleaner import CleanerStats
from log_store.config import LogConfig
from log_store.log_cleaner import CleanerReport, PartitionCleaning
from log_store.partitioner import murmur2, partition_arrow, partition_for_key, positive_hashes_arrow
from log_store.producer_columns import ProducerColumns
from log_store.record import UNCHANGED_HEADER, Headers, ProducerRecord, Record, TopicPartition, first_header
from log_store.recovery import PartitionCut, RecoveryReport
from log_store.store import AtTime, LogStore, OffsetReset, PartitionInfo
from log_store.topic import TopicConfig
from log_store.watermark import Watermark

__all__ = [
    "UNCHANGED_HEADER",
    "AtTime",
    "CleanerReport",
    "CleanerStats",
    "Headers",
    "LogConfig",
    "LogStore",
    "OffsetReset",
    "PartitionCleaning",
    "PartitionCut",
    "PartitionInfo",
    "ProducerColumns",
    "ProducerRecord",
    "Record",
    "RecordColumns",
    "RecoveryReport",
    "TopicConfig",
    "TopicPartition",
    "Watermark",
    "first_header",
    "murmur2",
    "partition_arrow",
    "partition_for_key",
    "positive_hashes_arrow",
]
