"""The Kafka log's topics: created with the log's settings, checked against them, counted.

**Topics.** :meth:`KafkaTopics.ensure_topic` creates a topic with ``cleanup.policy=compact`` (``delete``
for a keyless table), the replication factor the brokers default to, and ``delete.retention.ms``; an
existing topic with another partition count or policy is refused (:class:`TopicConfigMismatchError`).
Partition counts and policies are remembered once known: placement (:mod:`log_store.kafka.group_producer`)
and reads (:mod:`log_store.kafka.committed_reads`) ask for them per group and per read.
"""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from log_store.errors import ReadOnlyError, TopicConfigMismatchError, UnknownTopicError
from log_store.kafka.client import KafkaLogError, KafkaSettings
from log_store.topic import TopicConfig, validate_topic_name

#: The largest record a topic takes (Kafka's default is 1 MiB; a source row may be larger).
MAX_RECORD_BYTES = 64 << 20


class KafkaTopics:
    """The topics of :class:`~log_store.kafka.log.KafkaLog`, its base: the log's state used here is
    declared here and set by the log's constructor."""

    settings: KafkaSettings
    writer: bool
    root: str
    _admin: AdminClient | None
    _client_error: KafkaError | None
    _partition_counts: dict[str, int]
    _compacted: dict[str, bool]
    _closed: bool

    def _require_writer(self, operation: str) -> None:
        if not self.writer:
            raise ReadOnlyError(self.root, operation)  # type: ignore[arg-type]
        if self._closed:
            raise ReadOnlyError(self.root, f"{operation} after close()")  # type: ignore[arg-type]

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
