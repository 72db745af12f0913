"""The topics capture writes into: each made on first use, the partition count each keeps, and what the
schema topic already holds when a run starts."""

from __future__ import annotations

import logging

import orjson

from cdc.capture.change_replayer import EmittedSchema
from cdc.capture.outbox import DEAD_LETTERS
from cdc.capture.tables import TableShape, fingerprint_of
from log_store import TopicPartition
from log_store.log import Log
from log_store.topic_names import log_name

log = logging.getLogger("cdc.capture")


class CaptureTopics:
    """The log's topics as capture sees them; ``partitions`` (``CDC_PARTITIONS``) is for new ones only."""

    def __init__(self, store: Log, partitions: int) -> None:
        self.log = store
        self.partitions = partitions
        self._made: set[str] = set()

    def ensure(self, shape: TableShape) -> None:
        """Make the table's topic unless it exists (compacted when the table has a key)."""
        if shape.topic in self._made:
            return
        if shape.topic not in self.log.topics():
            self.log.ensure_topic(shape.topic, self.partitions, compacted=bool(shape.key_indexes))
        self._made.add(shape.topic)

    def ensure_events(self, topic: str) -> None:
        """Make an event topic unless it exists: an outbox topic (``CDC_PARTITIONS`` partitions) or the
        dead-letter topic (one), neither compacted, since every event counts, not only a key's last."""
        if topic in self._made:
            return
        if topic not in self.log.topics():
            self.log.ensure_topic(topic, 1 if topic.endswith(DEAD_LETTERS) else self.partitions, compacted=False)
        self._made.add(topic)

    def partitions_of(self, topic: str) -> int:
        """The partition count of ``topic``: its own once it exists, ``CDC_PARTITIONS`` for a new one."""
        return self.log.partitions(topic) if topic in self.log.topics() else self.partitions

    def warn_of_kept_partition_counts(self, prefix: str, internal: set[str]) -> None:
        """Say which existing topics of ``prefix`` keep a partition count other than ``CDC_PARTITIONS``.

        A key's partition is its hash modulo the topic's count, so a topic keeps the count it was created
        with (changing it would move keys, and the per-key order with them); the setting applies to new
        topics only.
        """
        wanted = self.partitions
        counts = [(topic, self.log.partitions(topic)) for topic in self.log.topics() if topic.startswith(f"{prefix}.")]
        kept = [(topic, count) for topic, count in counts if topic not in internal and count != wanted]
        if not kept:
            return
        log.warning(
            "topics %s keep the partition count they were created with, not CDC_PARTITIONS=%d (a key's partition is "
            "its hash modulo the topic's count; changing the count would move keys): only new topics get %d "
            "partitions; set CDC_PARTITIONS back to %s, or capture into a new CDC_DATA_DIR (a new snapshot) and "
            "rebuild the views from it",
            ", ".join(f"{topic} ({count} partitions)" for topic, count in kept),
            wanted,
            wanted,
            " or ".join(str(count) for count in sorted({count for _, count in kept})),
        )

    def emitted_schemas(self, schema_topic: str) -> tuple[dict[str, EmittedSchema], dict[str, tuple[str, str]]]:
        """The last schema record of each table in ``schema_topic`` (made when missing), by log name, and
        the ``(schema, table)`` of each topic those records name."""
        emitted: dict[str, EmittedSchema] = {}
        table_of_topic: dict[str, tuple[str, str]] = {}
        if schema_topic not in self.log.topics():
            self.log.ensure_topic(schema_topic, 1, compacted=True)
            return emitted, table_of_topic
        partition = TopicPartition(schema_topic, 0)
        offset = self.log.start_offset(partition)
        while batch := self.log.read(partition, offset):
            for record in batch:
                if record.key is not None and record.value is not None:
                    value = orjson.loads(record.value)
                    # by the names the record holds: a key written before names were escaped (a name with a
                    # dot) then meets the table's log name, and its next record follows this one
                    emitted[log_name(value["schema"], value["table"])] = (fingerprint_of(value), record.value)
                    table_of_topic[value["topic"]] = (value["schema"], value["table"])
            offset = batch[-1].offset + 1
        return emitted, table_of_topic
