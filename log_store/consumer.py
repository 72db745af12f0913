"""A consumer of the embedded log with a consumer group, as a Kafka client offers one.

Example::

    from log_store import LogStore
    from log_store.consumer import Consumer

    with LogStore.open(Path("data/log")) as log:
        consumer = Consumer(log, "billing")
        consumer.subscribe(["cdc.outbox.orders"])
        while True:
            records = consumer.poll(timeout_s=1.0)
            for record in records:
                handle(record)           # a service's own work, idempotent by the record's id header
            consumer.commit()            # the group resumes after these records

Guarantees:

* **Only committed transactions.** A poll returns records up to the log's latest durable watermark and
  never past it (promise 2): a source transaction is seen whole or not at all.
* **Order per partition.** Each partition's records come in offset order, each offset once per
  consumer (a compacted topic may skip offsets compaction removed); partitions are served in turn, so
  one busy partition does not starve the others. There is no order across partitions: all records of
  one key are in one partition.
* **Groups and resumption.** A group's committed offset per partition is the *next* offset to read
  (Kafka's convention), stored by :mod:`log_store.consumer_offsets` (atomic, fsynced). A consumer starts
  at its group's committed offsets; a partition the group never committed starts at ``reset``
  (``"earliest"``: the first stored offset; ``"latest"``: the end at the latest watermark). After a crash
  a group reads again only what was polled and not yet committed (at least once); deduplicate by the
  record's ``id`` header (outbox events) or its ``(lsn, sequence)`` to make it exactly once.
* **Independent groups.** Groups share nothing but the log: each has its own offsets. There is no
  rebalancing: run one consumer per group, or give each of several its own partitions with
  :meth:`Consumer.assign`.
* A consumer is a reader (no writer lock): it runs beside capture. Not thread-safe; one per thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from typing import Literal

from log_store.consumer_offsets import validate_group
from log_store.record import Record, TopicPartition
from log_store.store import LogStore
from log_store.watermark import Watermark

#: Where a partition the group never committed starts.
Reset = Literal["earliest", "latest"]


class Consumer:
    """Reads topics of ``log`` for consumer group ``group`` (see the module docstring)."""

    def __init__(self, log: LogStore, group: str, *, reset: Reset = "earliest") -> None:
        self.log = log
        self.group = validate_group(group)
        self.reset = reset
        self._topics: list[str] = []
        self._assigned: list[TopicPartition] = []
        self._explicit = False
        self._positions: dict[TopicPartition, int] = {}
        self._committed: dict[TopicPartition, int] = {}
        self._turn = 0
        self._stop = threading.Event()

    def subscribe(self, topics: Sequence[str]) -> None:
        """Read every partition of ``topics``; a topic that does not exist yet is read once it does."""
        self._topics, self._explicit = list(topics), False
        self._assigned, self._positions = [], {}

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read only ``partitions`` (instead of :meth:`subscribe`)."""
        self._assigned, self._explicit, self._topics = [TopicPartition(*tp) for tp in partitions], True, []
        self._positions = {}

    def assignment(self) -> list[TopicPartition]:
        """The partitions read now (a subscribed topic's partitions once it exists)."""
        self._refresh()
        return list(self._assigned)

    def position(self, tp: TopicPartition) -> int:
        """The next offset this consumer reads from ``tp``."""
        self._refresh()
        return self._positions[TopicPartition(*tp)]

    def committed(self) -> dict[TopicPartition, int]:
        """The group's committed offsets (as stored now)."""
        return self.log.committed_offsets(self.group)

    def poll(self, max_records: int = 1000, timeout_s: float = 0.0) -> list[Record]:
        """The next records, at most ``max_records``, up to the latest watermark; waits up to ``timeout_s``
        (polling the watermark) when there is none yet. Moves this consumer's positions past them."""
        deadline = time.monotonic() + timeout_s
        while True:
            watermark = self.log.latest_watermark()
            records = self._read(watermark, max_records) if watermark is not None else []
            if records or time.monotonic() >= deadline or self._stop.is_set():
                return records
            self._stop.wait(min(0.05, max(0.0, deadline - time.monotonic())))

    def commit(self) -> dict[TopicPartition, int]:
        """Commit this consumer's positions for its group (durable when it returns); the offsets committed.

        Only positions that moved since the last commit are written; nothing is written when none did.
        """
        moved = {tp: offset for tp, offset in self._positions.items() if self._committed.get(tp) != offset}
        if moved:
            self.log.commit_offsets(self.group, moved)
            self._committed.update(moved)
        return moved

    @property
    def woken(self) -> bool:
        """Whether :meth:`wakeup` was called."""
        return self._stop.is_set()

    def close(self) -> None:
        """Nothing to release (the log is the caller's); here so that services close either consumer alike."""

    def wakeup(self) -> None:
        """Make a waiting :meth:`poll` return at once (from another thread or a signal handler)."""
        self._stop.set()

    # -- internals ----------------------------------------------------------------------------------

    def _refresh(self) -> None:
        """Take in the partitions of subscribed topics that exist now, each at its starting offset."""
        if not self._explicit:
            existing = set(self.log.topics())
            known = {tp.topic for tp in self._assigned}
            for topic in self._topics:
                if topic in existing and topic not in known:
                    self._assigned += [TopicPartition(topic, p) for p in range(self.log.partitions(topic))]
        missing = [tp for tp in self._assigned if tp not in self._positions]
        if missing:
            committed = self.log.committed_offsets(self.group)
            for tp in missing:
                if tp in committed:
                    self._positions[tp] = self._committed[tp] = committed[tp]
                else:
                    self._positions[tp] = self.log.start_offset(tp) if self.reset == "earliest" else self.log.end_offset(tp)

    def _read(self, watermark: Watermark, max_records: int) -> list[Record]:
        self._refresh()
        out: list[Record] = []
        count = len(self._assigned)
        for step in range(count):
            if len(out) >= max_records:
                break
            tp = self._assigned[(self._turn + step) % count]
            records = self.log.read(tp, self._positions[tp], max_records=max_records - len(out), until=watermark)
            if records:
                out += records
                self._positions[tp] = records[-1].offset + 1
        if count:
            self._turn = (self._turn + 1) % count
        return out
