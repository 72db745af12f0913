"""Errors of the log store: one documented hierarchy under :class:`LogStoreError`.

Every error carries the thing that went wrong (path, topic-partition, byte position, offset, the values
involved) as attributes, and its ``str()`` is one line saying what is wrong and how to fix it: the CLI
prints exactly ``str(error)``.

Hierarchy::

    LogStoreError                    base; ``exit_code`` is what the CLI exits with
    ├── LogNotFoundError             no log at the given directory
    ├── LogFormatError               the directory holds a log of an unknown format version
    ├── LogLockedError               another process holds the writer lock
    │   └── CleanerLockedError       another process is compacting / applying retention
    ├── ReadOnlyError                a write was attempted on a store opened for reading
    ├── TopicError
    │   ├── InvalidTopicNameError    a topic name Kafka would refuse
    │   ├── UnknownTopicError        the topic does not exist (or the partition is out of range)
    │   └── TopicConfigMismatchError ensure_topic() with a partition count / policy that differs
    ├── InvalidRecordError           a record the topic cannot hold (keyless record in a compacted topic)
    ├── InvalidGroupError            a consumer group name that cannot be a file name
    ├── CorruptionError              bytes on disk fail their checks; nothing was returned from them
    │   ├── CorruptSegmentError      a segment batch fails its CRC32C or framing (file, position, offset)
    │   │   └── IncompleteTailError  a partition's valid data ends before the watermark's end offset
    │   ├── CorruptWatermarkError    a watermark record fails its CRC32C with valid records after it
    │   ├── MissingWatermarkError    a watermark file of an existing log is gone
    │   ├── CorruptOffsetsError      a consumer-offsets file cannot be parsed
    │   └── CorruptTopicError        a topic.json cannot be parsed
    ├── RecoveryError                recovery found a state it must not repair silently
    ├── WriterFailedError            an append failed half-way; reopen so recovery cleans up
    ├── StorageIOError               the disk refused: full, permission bits, read-only, a file for a directory
    └── FoldError                    an ``unchanged`` record cannot be folded onto its predecessor
"""

from __future__ import annotations

import errno
import os
from pathlib import Path


class LogStoreError(Exception):
    """Base of every error the log store raises on purpose."""

    exit_code: int = 1


class LogNotFoundError(LogStoreError):
    """The directory holds no log (no ``store.json``)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        super().__init__(
            f"no log at {root}: check CDC_DATA_DIR (the log lives in <data_dir>/log), or start capture once to create it"
        )


class LogFormatError(LogStoreError):
    """The log was written by an incompatible version of this store."""

    def __init__(self, path: Path, found: object, supported: int) -> None:
        self.path, self.found, self.supported = path, found, supported
        super().__init__(
            f"{path} declares log format {found!r} but this version reads format {supported}: "
            "use the matching version of the tool, or point CDC_DATA_DIR elsewhere"
        )


class LogLockedError(LogStoreError):
    """Another process holds the lock; ``pid`` is the holder as written in the lock file."""

    role = "writer"

    def __init__(self, lock_path: Path, pid: int | None) -> None:
        self.lock_path, self.pid = lock_path, pid
        holder = f"process {pid}" if pid is not None else "another process"
        super().__init__(
            f"the log {self.role} lock {lock_path} is held by {holder}: "
            f"only one {self.role} may run at a time; stop that process (or wait for it) and retry"
        )


class CleanerLockedError(LogLockedError):
    """Another process is running compaction or retention on the same log."""

    role = "cleaner"


class ReadOnlyError(LogStoreError):
    """A writing operation was called on a store opened with ``writer=False``."""

    def __init__(self, root: Path, operation: str) -> None:
        self.root, self.operation = root, operation
        super().__init__(
            f"{operation} needs the writer: the log at {root} was opened read-only; "
            "open it with writer=True (one writer process at a time)"
        )


class TopicError(LogStoreError):
    """Base of topic-level errors."""


class InvalidTopicNameError(TopicError):
    """The name is empty, too long, '.'/'..', or has characters outside ``[A-Za-z0-9._-]``."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"topic name {name!r} is invalid: use 1-249 characters from letters, digits, '.', '_' and '-' (not '.' or '..')"
        )


