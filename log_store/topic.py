"""Topic metadata: ``topics/<name>/topic.json`` and the partition directories beside it.

Layout under the log root::

    topics/<name>/topic.json     {"name": str, "partitions": int, "compacted": bool, "created_ms": int}
    topics/<name>/<n>/           one directory per partition n = 0 .. partitions-1 (segments inside)

The writer creates the partition directories first and ``topic.json`` last (written atomically, the
directory fsynced), so a topic exists exactly when its ``topic.json`` does; a directory without one is
a creation the writer did not finish, ignored by readers and removed by the writer's recovery. Topic
names follow Kafka's rule (1-249 characters of ``[A-Za-z0-9._-]``, not ``.`` or ``..``), which also makes
them safe file names. The partition count and cleanup policy never change after creation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import orjson

from log_store.atomic_file import write_atomic
from log_store.errors import CorruptTopicError, InvalidTopicNameError

TOPICS_DIR = "topics"
META_NAME = "topic.json"
_VALID = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


def validate_topic_name(name: str) -> str:
    """Return ``name`` when Kafka would accept it as a topic name, else raise."""
    if not isinstance(name, str) or not _VALID.match(name) or name in (".", ".."):
        raise InvalidTopicNameError(str(name))
    return name


@dataclass(frozen=True)
class TopicConfig:
    """The fixed settings of one topic."""

    name: str
    partitions: int
    compacted: bool
    created_ms: int = 0

    def encode(self) -> bytes:
        """The content of ``topic.json``."""
        return (
            orjson.dumps(
                {"name": self.name, "partitions": self.partitions, "compacted": self.compacted, "created_ms": self.created_ms},
                option=orjson.OPT_INDENT_2,
            )
            + b"\n"
        )


def topic_dir(root: Path, name: str) -> Path:
    """Directory of a topic."""
    return root / TOPICS_DIR / name


def partition_dir(root: Path, name: str, partition: int) -> Path:
    """Directory of one partition of a topic."""
    return root / TOPICS_DIR / name / str(partition)


def read_topic(root: Path, name: str) -> TopicConfig | None:
    """The topic's config, or ``None`` when the topic does not (completely) exist."""
    path = topic_dir(root, name) / META_NAME
    try:
        data = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except orjson.JSONDecodeError as exc:
        raise CorruptTopicError(path, f"not JSON ({exc})") from None
    try:
        config = TopicConfig(str(data["name"]), int(data["partitions"]), bool(data["compacted"]), int(data.get("created_ms", 0)))
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptTopicError(path, f"missing or bad field {exc}") from None
    if config.name != name or config.partitions < 1:
        raise CorruptTopicError(path, f"describes {config.name!r} with {config.partitions} partitions")
    return config


def write_topic(root: Path, config: TopicConfig) -> None:
    """Write ``topic.json`` atomically (the partition directories must exist already)."""
    write_atomic(topic_dir(root, config.name) / META_NAME, config.encode())


def list_topics(root: Path) -> list[str]:
    """Names of the complete topics, sorted."""
    base = root / TOPICS_DIR
    try:
        names = sorted(p.name for p in base.iterdir() if (p / META_NAME).is_file())
    except FileNotFoundError:
        return []
    return names
