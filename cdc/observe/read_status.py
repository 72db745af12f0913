"""The reads beside the stream under way, as the log's progress records show them (``cdc snapshot --status``, ``cdc lag``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import orjson

from cdc.config.settings import Settings


def _progress_records(settings: Settings) -> Iterator[tuple[str, dict[str, Any] | None, int]]:
    """The ledger's progress records in log order, as (table, value or ``None`` for the tombstone that ends
    its read, timestamp ms); none when the log has no ledger yet."""
    from cdc.config.log_backend import open_log
    from log_store import TopicPartition

    topic = f"{settings.topic_prefix}.__snapshots"
    with open_log(settings) as log:
        if topic not in log.topics():
            return
        partition = TopicPartition(topic, 0)
        offset = log.start_offset(partition)
        while batch := log.read(partition, offset):
            for record in batch:
                name = orjson.loads(record.key) if record.key else None
                if isinstance(name, list) and name[0] == "read":
                    yield str(name[1]), orjson.loads(record.value) if record.value is not None else None, record.timestamp_ms
            offset = batch[-1].offset + 1


def topics_being_read(settings: Settings) -> set[str]:
    """The topics of the tables whose read beside the stream is under way (a progress record without its
    tombstone): their rows are in the log only in part, so no view of them is exact yet (``cdc wait``)."""
    reading: dict[str, str] = {}  # table -> topic
    for name, value, _ in _progress_records(settings):
        if value is None:
            reading.pop(name, None)
        else:
            reading[name] = str(value["topic"])
    return set(reading.values())


def read_status(settings: Settings) -> list[dict[str, object]]:
    """The reads under way as the log's progress records hold them (their layout: the ledger's,
    :class:`~cdc.capture.table_snapshots.ReadProgress`): table, rows done, rows estimated (the
    source's statistics), rows per second and seconds left (over the current run of the read)."""
    runs: dict[str, list[tuple[int, int, int]]] = {}  # name -> (boundary, rows, ts) of its progress records
    for name, value, ts in _progress_records(settings):
        if value is None:
            runs.pop(name, None)
        else:
            runs.setdefault(name, []).append((value["boundary"], value["rows"], ts))
    out = []
    for name, records in sorted(runs.items()):
        boundary, rows, last_ts = records[-1]
        current = [r for r in records if r[0] == boundary]
        first_rows, first_ts = current[0][1], current[0][2]
        rate = (rows - first_rows) * 1000 / (last_ts - first_ts) if last_ts > first_ts else None
        estimate = _estimate(settings, name)
        left = (max(estimate - rows, 0) / rate) if rate and estimate else None
        out.append(
            {"table": name, "rows": rows, "estimated_rows": estimate, "rows_per_second": rate, "eta_seconds": left,
             "last_chunk_age_seconds": max(0.0, time.time() - last_ts / 1000)}
        )  # fmt: skip
    return out


def _estimate(settings: Settings, name: str) -> int | None:
    import psycopg

    try:
        with psycopg.connect(settings.database_url) as conn:
            row = conn.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(%s)", (name,)).fetchone()
    except psycopg.Error:
        return None
    return int(row[0]) if row and row[0] is not None and row[0] >= 0 else None
