"""The source tables' schemas as the log's schema topic holds them, read without Spark.

The schema topic (``<prefix>.__schemas``) is small: one record per table and schema change, keyed by the
table's log name. It is read here, in the calling process, through the log's reader interface
(:class:`log_store.log.LogReader`, either backend), so listing the views (``cdc views``, ``cdc lag`` and
its exporter) never loads Spark.
"""

from __future__ import annotations

import json

from derived_views.events.schema import TableSchema
from derived_views.source.log_location import LogLocation
from log_store import TopicPartition

_CHUNK = 10_000


def read_schemas(location: LogLocation | str, topic: str, ends: dict[str, int]) -> dict[str, TableSchema]:
    """Every source table's latest schema record in ``topic`` up to ``ends`` (partition -> end offset),
    by log name."""
    latest: dict[str, tuple[int, bytes | None]] = {}
    with LogLocation.of(location).open() as log:  # one connection for every partition
        for partition, end in sorted(ends.items(), key=lambda item: int(item[0])):
            tp = TopicPartition(topic, int(partition))
            offset = 0
            while offset < end:
                records = log.read(tp, offset, max_records=_CHUNK, end=end)
                if not records:
                    break
                offset = records[-1].offset + 1
                for record in records:
                    key = json.loads(record.key) if record.key else None
                    if isinstance(key, str) and (key not in latest or record.offset >= latest[key][0]):
                        latest[key] = (record.offset, record.value)
    found: dict[str, tuple[int, TableSchema]] = {}
    for offset, value in latest.values():
        if value is not None:
            schema = TableSchema.from_record(json.loads(value))
            # a table whose key changed (written before names were escaped) has two records: the later one holds
            if schema.log_name not in found or offset > found[schema.log_name][0]:
                found[schema.log_name] = (offset, schema)
    return {name: schema for name, (_, schema) in found.items()}
