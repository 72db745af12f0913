"""Helpers of the capture integration tests: settings for a test database and reading the log back."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import orjson

from cdc.settings import Settings, load_settings
from log_store import LogStore, Record, TopicPartition


def settings_for(url: str, data_dir: Path, **extra: object) -> Settings:
    return load_settings(database_url=url, data_dir=str(data_dir), **extra)


def read_topic(data_dir: Path, topic: str) -> list[Record]:
    """Every committed record of ``topic``, partition by partition."""
    with LogStore.open(data_dir / "log") as log:
        if topic not in log.topics():
            return []
        out: list[Record] = []
        for partition in range(log.partitions(topic)):
            offset = 0
            while batch := log.read(TopicPartition(topic, partition), offset):
                out.extend(batch)
                offset = batch[-1].offset + 1
        return out


def events(data_dir: Path, topic: str) -> list[dict[str, object]]:
    """Decoded non-tombstone values of ``topic`` in (lsn, sequence) order."""
    values = [orjson.loads(r.value) for r in read_topic(data_dir, topic) if r.value is not None]
    return sorted(values, key=lambda v: (v["source"]["lsn"], v["source"]["sequence"]))


def wait_for(condition: Callable[[], bool], timeout: float = 60.0, what: str = "condition") -> None:
    """Poll ``condition`` until true (raises after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
