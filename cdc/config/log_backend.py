"""Which log the pipeline uses: the embedded one under ``CDC_DATA_DIR`` or the one in Kafka (``CDC_LOG``).

Both offer the interface capture and the log's readers use (:class:`~log_store.log.Log`: topics,
``append_group``, ``read``, offsets, watermarks), with the same records, placement and watermark rules,
so the capture loop's exactly-once restart (:mod:`cdc.run.coordinator`) is one piece of code for both.
"""

from __future__ import annotations

from cdc.config.settings import Settings
from log_store import LogStore
from log_store.log import Log


def open_log(settings: Settings, *, writer: bool = False) -> Log:
    """The log ``settings`` name, opened for reading or (one process at a time) for writing.

    A Kafka writer fences any earlier writer of the same topic prefix (its next commit fails) and aborts
    the group that writer left open; an embedded writer takes the log's writer lock.
    """
    if settings.uses_kafka:
        from log_store.kafka.log import KafkaLog

        return KafkaLog.open(settings.kafka_settings(), writer=writer)
    if writer:
        return LogStore.open(settings.log_dir, settings.log_config(), writer=True)
    return LogStore.open(settings.log_dir, settings.log_config())  # `cdc log compact` folds partial rows
