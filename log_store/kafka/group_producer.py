"""A group produced to Kafka in one transaction: its records placed as the embedded log places them,
delivered a window at a time, then committed or aborted.

Every record names its partition explicitly, chosen by :class:`~log_store.partitioner.Partitioner` exactly
as the embedded log chooses it. The transaction itself (begin, records, watermark, commit, abort on any
failure) is :meth:`~log_store.kafka.log.KafkaLog.append_group`; the producer it uses is transactional
(``transactional.id`` ``<prefix>.capture``, ``acks=all``), and starting it fences any earlier writer of the
prefix and aborts the transaction that writer left open.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from log_store.errors import InvalidRecordError
from log_store.kafka.client import KafkaLogError, fenced
from log_store.kafka.topics import MAX_RECORD_BYTES, KafkaTopics
from log_store.partitioner import Partitioner
from log_store.producer_columns import ProducerColumns, split_runs
from log_store.record import UNCHANGED_HEADER, ProducerRecord, TopicPartition, first_header
from log_store.watermark import Watermark

log = logging.getLogger("log_store.kafka")

#: How many records a group produces before it waits for their deliveries (bounded memory).
PRODUCE_WINDOW = 50_000


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


class GroupProducer(KafkaTopics):
    """The producing side of :class:`~log_store.kafka.log.KafkaLog`, its base: the log's state used here is
    declared here and set by the log's constructor."""

    _client: dict[str, Any]
    _producer: Producer | None
    _partitioner: Partitioner
    _current: Watermark | None
    _partial_topics: set[str]

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


def _as_bytes(item: str | bytes | None) -> bytes | None:
    return item.encode() if isinstance(item, str) else item
