"""The log kept in Apache Kafka: the same topics, records, placement and watermarks as the embedded log.

:class:`KafkaLog` offers the part of :class:`~log_store.store.LogStore`'s interface that capture and
the log's readers use (topics, ``append_group``, ``read``, offsets, watermarks), so that the capture loop
and its restart rules are the same code on both backends.

**Placement.** Every record names its partition explicitly, chosen by :class:`Partitioner` exactly as
the embedded log chooses it (murmur2 of the key, made positive, modulo the partition count: Kafka's
default partitioner). Keys, values, headers and timestamps are produced as they are; a record read back
from Kafka equals the embedded log's, byte for byte, but for its offset.

**Topics.** ``ensure_topic`` creates a topic with ``cleanup.policy=compact`` (``delete`` for a keyless
table), the replication factor the brokers default to, and ``delete.retention.ms``; an existing topic
with another partition count or policy is refused (:class:`TopicConfigMismatchError`).

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

Reaching Kafka (settings, errors, librdkafka's log lines) is :mod:`log_store.kafka.client`. This module
runs past 500 lines because a group's transaction, the topics it needs and the read-committed reads
that stop at its watermark share one producer, one consumer and one set of partition counts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import islice
from types import TracebackType
from typing import Any, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer
from confluent_kafka import TopicPartition as KafkaPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from log_store.errors import (
    InvalidRecordError,
    ReadOnlyError,
    TopicConfigMismatchError,
    UnknownTopicError,
)
from log_store.kafka.client import KafkaLogError, KafkaSettings, client_log, fenced
from log_store.partitioner import Partitioner
from log_store.producer_columns import ProducerColumns, split_runs
from log_store.record import UNCHANGED_HEADER, ProducerRecord, Record, TopicPartition, first_header
from log_store.store import PartitionInfo
from log_store.topic import TopicConfig, validate_topic_name
from log_store.watermark import Watermark

log = logging.getLogger("log_store.kafka")


#: The key of every watermark record: compaction keeps the latest one.
WATERMARK_KEY = b"watermark"
#: How many records a group produces before it waits for their deliveries (bounded memory).
PRODUCE_WINDOW = 50_000
#: The largest record a topic takes (Kafka's default is 1 MiB; a source row may be larger).
MAX_RECORD_BYTES = 64 << 20


@dataclass
class _Deliveries:
    """The highest offset delivered per partition in the current group, and the first error."""

    ends: dict[TopicPartition, int] = field(default_factory=dict)
    error: KafkaError | None = None

    def __call__(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            if self.error is None:
                self.error = error
            return
        # a delivered message (no error) always has its topic, partition and offset
        tp = TopicPartition(cast(str, message.topic()), cast(int, message.partition()))
        offset = cast(int, message.offset()) + 1
        if offset > self.ends.get(tp, 0):
            self.ends[tp] = offset


class KafkaLog:
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

    # --- topics ------------------------------------------------------------------------------

    def _admin_client(self) -> AdminClient:
        if self._admin is None:
            raise ReadOnlyError(self.root, "an operation after close()")  # type: ignore[arg-type]
        return self._admin

    def _on_client_error(self, error: KafkaError) -> None:
        if error.code() in (KafkaError._AUTHENTICATION, KafkaError._SSL, KafkaError.SASL_AUTHENTICATION_FAILED):
            self._client_error = error

    def _metadata(self) -> Any:
        self._client_error = None
        try:
            return self._admin_client().list_topics(timeout=self.settings.timeout_s)
        except KafkaException as exc:
            self._admin_client().poll(0)  # serves the error callback: a refused login is said there
            raise KafkaLogError(
                self.settings.bootstrap, "reading the cluster's topics", self._client_error or exc.args[0]
            ) from None

    def _topic_settings(self, compacted: bool) -> dict[str, str]:
        settings = {"cleanup.policy": "compact" if compacted else "delete", "max.message.bytes": str(MAX_RECORD_BYTES)}
        if compacted:
            settings["delete.retention.ms"] = str(self.settings.delete_retention_ms)
        else:
            settings["retention.ms"] = str(self.settings.retention_ms)
            settings["retention.bytes"] = str(self.settings.retention_bytes)
        return settings

    def _create(self, name: str, partitions: int, compacted: bool) -> None:
        futures = self._admin_client().create_topics(
            [NewTopic(name, partitions, -1, config=self._topic_settings(compacted))],
            operation_timeout=self.settings.timeout_s,
            request_timeout=self.settings.timeout_s,
        )
        try:
            futures[name].result()
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise KafkaLogError(self.settings.bootstrap, f"creating topic {name!r}", exc.args[0]) from None
        self._await_topic(name)

    def _await_topic(self, name: str) -> None:
        """Wait until every partition of a new topic has a leader (creation is asynchronous)."""
        deadline = time.monotonic() + self.settings.timeout_s
        while time.monotonic() < deadline:
            topic = self._metadata().topics.get(name)
            if (
                topic is not None
                and topic.error is None
                and topic.partitions
                and all(p.leader >= 0 for p in topic.partitions.values())
            ):
                return
            time.sleep(0.1)
        raise KafkaLogError(self.settings.bootstrap, f"waiting for topic {name!r} to get leaders", "timed out")

    def _policy(self, name: str) -> str:
        resource = ConfigResource(ConfigResource.Type.TOPIC, name)
        try:
            described = self._admin_client().describe_configs([resource], request_timeout=self.settings.timeout_s)
            configs = described[resource].result()
        except KafkaException as exc:
            raise KafkaLogError(self.settings.bootstrap, f"reading topic {name!r}'s settings", exc.args[0]) from None
        return str(configs["cleanup.policy"].value)

    def ensure_topic(self, name: str, partitions: int, *, compacted: bool = True) -> None:
        """Create the topic if it does not exist; an existing one must have the same partition count and policy."""
        self._require_writer("ensure_topic")
        validate_topic_name(name)
        if not isinstance(partitions, int) or partitions < 1:
            raise ValueError(f"a topic needs at least one partition, not {partitions!r}")
        existing = self._metadata().topics.get(name)
        if existing is None:
            self._create(name, partitions, compacted)
        else:
            if len(existing.partitions) != partitions:
                raise TopicConfigMismatchError(name, "partitions", len(existing.partitions), partitions)
            policy = self._policy(name)
            if ("compact" in policy.split(",")) != compacted:
                raise TopicConfigMismatchError(name, "cleanup.policy", policy, "compact" if compacted else "delete")
        self._partition_counts[name] = partitions
        self._compacted[name] = compacted

    def topics(self) -> list[str]:
        """The prefix's topics, sorted (not the watermark topic, nor other pipelines' or Kafka's own)."""
        names = self._metadata().topics
        return sorted(
            name for name in names if name.startswith(f"{self.settings.prefix}.") and name != self.settings.watermark_topic
        )

    def topic_config(self, topic: str) -> TopicConfig:
        """The settings of ``topic`` (raises :class:`UnknownTopicError`); Kafka keeps no creation time for us."""
        return TopicConfig(topic, self.partitions(topic), self._is_compacted(topic), 0)

    def partitions(self, topic: str) -> int:
        """The partition count of ``topic`` (raises :class:`UnknownTopicError`)."""
        count = self._partition_counts.get(topic)
        if count is None:
            found = self._metadata().topics.get(topic)
            if found is None or found.error is not None:
                raise UnknownTopicError(self.root, topic)
            count = self._partition_counts[topic] = len(found.partitions)
        return count

    def _is_compacted(self, topic: str) -> bool:
        compacted = self._compacted.get(topic)
        if compacted is None:
            compacted = self._compacted[topic] = "compact" in self._policy(topic).split(",")
        return compacted

    # --- appending ---------------------------------------------------------------------------

    def _require_writer(self, operation: str) -> None:
        if not self.writer:
            raise ReadOnlyError(self.root, operation)  # type: ignore[arg-type]
        if self._closed:
            raise ReadOnlyError(self.root, f"{operation} after close()")  # type: ignore[arg-type]

    def _start_producer(self) -> None:
        self._producer = Producer(
            {
                **self._client,
                "transactional.id": self.settings.transactional_id,
                "transaction.timeout.ms": self.settings.transaction_timeout_ms,
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": int(self.settings.timeout_s * 1000),
                "message.max.bytes": MAX_RECORD_BYTES + (1 << 20),
                "queue.buffering.max.messages": PRODUCE_WINDOW * 2,
            }
        )
        try:
            self._producer.init_transactions(self.settings.timeout_s)
        except KafkaException as exc:
            raise KafkaLogError(self.settings.bootstrap, "starting the capture's transactional producer", exc.args[0]) from None

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

    def _produce_chunk(self, producer: Producer, chunk: list[ProducerRecord | ProducerColumns], deliveries: _Deliveries) -> None:
        """Produce one window of the group, in order: a block of columns between records keeps its place."""
        for run in split_runs(chunk):
            if isinstance(run, ProducerColumns):
                self._produce_columns(producer, run, deliveries)
            else:
                self._produce_records(producer, run, deliveries)

    def _next_watermark(self, position: str, deliveries: _Deliveries) -> Watermark:
        """The group's watermark: the end offset of every partition once ``deliveries`` are in."""
        previous = self._current
        ends = dict(previous.end_offsets) if previous is not None else {}
        ends.update(deliveries.ends)
        for topic, count in self._partition_counts.items():
            for p in range(count):
                ends.setdefault(TopicPartition(topic, p), 0)
        sequence = (previous.sequence + 1) if previous is not None else 1
        return Watermark(sequence, position, int(time.time() * 1000), ends)

    @staticmethod
    def _keyless(topic: str) -> InvalidRecordError:
        return InvalidRecordError(
            topic, "a record has no key, and the topic is compacted", "give every record of a compacted topic a key"
        )

    def _produce_columns(self, producer: Producer, block: ProducerColumns, deliveries: _Deliveries) -> None:
        """Produce a block of columns, placed as the embedded log places it (murmur2 over the Arrow keys)."""
        count = self.partitions(block.topic)
        if self._is_compacted(block.topic) and block.null_keys():
            raise self._keyless(block.topic)
        placed = self._partitioner.columns_array(block.topic, block.keys, len(block), count).tolist()
        keys = [None] * len(block) if block.keys is None else block.keys.to_pylist()
        for partition, key, value in zip(placed, keys, block.values.to_pylist(), strict=True):
            self._produce(producer, block.topic, partition, _as_bytes(key), _as_bytes(value), block.timestamp_ms, (), deliveries)

    def _produce_records(self, producer: Producer, records: Sequence[ProducerRecord], deliveries: _Deliveries) -> None:
        """Produce records of any topics in their order, each run of one topic placed at once (numpy murmur2)."""
        start = 0
        while start < len(records):
            topic = records[start][0]
            stop = start + 1
            while stop < len(records) and records[stop][0] == topic:
                stop += 1
            run = records[start:stop]
            count = self.partitions(topic)
            keys = [record[1] for record in run]
            if None in keys:
                if self._is_compacted(topic):
                    raise self._keyless(topic)
                placed = self._partitioner.partitions(topic, keys, count)
            else:
                placed = [0] * len(run) if count == 1 else self._partitioner.keyed_array(keys, count).tolist()  # type: ignore[arg-type]
            for partition, (_, key, value, timestamp_ms, headers) in zip(placed, run, strict=True):
                if headers:
                    self._note_partial(topic, headers)
                self._produce(producer, topic, partition, key, value, timestamp_ms, headers, deliveries)
            start = stop

    def _note_partial(self, topic: str, headers: Any) -> None:
        """Warn, once per topic, of a record that leaves unchanged columns out (capture writes whole rows here)."""
        if topic not in self._partial_topics and first_header(headers, UNCHANGED_HEADER) is not None:
            self._partial_topics.add(topic)
            log.warning(
                "topic %s gets records that leave unchanged columns out (header %r): Kafka's compaction cannot "
                "fold them onto the key's earlier record as the embedded log's does, so once it removes that "
                "record a rebuild lacks those values; give the source table REPLICA IDENTITY FULL "
                "(`cdc setup --check-only` names the tables)",
                topic,
                UNCHANGED_HEADER,
            )

    def _produce(
        self,
        producer: Producer,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes | None,
        timestamp_ms: int,
        headers: Any,
        deliveries: _Deliveries,
    ) -> None:
        while True:
            try:
                producer.produce(
                    topic,
                    value,
                    key,
                    partition=partition,
                    timestamp=timestamp_ms,
                    headers=list(headers) if headers else None,
                    on_delivery=deliveries,
                )
                return
            except BufferError:
                producer.poll(0.05)
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                if error.code() == KafkaError.MSG_SIZE_TOO_LARGE:
                    raise KafkaLogError(
                        self.settings.bootstrap,
                        f"appending a group to {topic}",
                        f"a record of {len(value or b'') + len(key or b''):,} bytes is larger than the "
                        f"{MAX_RECORD_BYTES:,} bytes a topic of this log takes (a row that large cannot go "
                        "into this log: keep its table out of CDC_TABLES, or use the embedded log)",
                        lasting=True,
                    ) from None
                raise KafkaLogError(self.settings.bootstrap, f"appending a group to {topic}", error) from None

    def _settle(self, producer: Producer, deliveries: _Deliveries) -> None:
        """Wait until every record produced so far is delivered (or failed)."""
        try:
            remaining = producer.flush(self.settings.timeout_s)
        except (KafkaException, SystemError) as exc:
            # a fatal producer error (fencing) surfaces from flush, sometimes wrapped by the delivery callback
            raise KafkaLogError(self.settings.bootstrap, "appending a group", deliveries.error or exc) from None
        if deliveries.error is not None:
            raise KafkaLogError(self.settings.bootstrap, "appending a group", deliveries.error)
        if remaining:
            raise KafkaLogError(
                self.settings.bootstrap,
                "appending a group",
                f"{remaining} records not delivered within {self.settings.timeout_s:g} s",
            )

    def _commit(self, producer: Producer) -> None:
        """Commit the group's transaction, retrying what Kafka calls retriable."""
        deadline = time.monotonic() + self.settings.timeout_s
        while True:
            try:
                producer.commit_transaction(self.settings.timeout_s)
                return
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                if error.retriable() and time.monotonic() < deadline:
                    log.warning("committing a group to Kafka at %s: %s; retrying", self.settings.bootstrap, error)
                    continue
                raise KafkaLogError(self.settings.bootstrap, "committing a group", error) from None

    def _abort(self, producer: Producer) -> KafkaError | None:
        """Abort the group's transaction; the error when Kafka refused (a fenced producer cannot abort)."""
        try:
            producer.abort_transaction(self.settings.timeout_s)
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if not fenced(error):
                log.warning(
                    "aborting a group's transaction in Kafka at %s failed (%s); the broker aborts it "
                    "when it times out, or the next writer does",
                    self.settings.bootstrap,
                    error,
                )
            return error
        return None

    # --- reading -----------------------------------------------------------------------------

    def _reader(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(
                {
                    **self._client,
                    "group.id": f"{self.settings.prefix}.log-reader",
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
                    "isolation.level": "read_committed",
                    "enable.partition.eof": True,
                    "auto.offset.reset": "earliest",
                    # reads are bounded: a fetch at the end of the range should come back, not wait for more
                    "fetch.wait.max.ms": 10,
                }
            )
        return self._consumer

    def _bounds(self, tp: TopicPartition) -> tuple[int, int]:
        """``(low, high)`` of ``tp``: its first stored offset and its last stable offset."""
        try:
            low, high = self._reader().get_watermark_offsets(
                KafkaPartition(tp.topic, tp.partition), timeout=self.settings.timeout_s, cached=False
            )
        except KafkaException as exc:
            raise KafkaLogError(self.settings.bootstrap, f"reading the offsets of {tp}", exc.args[0]) from None
        return int(low), int(high)

    def _fetch(self, tp: TopicPartition, start: int, end: int, limit: int) -> list[Message]:
        """Committed records of ``tp`` with offsets in ``[start, end)``, at most ``limit`` of them.

        Reads until ``end`` (or ``limit``), never stopping short at the partition's end: a broker answers a
        commit before it has written the commit markers, so for a moment a partition's last stable offset
        (where a read-committed read ends) may lie below the end offset a committed watermark names. The
        read waits for it, and fails only when no record arrives and the end does not move for
        ``timeout_s`` (a partition that lost committed records: an unclean leader election, a topic
        deleted and made again).
        """
        if start >= end:
            return []
        consumer = self._reader()
        consumer.assign([KafkaPartition(tp.topic, tp.partition, start)])
        out: list[Message] = []
        deadline = time.monotonic() + self.settings.timeout_s
        reached = start
        try:
            while len(out) < limit:
                # a short wait: the records are fetched in the background, and the partition's end arrives
                # as an event (enable.partition.eof), so no call waits for a batch that cannot fill
                batch = consumer.consume(min(limit - len(out), 10_000), 0.02)
                past_end = False
                for message in batch:
                    error = message.error()
                    if error is not None:
                        if error.code() != KafkaError._PARTITION_EOF:  # the end for now: read on until ``end``
                            raise KafkaLogError(self.settings.bootstrap, f"reading {tp}", error)
                        continue
                    if cast(int, message.offset()) >= end:
                        past_end = True
                        continue
                    out.append(message)
                if past_end or len(out) >= limit:
                    break
                position = consumer.position([KafkaPartition(tp.topic, tp.partition)])[0].offset
                if position >= end:
                    break
                if position > reached:  # the read moves: records (or markers, aborted ones) went by
                    reached, deadline = position, time.monotonic() + self.settings.timeout_s
                elif time.monotonic() > deadline:
                    raise KafkaLogError(
                        self.settings.bootstrap,
                        f"reading {tp}",
                        f"it holds committed records up to offset {reached} only, short of offset {end} that the "
                        f"log's watermark names, and did not move for {self.settings.timeout_s:g} s (a topic that "
                        "lost committed records: rebuild the log with a new snapshot)",
                    )
        finally:
            consumer.unassign()
        return out[:limit]

    def _settled_bounds(self, tp: TopicPartition) -> tuple[int, int]:
        """:meth:`_bounds` of the watermark topic once no group's commit is under way on it.

        A broker answers a commit before it writes the commit markers, so right after a capture's commit
        returned the group's watermark may not be readable yet. A watermark is the last record of its
        group, so the watermark partition holds records past its last stable offset only while a commit
        is completing (or, after a crash inside one, until the next writer aborts it): the read waits
        until the two meet, at most ``timeout_s``. So a reader that starts after a commit returned sees
        that commit (read-your-writes, as with the embedded log).
        """
        deadline = time.monotonic() + self.settings.timeout_s
        while True:
            low, stable = self._bounds(tp)
            high = self._end_of_log(tp)
            if stable >= high:
                return low, stable
            if time.monotonic() > deadline:
                # a commit left open by a writer that died inside it: its next start aborts it; until then
                # the reader reads what is committed, which is all it may read
                log.debug(
                    "a commit on %s did not complete in %.0f s (last stable offset %d, end %d); "
                    "reading up to the last stable offset",
                    tp,
                    self.settings.timeout_s,
                    stable,
                    high,
                )
                return low, stable
            time.sleep(0.01)

    def _end_of_log(self, tp: TopicPartition) -> int:
        """The end of ``tp`` counting records of transactions not committed (yet)."""
        if self._uncommitted is None:
            self._uncommitted = Consumer(
                {
                    **self._client,
                    "group.id": f"{self.settings.prefix}.log-reader",
                    "enable.auto.commit": False,
                    "isolation.level": "read_uncommitted",
                }
            )
        try:
            return int(
                self._uncommitted.get_watermark_offsets(
                    KafkaPartition(tp.topic, tp.partition), timeout=self.settings.timeout_s, cached=False
                )[1]
            )
        except KafkaException as exc:
            raise KafkaLogError(self.settings.bootstrap, f"reading the offsets of {tp}", exc.args[0]) from None

    def _read_latest_watermark(self) -> Watermark | None:
        """The last committed watermark record, read backwards from the topic's end in widening windows."""
        tp = TopicPartition(self.settings.watermark_topic, 0)
        if not self.writer and self.settings.watermark_topic not in self._metadata().topics:
            return None  # no writer opened this log yet
        low, high = self._settled_bounds(tp)
        window, end = 16, high
        while end > low:
            start = max(low, end - window)
            messages = self._fetch(tp, start, end, end - start)
            values = [value for m in messages if (value := m.value()) is not None]
            if values:
                return Watermark.decode(values[-1])
            end, window = start, window * 4
        return None

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


def _as_bytes(item: str | bytes | None) -> bytes | None:
    return item.encode() if isinstance(item, str) else item


__all__ = ["KafkaLog", "KafkaLogError", "KafkaSettings", "WATERMARK_KEY"]
