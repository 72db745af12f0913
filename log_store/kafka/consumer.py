"""The group consumer of :mod:`log_store.consumer` over the log kept in Kafka: the same calls, Kafka's groups.

A service written against :class:`log_store.consumer.Consumer` moves with its log: :func:`open_consumer`
gives the embedded consumer for a :class:`~log_store.LogStore` and a :class:`KafkaConsumer` for a
:class:`~log_store.kafka.log.KafkaLog`. The Kafka one is a thin wrapper of librdkafka's consumer with
``isolation.level=read_committed`` (capture writes each group of source transactions as one Kafka
transaction, so a source transaction is seen whole, once it is committed), offsets committed only when
asked (``enable.auto.commit=false``) and Kafka's own group protocol (several members of a group share
the partitions, unlike the embedded consumer). Records come back as :class:`~log_store.Record` values.
Offsets are Kafka's: a transaction's commit marker takes one, so they are not contiguous.

:func:`committed_groups` lists what ``cdc log groups`` shows of the log in Kafka: every consumer group of
the cluster with the offsets it committed of the log's topics (``<prefix>.``), through Kafka's admin API.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer as _KafkaClient
from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaPartition
from confluent_kafka.admin import AdminClient

from log_store.consumer import Consumer, Reset
from log_store.consumer_offsets import validate_group
from log_store.kafka.client import KafkaLogError, KafkaSettings, client_log
from log_store.record import Record, TopicPartition

if TYPE_CHECKING:
    from log_store.log import LogReader


class KafkaConsumer:
    """Reads topics of the log in Kafka for consumer group ``group`` (see the module docstring)."""

    def __init__(self, settings: KafkaSettings, group: str, *, reset: Reset = "earliest") -> None:
        self.group = validate_group(group)
        self._client = _KafkaClient(
            {
                "bootstrap.servers": settings.bootstrap,
                **settings.client,
                "logger": client_log,
                "group.id": group,
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "auto.offset.reset": reset,
                "enable.partition.eof": True,
            }
        )
        self._positions: dict[TopicPartition, int] = {}
        self._at_end: set[TopicPartition] = set()  # partitions read to their end since their last record
        self._stop = threading.Event()

    def subscribe(self, topics: Sequence[str]) -> None:
        """Read every partition of ``topics`` that the group gives this member."""
        self._client.subscribe(list(topics))

    def poll(self, max_records: int = 1000, timeout_s: float = 0.0) -> list[Record]:
        """The next committed records, at most ``max_records``, waiting up to ``timeout_s`` for the first;
        empty at once when every partition the group gave this member has been read to its end."""
        deadline = time.monotonic() + timeout_s
        while True:
            wait = max(0.0, min(0.1, deadline - time.monotonic()))
            messages = self._client.consume(num_messages=max_records, timeout=wait)
            records: list[Record] = []
            for message in messages:
                error = message.error()
                tp = TopicPartition(str(message.topic()), int(message.partition() or 0))
                if error is None:
                    record = _record(message)
                    records.append(record)
                    self._positions[tp] = record.offset + 1
                    self._at_end.discard(tp)
                elif error.code() == KafkaError._PARTITION_EOF:
                    self._at_end.add(tp)
                else:
                    raise RuntimeError(f"reading Kafka for consumer group {self.group}: {error}")
            if records or time.monotonic() >= deadline or self._stop.is_set() or self.caught_up():
                return records

    def caught_up(self) -> bool:
        """Whether this member has partitions and has read each to its end."""
        assigned = {TopicPartition(p.topic, p.partition) for p in self._client.assignment()}
        return bool(assigned) and assigned <= self._at_end

    def commit(self) -> dict[TopicPartition, int]:
        """Commit the positions past the records polled (synchronously); the offsets committed."""
        if not self._positions:
            return {}
        moved = dict(self._positions)
        offsets = [KafkaPartition(tp.topic, tp.partition, offset) for tp, offset in moved.items()]
        self._client.commit(offsets=offsets, asynchronous=False)
        self._positions.clear()
        return moved

    def committed(self) -> dict[TopicPartition, int]:
        """The group's committed offsets of the partitions this member reads."""
        assigned = self._client.assignment()
        found = self._client.committed(assigned, timeout=10.0) if assigned else []
        return {TopicPartition(p.topic, p.partition): p.offset for p in found if p.offset >= 0}

    @property
    def woken(self) -> bool:
        """Whether :meth:`wakeup` was called."""
        return self._stop.is_set()

    def wakeup(self) -> None:
        """Make a waiting :meth:`poll` return soon."""
        self._stop.set()

    def close(self) -> None:
        """Leave the group (its partitions go to the other members)."""
        self._client.close()


def _record(message: Any) -> Record:
    timestamp = message.timestamp()[1]
    headers = tuple((name, value or b"") for name, value in (message.headers() or ()))
    return Record(message.topic(), message.partition(), message.offset(), message.key(), message.value(), timestamp, headers)


def committed_groups(settings: KafkaSettings) -> dict[str, dict[TopicPartition, int]]:
    """Every consumer group of the cluster that committed offsets of the log's topics (``<prefix>.``), with
    those offsets (the next offset each reads), by group name; the log's own reader group left out."""
    config: dict[str, Any] = {"bootstrap.servers": settings.bootstrap, **settings.client, "logger": client_log}
    try:
        admin = AdminClient(config)
        listed = admin.list_consumer_groups(request_timeout=settings.timeout_s).result()
        names = sorted(g.group_id for g in listed.valid if g.group_id != f"{settings.prefix}.log-reader")
        offsets: dict[str, dict[TopicPartition, int]] = {}
        for name in names:  # Kafka answers one group's offsets per request
            request = [ConsumerGroupTopicPartitions(name)]
            found = admin.list_consumer_group_offsets(request, request_timeout=settings.timeout_s)[name].result()
            mine = {
                TopicPartition(p.topic, p.partition): p.offset
                for p in found.topic_partitions or ()
                if p.offset >= 0 and p.topic.startswith(f"{settings.prefix}.")
            }
            if mine:
                offsets[name] = mine
    except KafkaException as exc:
        raise KafkaLogError(settings.bootstrap, "listing the consumer groups and their offsets", exc.args[0]) from None
    return offsets


def open_consumer(log: LogReader, group: str, *, reset: Reset = "earliest") -> Consumer | KafkaConsumer:
    """The group consumer for ``log``: the embedded one, or Kafka's for a log kept in Kafka."""
    from log_store.kafka.log import KafkaLog
    from log_store.store import LogStore

    if isinstance(log, KafkaLog):
        return KafkaConsumer(log.settings, group, reset=reset)
    assert isinstance(log, LogStore)
    return Consumer(log, group, reset=reset)
