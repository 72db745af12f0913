"""Committed consumer offsets: ``consumer_offsets/<group>.json``, one file per consumer group.

File content (UTF-8 JSON)::

    {"group": str, "offsets": {topic: {"<partition>": next offset to read, ...}, ...},
     "metadata": str, "updated_ms": int}

A committed offset is the *next* offset the group will read (Kafka's convention). Every commit rewrites
the group's file atomically (``<group>.json.tmp``, fsync, rename, directory fsync), so a crash leaves
the previous or the new commit, never a mix. A commit merges into the partitions already stored; commits
of one group from several processes are serialised by an ``flock`` on ``<group>.lock``. Consumers are
readers of the log: committing offsets never needs the writer lock. Group names are 1-200 characters of
``[A-Za-z0-9._-]``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import orjson

from log_store.atomic_file import make_dirs, write_atomic
from log_store.errors import CorruptOffsetsError, InvalidGroupError
from log_store.lock import FileLock
from log_store.record import TopicPartition

DIR_NAME = "consumer_offsets"
_GROUP = re.compile(r"^[A-Za-z0-9._-]{1,200}$")


@dataclass(frozen=True)
class GroupOffsets:
    """What a group has committed."""

    group: str
    offsets: dict[TopicPartition, int]
    metadata: str
    updated_ms: int


def validate_group(group: str) -> str:
    """Return ``group`` when it can name a file, else raise :class:`InvalidGroupError`."""
    if not isinstance(group, str) or not _GROUP.match(group) or group in (".", ".."):
        raise InvalidGroupError(str(group))
    return group


class ConsumerOffsets:
    """The committed offsets of every consumer group of one log."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, group: str) -> Path:
        return self.directory / f"{validate_group(group)}.json"

    def groups(self) -> list[str]:
        """Names of the groups that committed offsets."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        return sorted(name[:-5] for name in names if name.endswith(".json"))

    def fetch(self, group: str) -> GroupOffsets:
        """The group's committed offsets (empty when it never committed)."""
        path = self._path(group)
        try:
            data = orjson.loads(path.read_bytes())
        except FileNotFoundError:
            return GroupOffsets(group, {}, "", 0)
        except orjson.JSONDecodeError as exc:
            raise CorruptOffsetsError(path, f"not JSON ({exc})") from None
        try:
            offsets = {
                TopicPartition(topic, int(partition)): int(offset)
                for topic, partitions in data["offsets"].items()
                for partition, offset in partitions.items()
            }
            return GroupOffsets(group, offsets, str(data.get("metadata", "")), int(data.get("updated_ms", 0)))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CorruptOffsetsError(path, f"missing or bad field ({exc})") from None

    def commit(self, group: str, offsets: Mapping[TopicPartition, int], now_ms: int, metadata: str = "") -> GroupOffsets:
        """Merge ``offsets`` into the group's commit, atomically and durably."""
        for tp, offset in offsets.items():
            if not isinstance(offset, int) or offset < 0:
                raise ValueError(f"offset {offset!r} for {tp} is not a non-negative integer")
        path = self._path(group)
        make_dirs(self.directory)
        lock = FileLock(self.directory / f"{group}.lock")
        lock.acquire(blocking=True)
        try:
            current = self.fetch(group)
            merged = {**current.offsets, **{TopicPartition(*tp): o for tp, o in offsets.items()}}
            nested: dict[str, dict[str, int]] = {}
            for tp in sorted(merged):
                nested.setdefault(tp.topic, {})[str(tp.partition)] = merged[tp]
            body = {"group": group, "offsets": nested, "metadata": metadata, "updated_ms": now_ms}
            write_atomic(path, orjson.dumps(body, option=orjson.OPT_INDENT_2) + b"\n")
        finally:
            lock.release()
        return GroupOffsets(group, merged, metadata, now_ms)
