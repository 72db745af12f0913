"""The log kept in Apache Kafka: the same topics, records, placement and watermarks as the embedded log.

:class:`KafkaLog` offers the part of :class:`~log_store.store.LogStore`'s interface that capture and
the log's readers use (topics, ``append_group``, ``read``, offsets, watermarks), so that the capture loop
and its restart rules are the same code on both backends.

**Placement.** Every record names its partition explicitly, chosen by :class:`Partitioner` exactly as
the embedded log chooses it (murmur2 of the key, made positive, modulo the partition count: Kafka's
default partitioner). Keys, values, headers and timestamps are produced as they are; a record read back
from Kafka equals the embedded log's, byte for byte, but for its offset.

**Topics.** ``ensure_topic`` creates a topic with the log's settings, or refuses an existing one with
others (:mod:`log_store.kafka.topics`).

**Whole groups, durable before they count (promises 1 and 2).** One :meth:`KafkaLog.append_group` is
one Kafka transaction of a transactional producer (``transactional.id`` ``<prefix>.capture``): its
records, then its watermark (the group's position and the end offset of every topic-partition, encoded
as the embedded log encodes it) on the compacted topic ``<prefix>.__watermarks``, then the commit. It
returns only once the commit returned, so the capture loop confirms the slot only for what Kafka
committed, with ``acks=all``. A failure before the commit aborts the transaction: no read-committed
reader ever sees any of the group, and the exception propagates.

**After a crash.** Opening the log as writer calls ``init_transactions``, which aborts a transaction
the previous writer left open and fences that writer (a zombie's next commit fails); the latest
watermark is then the last committed record of ``<prefix>.__watermarks``. The capture loop skips what
the slot resends up to that position, as on the embedded log.

**Reading.** Every read is ``isolation.level=read_committed`` and stops at the end offset the latest
watermark (or a given one) names for its partition. A transaction's commit marker takes an offset of
its own, so a watermark's end offset is the group's last record offset plus one, and offsets are not
contiguous across groups: readers move by offsets returned, never by counting.

Reaching Kafka (settings, errors, librdkafka's log lines) is :mod:`log_store.kafka.client`; the topics are
:mod:`log_store.kafka.topics`, producing a group's records :mod:`log_store.kafka.group_producer`, the
read-committed reads :mod:`log_store.kafka.committed_reads` (the bases of :class:`KafkaLog`, which share one
producer, one consumer and one set of partition counts).
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice
from types import TracebackType
from typing import Any, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from log_store.errors import UnknownTopicError
from log_store.kafka.client import KafkaLogError, KafkaSettings, client_log
from log_store.kafka.committed_reads import CommittedReads
from log_store.kafka.group_producer import PRODUCE_WINDOW, GroupProducer, _Deliveries
from log_store.partitioner import Partitioner
from log_store.producer_columns import ProducerColumns
from log_store.record import ProducerRecord, Record, TopicPartition
from log_store.store import PartitionInfo
from log_store.watermark import Watermark

#: The key of every watermark record: compaction keeps the latest one.
WATERMARK_KEY = b"watermark"


class KafkaLog(GroupProducer, CommittedReads):
    """The log in Kafka (see the module docstring); one writer per prefix, any number of readers."""

    def __init__(self, settings: KafkaSettings, writer: bool) -> None:
        self.settings = settings
        self.writer = writer
        self.root = settings.describe()
        # librdkafka's own log lines go to this module's logger, not to stderr
        self._client: dict[str, Any] = {
            "bootstrap.servers": settings.bootstrap,
            **settings.client,
            "logger": client_log,
            "error_cb": self._on_client_error,
        }
        #: the clients' last error of their own (a refused login, say), which a failed request only echoes
        self._client_error: KafkaError | None = None
        try:
            self._admin: AdminClient | None = AdminClient(self._client)
        except KafkaException as exc:  # a setting librdkafka refuses before connecting (a key it cannot open)
            raise KafkaLogError.client_settings(settings.bootstrap, exc.args[0]) from None
        self._partitioner = Partitioner()
        self._partition_counts: dict[str, int] = {}
        self._compacted: dict[str, bool] = {}
        self._producer: Producer | None = None
        self._consumer: Consumer | None = None
        self._uncommitted: Consumer | None = None  # offsets only: never reads a record
        self._current: Watermark | None = None
        self._fatal: KafkaError | None = None
        self._partial_topics: set[str] = set()
        self._closed = False

    @classmethod
    def open(cls, settings: KafkaSettings, *, writer: bool = False) -> KafkaLog:
        """Connect (one metadata request: the brokers answer). A writer also creates the watermark topic
        when missing, fences any earlier writer of the prefix, aborts the group it left open and reads the
        latest watermark; a reader reads it when asked."""
        log_ = cls(settings, writer)
        try:
            metadata = log_._metadata()
            if writer:
                if settings.watermark_topic not in metadata.topics:
                    log_._create(settings.watermark_topic, 1, True)
                log_._start_producer()
                log_._current = log_._read_latest_watermark()
        except BaseException:
            log_.close()
            raise
        return log_

    # --- appending ---------------------------------------------------------------------------

    def append_group(
        self,
        records: Iterable[ProducerRecord | ProducerColumns],
        position: str,
        *,
        chunk_records: int = 0,
    ) -> Watermark:
        """Append ``records`` and their watermark at ``position`` as one Kafka transaction (module docstring).

        When this returns the group is committed; when it raises, the transaction was aborted and no
        reader sees any of it. ``chunk_records`` is accepted for the embedded log's signature.
        """
        self._require_writer("append_group")
        if not isinstance(position, str):
            raise TypeError(f"position must be a str, not {type(position).__name__}")
        producer = self._producer
        assert producer is not None
        if self._fatal is not None:
            raise KafkaLogError(self.settings.bootstrap, "appending a group", self._fatal)
        deliveries = _Deliveries()
        try:
            try:
                producer.begin_transaction()
            except KafkaException as exc:
                raise KafkaLogError(self.settings.bootstrap, "beginning a group", exc.args[0]) from None
            iterator = iter(records)
            while chunk := list(islice(iterator, PRODUCE_WINDOW)):
                self._produce_chunk(producer, chunk, deliveries)
                self._settle(producer, deliveries)
            watermark = self._next_watermark(position, deliveries)
            self._produce(
                producer,
                self.settings.watermark_topic,
                0,
                WATERMARK_KEY,
                watermark.encode(),
                watermark.timestamp_ms,
                (),
                deliveries,
            )
            self._commit(producer)
        except BaseException as exc:
            refused = self._abort(producer)
            if refused is not None and isinstance(exc, KafkaLogError) and refused.fatal():
                self._fatal = refused  # the producer is unusable: say why, now and for every later group
                raise KafkaLogError(self.settings.bootstrap, "appending a group", refused) from None
            raise
        self._current = watermark
        return watermark

    # --- reading -----------------------------------------------------------------------------

    def latest_watermark(self) -> Watermark | None:
        """The newest committed watermark (a reader asks Kafka each time; a writer knows its own)."""
        if not self.writer:
            self._current = self._read_latest_watermark()
        return self._current

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
        """Committed records of ``tp`` from ``offset``, below the end offset for ``tp`` of ``until`` (default:
        the latest watermark), or below ``end`` when given without ``until``.

        ``end`` is for readers that took it from a watermark already: it saves asking Kafka for the latest
        one, and is as safe, since every committed record is below a committed watermark (the two commit
        in one transaction). ``max_bytes`` is accepted for the embedded log's signature.
        """
        tp = TopicPartition(*tp)
        self._check_partition(tp)
        if end is None or until is not None:
            watermark = until if until is not None else self.latest_watermark()
            if watermark is None:
                return []
            end = watermark.end_offset(tp) if end is None else min(end, watermark.end_offset(tp))
        messages = self._fetch(tp, max(offset, 0), end, max_records)
        return [
            Record(
                tp.topic,
                tp.partition,
                cast(int, m.offset()),
                m.key(),
                m.value(),
                m.timestamp()[1],
                tuple(cast(list[tuple[str, bytes]], m.headers() or ())),
            )
            for m in messages
        ]

    def _check_partition(self, tp: TopicPartition) -> None:
        count = self.partitions(tp.topic)
        if not 0 <= tp.partition < count:
            raise UnknownTopicError(self.root, tp.topic, tp.partition, count)  # type: ignore[arg-type]

    def end_offset(self, tp: TopicPartition) -> int:
        """The end offset of ``tp`` at the latest watermark."""
        tp = TopicPartition(*tp)
        self._check_partition(tp)
        watermark = self.latest_watermark()
        return watermark.end_offset(tp) if watermark is not None else 0

    def start_offset(self, tp: TopicPartition) -> int:
        """The first offset Kafka still stores for ``tp`` (retention and compaction move it forward)."""
        tp = TopicPartition(*tp)
        self._check_partition(tp)
        return min(self._bounds(tp)[0], self.end_offset(tp))

    def require_published_watermark(self) -> None:
        """Nothing to check: the watermark topic is created with the log, and holds committed records only."""

    def verify(self, tp: TopicPartition) -> None:
        """Nothing to check here: Kafka checks every batch's CRC itself (brokers on write, clients on read)."""
        self._check_partition(TopicPartition(*tp))

    def describe(self, topic: str) -> list[PartitionInfo]:
        """Per-partition start and end offsets of ``topic`` (Kafka keeps segments and sizes to itself)."""
        compacted = self._is_compacted(topic)
        watermark = self.latest_watermark()  # once for all partitions, so that they show one moment
        rows = []
        for p in range(self.partitions(topic)):
            tp = TopicPartition(topic, p)
            end = watermark.end_offset(tp) if watermark is not None else 0
            rows.append(PartitionInfo(tp, min(self._bounds(tp)[0], end), end, 0, 0, None if not compacted else 0.0))
        return rows

    # --- closing -----------------------------------------------------------------------------

    def close(self) -> None:
        """Release the clients (an open transaction cannot exist: every group ends in commit or abort)."""
        if self._closed:
            return
        self._closed = True
        self._admin = None
        for consumer in (self._consumer, self._uncommitted):
            if consumer is not None:
                consumer.close()
        self._consumer = self._uncommitted = None
        if self._producer is not None:
            self._producer.flush(self.settings.timeout_s)
            self._producer = None

    def __enter__(self) -> KafkaLog:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"KafkaLog({self.root!r}, writer={self.writer})"


__all__ = ["KafkaLog", "KafkaLogError", "KafkaSettings", "WATERMARK_KEY"]