class UnknownTopicError(TopicError):
    """The topic, or the partition of an existing topic, does not exist."""

    def __init__(self, root: Path | str, topic: str, partition: int | None = None, partitions: int = 0) -> None:
        self.root, self.topic, self.partition = root, topic, partition
        if partition is None:
            msg = f"topic {topic!r} does not exist in the log at {root}: run `cdc log topics` to list them"
        else:
            msg = (
                f"partition {partition} of topic {topic!r} does not exist (it has {partitions}): "
                f"use a partition from 0 to {partitions - 1}"
            )
        super().__init__(msg)


class TopicConfigMismatchError(TopicError):
    """``ensure_topic`` was called with settings that differ from the existing topic's."""

    def __init__(self, topic: str, setting: str, existing: object, requested: object) -> None:
        self.topic, self.setting, self.existing, self.requested = topic, setting, existing, requested
        super().__init__(
            f"topic {topic!r} already exists with {setting}={existing!r}, not {requested!r}: "
            f"a topic's {setting} cannot change (keys would move); use {setting}={existing!r} "
            "or a new topic"
        )


class InvalidRecordError(LogStoreError):
    """The record cannot be stored in its topic."""

    def __init__(self, topic: str, reason: str, fix: str) -> None:
        self.topic, self.reason = topic, reason
        super().__init__(f"record for topic {topic!r} rejected: {reason}; {fix}")


class InvalidGroupError(LogStoreError):
    """A consumer group name that cannot be stored."""

    def __init__(self, group: str) -> None:
        self.group = group
        super().__init__(f"consumer group name {group!r} is invalid: use 1-200 characters from letters, digits, '.', '_' and '-'")


class CorruptionError(LogStoreError):
    """Bytes on disk fail their checks. Nothing derived from them was returned.

    ``needs_rebuild``: the message ends by offering to rebuild the log from its source, which a caller
    that knows the source (the ``cdc`` CLI) spells out step by step.
    """

    exit_code = 4
    needs_rebuild = False


class CorruptSegmentError(CorruptionError):
    """A batch in a segment fails its CRC32C or framing check.

    ``path`` is the segment file, ``position`` the byte position of the damaged batch, ``offset`` the
    first log offset that cannot be read (the batch's base offset when it could be read).
    """

    needs_rebuild = True

    def __init__(self, path: Path, position: int, offset: int, detail: str) -> None:
        self.path, self.position, self.offset, self.detail = path, position, offset, detail
        super().__init__(
            f"corrupt segment {path} at byte {position} (log offset {offset}): {detail}; "
            "reads stop here: restore this file from a backup or replica, or rebuild the log "
            "from its source"
        )


class IncompleteTailError(CorruptSegmentError):
    """Recovery: the valid batches of a partition end before the watermark's end offset.

    For the latest watermark this is a group whose fsyncs a crash interrupted (recovery then falls back
    to the previous watermark); for any earlier watermark it is lost data.
    """

    def __init__(self, path: Path, position: int, reached: int, end: int, detail: str) -> None:
        self.reached, self.end = reached, end
        super().__init__(path, position, reached, detail)


class CorruptWatermarkError(CorruptionError):
    """A watermark record in the middle of the watermark file fails its checksum."""

    def __init__(self, path: Path, position: int, detail: str) -> None:
        self.path, self.position, self.detail = path, position, detail
        super().__init__(
            f"corrupt watermark file {path} at byte {position}: {detail}; "
            "restore the file from a backup; do not delete it (recovery would truncate the log)"
        )


class MissingWatermarkError(CorruptionError):
    """A watermark file of an existing log is gone: ``watermarks.log`` (the durable record of every
    commit: without it no record counts as committed) or ``watermark.pub`` (what readers read; the
    writer rewrites it from ``watermarks.log`` whenever it opens the log)."""

    def __init__(self, path: Path, *, published: bool) -> None:
        self.path, self.published = path, published
        self.needs_rebuild = not published
        if published:
            fix = (
                "readers see nothing committed until the writer publishes again: open the log as its "
                "writer (start capture), whose recovery rewrites it from watermarks.log"
            )
        else:
            fix = (
                "without it no record of the log counts as committed: restore it from a backup, or "
                "rebuild the log from its source"
            )
        super().__init__(f"the log's watermark file {path} is missing; {fix}")


class CorruptOffsetsError(CorruptionError):
    """A consumer-offsets file cannot be parsed."""

    def __init__(self, path: Path, detail: str) -> None:
        self.path, self.detail = path, detail
        super().__init__(
            f"corrupt consumer offsets file {path}: {detail}; delete it and reset the group's "
            "offsets (earliest, latest, a watermark or a time)"
        )


