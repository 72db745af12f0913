"""Read-committed reads of the Kafka log that stop at a watermark, and the latest watermark read back.

A broker answers a commit before it writes the commit markers: :meth:`CommittedReads._fetch` reads on until
the end a committed watermark names, and the watermark topic is read once no commit is under way on it
(:meth:`CommittedReads._settled_bounds`), so a reader that starts after a commit returned sees that commit.
"""

from __future__ import annotations

import logging
import time
from typing import Any, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, Message
from confluent_kafka import TopicPartition as KafkaPartition

from log_store.kafka.client import KafkaLogError
from log_store.kafka.topics import KafkaTopics
from log_store.record import TopicPartition
from log_store.watermark import Watermark

log = logging.getLogger("log_store.kafka")


class CommittedReads(KafkaTopics):
    """The reading side of :class:`~log_store.kafka.log.KafkaLog`, its base: the log's state used here is
    declared here and set by the log's constructor."""

    _client: dict[str, Any]
    _consumer: Consumer | None
    _uncommitted: Consumer | None

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
