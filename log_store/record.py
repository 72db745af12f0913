"""The values the log stores and returns: topic-partitions, records to append, records read back.

All three are ``NamedTuple``s: cheap to build by the million, hashable (``TopicPartition`` is used as a
dict key and sorts by topic, then partition) and immutable. ``key`` and ``value`` are raw bytes; a
``None`` value is a tombstone (the key's deletion, which compaction keeps for the delete retention and
then drops). Headers are ``(name, value)`` pairs kept in order.
"""

from __future__ import annotations

from typing import NamedTuple

#: Record headers: ``(name, value)`` pairs, in order.
Headers = tuple[tuple[str, bytes], ...]

#: The header a record carries when its value omits columns that did not change (a JSON list of names).
UNCHANGED_HEADER = "unchanged"


class TopicPartition(NamedTuple):
    """One partition of one topic; ordered by topic, then partition."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}]"


class ProducerRecord(NamedTuple):
    """A record to append; its partition is chosen from its key (see :mod:`log_store.partitioner`)."""

    topic: str
    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    headers: Headers = ()


class Record(NamedTuple):
    """A record read back from the log, with the partition and offset it was stored at."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    headers: Headers

    @property
    def tp(self) -> TopicPartition:
        """The topic-partition this record belongs to."""
        return TopicPartition(self.topic, self.partition)

    def header(self, name: str) -> bytes | None:
        """The value of the first header called ``name``, or ``None``."""
        return first_header(self.headers, name)


def first_header(headers: Headers, name: str) -> bytes | None:
    """The value of the first of ``headers`` called ``name``, or ``None``."""
    for header_name, value in headers:
        if header_name == name:
            return value
    return None