class CorruptTopicError(CorruptionError):
    """A topic's metadata file cannot be parsed."""

    def __init__(self, path: Path, detail: str) -> None:
        self.path, self.detail = path, detail
        super().__init__(
            f'corrupt topic metadata {path}: {detail}; restore it from a backup (it holds {{"name", "partitions", "compacted"}})'
        )


class RecoveryError(LogStoreError):
    """Recovery found a state it must not repair on its own."""

    def __init__(self, path: Path, detail: str, fix: str) -> None:
        self.path, self.detail = path, detail
        super().__init__(f"cannot recover the log at {path}: {detail}; {fix}")


class WriterFailedError(LogStoreError):
    """An append failed half-way; the store must be reopened so recovery removes the partial group."""

    def __init__(self, root: Path, cause: BaseException) -> None:
        self.root, self.cause = root, cause
        super().__init__(
            f"an earlier append to the log at {root} failed half-way ({cause!r}): close and reopen "
            "the log as writer; recovery will remove the partial group"
        )


class StorageIOError(LogStoreError):
    """The operating system refused a file operation of the log (``error``, an :class:`OSError`).

    Not damage and not a bug: a full disk, permission bits the process's user does not pass, a read-only
    filesystem, a file where a directory belongs. ``path`` is what failed (the file written, or the log
    directory when the system call named none); ``cause`` and ``fix`` say what is wrong and what to do,
    and the message is :attr:`what` followed by the fix. An append that fails this way leaves nothing visible:
    the group's watermark was not published, and recovery cuts its bytes when the log is next opened.
    """

    exit_code = 5

    def __init__(self, path: Path, error: OSError) -> None:
        self.error = error
        self.path, self.cause, self.fix = explain_os_error(Path(error.filename) if error.filename else path, error)
        super().__init__(f"{self.what}; {self.fix}")

    @property
    def what(self) -> str:
        """The path and the cause as one phrase (``/d/log: no space left on device``)."""
        return f"{self.path} {self.cause}" if self.cause.startswith("is ") else f"{self.path}: {self.cause}"


def explain_os_error(path: Path, error: OSError) -> tuple[Path, str, str]:
    """``(path, cause, fix)`` for an :class:`OSError` at ``path``: the path named is the one to act on
    (for a file where a directory belongs, that file)."""
    code = error.errno
    if code in (errno.ENOSPC, errno.EDQUOT):
        cause = "no space left on device" if code == errno.ENOSPC else "the user's disk quota is used up"
        return (
            path,
            cause,
            (f"free space on the filesystem holding {path.parent} (see `df {path.parent}`) or move the data to a larger one"),
        )
    if code in (errno.EACCES, errno.EPERM):
        user = process_user()
        return (
            path,
            f"permission denied for user {user}",
            (
                f"make {path.parent} and everything below it writable by {user} "
                f"(`chown -R {user} {path.parent}`), or run as the user that owns it"
            ),
        )
    if code == errno.EROFS:
        return path, "the filesystem is mounted read-only", "remount it read-write or move the data to a writable directory"
    if code in (errno.ENOTDIR, errno.EEXIST):
        blocker = _non_directory(path)
        if blocker is not None:
            return blocker, "is a file, not a directory", "move the file away, or choose another directory"
    if code == errno.EIO:
        return path, "input/output error (the disk may be failing)", "check the disk and its filesystem (`dmesg`)"
    if code in (errno.EMFILE, errno.ENFILE):
        return path, "too many open files", "raise the open-file limit (`ulimit -n`)"
    cause = (error.strerror or str(error)).lower()
    return path, cause, "check that the directory is on a local, writable filesystem"


def _non_directory(path: Path) -> Path | None:
    """The first of ``path`` and its ancestors that exists and is not a directory."""
    for candidate in (path, *path.parents):
        if candidate.exists() or candidate.is_symlink():
            return None if candidate.is_dir() else candidate
    return None


def process_user() -> str:
    """The name of the user this process runs as (its effective uid)."""
    import pwd

    uid = os.geteuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


class FoldError(LogStoreError):
    """A record marked with unchanged columns cannot be folded onto the previous value of its key."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(f"cannot fold unchanged columns: {detail}; the record is kept as written")
