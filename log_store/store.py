"""The log store: topics of partitions of segments under one root directory, with a commit watermark.

Root layout::

    store.json               {"format": 2, "created_ms": int}; written last when a log is created.
                             Its record batches are laid out as log_store.record_batch says; a log
                             declaring another format is refused with a clear message instead of
                             being read as corrupt.
    watermarks.log           commit watermarks, appended and fsynced by the writer (see log_store.watermark)
    watermark.pub            the latest durable watermark, in two slots, for readers
    writer.lock              flock held by the one writer process (its pid inside)
    cleaner.lock             flock held by the one process compacting / applying retention
    clean_shutdown           present only between a writer's clean close and the next writer open
    topics/<topic>/topic.json, topics/<topic>/<partition>/<base:020d>.log|.index, cleaner.checkpoint
    consumer_offsets/<group>.json

Write path (writer only): :meth:`LogStore.append_group` is a group commit (:mod:`log_store.group_commit`
says how, and what a crash or a failed write leaves): the group is durable and visible when the call
returns, and never visible in part.

Read path (any process): :meth:`LogStore.read` never returns a record at or past the watermark's end
offset for its partition (the latest watermark, re-read from disk, unless ``until`` is given), and never
returns bytes that failed their CRC.

Where the parts live: placing and encoding a chunk is :mod:`log_store.placement`, opening and
recovering the log is :mod:`log_store.log_loader`, a partition's files are :mod:`log_store.partition`,
the group commit is :mod:`log_store.group_commit`. This module keeps the public face of the log (the
calls of ``API.md``).

Thread/process safety: one writer process (``writer.lock``; a second gets
:class:`~log_store.errors.LogLockedError` naming the holder's pid) and any number of reader processes.
A ``LogStore`` object may be shared by threads (an internal lock serialises appends and metadata), but
not across ``fork``: open one per process.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal

from log_store.atomic_file import make_dirs, write_atomic
from log_store.batch_decoding import RecordColumns
from log_store.config import LogConfig
from log_store.consumer_offsets import DIR_NAME as OFFSETS_DIR
from log_store.consumer_offsets import ConsumerOffsets, GroupOffsets
from log_store.errors import (
    MissingWatermarkError,
    ReadOnlyError,
    StorageIOError,
    TopicConfigMismatchError,
    UnknownTopicError,
    WriterFailedError,
)
from log_store.group_commit import GroupCommit
from log_store.lock import FileLock
from log_store.log_cleaner import CleanerReport, LogCleaner, read_checkpoint
from log_store.log_loader import CLEAN_MARKER, check_format, initialise
from log_store.partition import Partition
from log_store.placement import ChunkEncoder
from log_store.producer_columns import ProducerColumns
from log_store.record import ProducerRecord, Record, TopicPartition
from log_store.recovery import RecoveryReport
from log_store.sync_pool import SyncPool
from log_store.topic import (
    TopicConfig,
    list_topics,
    partition_dir,
    read_topic,
    validate_topic_name,
    write_topic,
)
from log_store.watermark import FILE_NAME as WATERMARK_FILE
from log_store.watermark import PUBLISHED_NAME, Watermark, WatermarkLog

#: Records placed, encoded and written at a time by :meth:`LogStore.append_group`.
APPEND_CHUNK = 10_000
WRITER_LOCK = "writer.lock"


@dataclass(frozen=True)
class AtTime:
    """Reset target: the first offset whose record timestamp is >= ``timestamp_ms``."""

    timestamp_ms: int


#: Where :meth:`LogStore.reset_offsets` moves a group: the log start, the latest watermark, a given
#: watermark's end offsets, or a point in time.
OffsetReset = Literal["earliest", "latest"] | Watermark | AtTime


@dataclass(frozen=True)
class PartitionInfo:
    """One row of :meth:`LogStore.describe`."""

    tp: TopicPartition
    start_offset: int
    end_offset: int
    segments: int
    bytes: int
    dirty_ratio: float | None  # None for topics that are not compacted


class LogStore(GroupCommit):
    """A durable, partitioned, compacted log on local disk (see the module docstring)."""

    def __init__(self, root: Path, config: LogConfig, writer: bool) -> None:
        self.root = root
        self.config = config
        self.writer = writer
        self.recovery: RecoveryReport | None = None
        self._lock = threading.RLock()
        self._topics: dict[str, TopicConfig] = {}
        self._partitions: dict[TopicPartition, Partition] = {}
        self._watermarks = WatermarkLog(root / WATERMARK_FILE, config.watermark_roll_bytes)
        self._offsets = ConsumerOffsets(root / OFFSETS_DIR)
        self._writer_lock: FileLock | None = None
        self._failed: BaseException | None = None
        self._closed = False
        self._sync_pool: SyncPool | None = None
        self._encoder = ChunkEncoder(root, self._topics, self._partitions)

    # --- opening -----------------------------------------------------------------------------

    @classmethod
    def open(cls, root: Path, config: LogConfig = LogConfig(), *, writer: bool = False) -> LogStore:
        """Open the log at ``root``; as writer: take the lock, create the log if new, and recover.

        The operating system's refusals (a full disk, permission bits, a file where a directory
        belongs) raise :class:`StorageIOError`, here and in every writing method.
        """
        root = Path(root)
        with _storage(root):
            return cls._open(root, config, writer)

    @classmethod
    def _open(cls, root: Path, config: LogConfig, writer: bool) -> LogStore:
        store = cls(root, config, writer)
        if not writer:
            check_format(root)
            # created before store.json and only ever replaced by a rename: an existing log always has one
            if not (root / WATERMARK_FILE).exists():
                raise MissingWatermarkError(root / WATERMARK_FILE, published=False)
            return store
        make_dirs(root)
        lock = FileLock(root / WRITER_LOCK)
        lock.acquire()
        store._writer_lock = lock
        try:
            initialise(root, config)
            check_format(root)
            store.recovery = store._loader().recover()
        except BaseException:
            try:
                store._watermarks.close()
                for partition in store._partitions.values():
                    partition.close(seal=False)  # nothing was appended: there is nothing to sync
            finally:
                lock.release()
            raise
        return store

    # --- topics ------------------------------------------------------------------------------

    def _require_writer(self, operation: str) -> None:
        if not self.writer:
            raise ReadOnlyError(self.root, operation)
        if self._closed:
            raise ReadOnlyError(self.root, f"{operation} after close()")

    def ensure_topic(self, name: str, partitions: int, *, compacted: bool = True) -> None:
        """Create the topic if it does not exist; an existing one must have the same settings."""
        self._require_writer("ensure_topic")
        validate_topic_name(name)
        with _storage(self.root):
            self._ensure_topic(name, partitions, compacted)

    def _ensure_topic(self, name: str, partitions: int, compacted: bool) -> None:
        if not isinstance(partitions, int) or partitions < 1:
            raise ValueError(f"a topic needs at least one partition, not {partitions!r}")
        with self._lock:
            existing = self._topics.get(name)
            if existing is not None:
                if existing.partitions != partitions:
                    raise TopicConfigMismatchError(name, "partitions", existing.partitions, partitions)
                if existing.compacted != compacted:
                    raise TopicConfigMismatchError(name, "compacted", existing.compacted, compacted)
                return
            config = TopicConfig(name, partitions, compacted, self.config.clock())
            for p in range(partitions):
                make_dirs(partition_dir(self.root, name, p))
            write_topic(self.root, config)
            self._topics[name] = config
            for p in range(partitions):
                tp = TopicPartition(name, p)
                self._partitions[tp] = Partition(tp, partition_dir(self.root, name, p), self.config)

    def topics(self) -> list[str]:
        """Names of the existing topics, sorted."""
        if self.writer:
            with self._lock:
                return sorted(self._topics)
        return list_topics(self.root)

    def topic_config(self, topic: str) -> TopicConfig:
        """The settings of ``topic`` (raises :class:`UnknownTopicError`)."""
        config = self._topics.get(topic)
        if config is None and not self.writer:
            config = read_topic(self.root, validate_topic_name(topic))
            if config is not None:
                with self._lock:
                    self._topics[topic] = config
        if config is None:
            raise UnknownTopicError(self.root, topic)
        return config

    def partitions(self, topic: str) -> int:
        """The partition count of ``topic``."""
        return self.topic_config(topic).partitions

    def _partition(self, tp: TopicPartition) -> Partition:
        partition = self._partitions.get(tp)
        if partition is not None:
            return partition
        config = self.topic_config(tp.topic)
        if not 0 <= tp.partition < config.partitions:
            raise UnknownTopicError(self.root, tp.topic, tp.partition, config.partitions)
        with self._lock:
            partition = self._partitions.get(tp)
            if partition is None:
                partition = Partition(tp, partition_dir(self.root, tp.topic, tp.partition), self.config)
                self._partitions[tp] = partition
        return partition

    # --- appending ---------------------------------------------------------------------------

    def append_group(
        self,
        records: Iterable[ProducerRecord | ProducerColumns],
        position: str,
        *,
        chunk_records: int = APPEND_CHUNK,
    ) -> Watermark:
        """Append ``records`` and commit them with a durable watermark at ``position``.

        ``records`` may be any iterable (a generator too); it is read once, ``chunk_records`` items at
        a time, so a group of any size needs memory for one chunk only. An item may be a
        :class:`ProducerColumns` (many records as Arrow columns), which counts as one item and is
        encoded as a run of its own, in its place among the records. Guarantees: when this returns,
        every record and the watermark are durable (fsynced) and visible to readers; before it returns
        none of them is visible, and a crash at any point leaves either the whole group (once its
        watermark is durable) or none of it after recovery. Records of a chunk are validated before
        any of that chunk is written: a bad record in the first chunk leaves the log untouched and
        usable. When a later chunk fails validation, or the iterator raises, the chunks already written
        are cut back to the last watermark before the exception propagates, so the log stays usable
        and the group leaves no trace. A failed write fails the writer (see the module docstring).
        """
        self._require_writer("append_group")
        if not isinstance(position, str):
            raise TypeError(f"position must be a str, not {type(position).__name__}")
        if chunk_records < 1:
            raise ValueError(f"chunk_records must be at least 1, not {chunk_records}")
        with _storage(self.root), self._lock:
            if self._failed is not None:
                raise WriterFailedError(self.root, self._failed)
            now = self.config.clock()
            touched = self._write_chunks(records, chunk_records, now)
            return self._commit(position, now, touched)

    def roll(self, topic: str | None = None) -> int:
        """Seal every non-empty active segment (of ``topic`` or all); returns how many rolled."""
        self._require_writer("roll")
        with _storage(self.root), self._lock:
            return sum(p.roll() for tp, p in self._partitions.items() if topic is None or tp.topic == topic)

    # --- reading -----------------------------------------------------------------------------

    def latest_watermark(self) -> Watermark | None:
        """The newest durable watermark (readers re-read it from disk; cheap when unchanged)."""
        with self._lock:
            if self.writer:
                return self._watermarks.current
            return self._watermarks.latest()

    def require_published_watermark(self) -> None:
        """Raise :class:`MissingWatermarkError` when readers cannot learn of any commit because
        ``watermark.pub`` is gone (the writer publishes it when it opens the log, so only a reader that
        races a brand-new log's first open could see it missing otherwise)."""
        published = self.root / PUBLISHED_NAME
        if not self.writer and not published.exists():
            raise MissingWatermarkError(published, published=True)

    def verify(self, tp: TopicPartition) -> None:
        """Check every committed batch of ``tp`` (framing and CRC32C, nothing decoded); raises
        :class:`CorruptSegmentError` naming the file, byte position and offset of the first damage."""
        tp = TopicPartition(*tp)
        end = self.end_offset(tp)
        self._partition(tp).verify(self.start_offset(tp), end)

    def read(
        self,
        tp: TopicPartition,
        offset: int,
        *,
        max_records: int = 10_000,
        max_bytes: int = 16 << 20,
        until: Watermark | None = None,
        end: int | None = None,
    ) -> list[Record]:
        """Records of ``tp`` from ``offset`` below the watermark's end offset for ``tp``, and below ``end``
        when given."""
        tp = TopicPartition(*tp)
        partition = self._partition(tp)
        limit = self._read_limit(tp, until)
        if limit is None:
            return []
        return partition.read(max(offset, 0), limit if end is None else min(end, limit), max_records, max_bytes)

    def read_columns(
        self,
        tp: TopicPartition,
        offset: int,
        *,
        max_records: int = 50_000,
        max_bytes: int = 64 << 20,
        end: int | None = None,
        until: Watermark | None = None,
    ) -> list[RecordColumns]:
        """:meth:`read` as whole batches of columns (:class:`RecordColumns`), for readers that hand
        records on in bulk: no object per record. Offsets stay below the watermark's end offset for
        ``tp`` and below ``end`` when given; stops after the batch that reaches ``max_records`` records
        or ``max_bytes`` of keys and values (always at least one batch when any record exists)."""
        tp = TopicPartition(*tp)
        partition = self._partition(tp)
        limit = self._read_limit(tp, until)
        if limit is None:
            return []
        return partition.read_columns(max(offset, 0), limit if end is None else min(end, limit), max_records, max_bytes)

    def _read_limit(self, tp: TopicPartition, until: Watermark | None) -> int | None:
        """Where reads of ``tp`` stop: its end offset at ``until`` (default: the latest watermark);
        ``None`` before the first watermark."""
        watermark = until if until is not None else self.latest_watermark()
        return None if watermark is None else watermark.end_offset(tp)

    def end_offset(self, tp: TopicPartition) -> int:
        """The end offset of ``tp`` at the latest watermark (the next offset to be committed)."""
        tp = TopicPartition(*tp)
        self._partition(tp)
        watermark = self.latest_watermark()
        return watermark.end_offset(tp) if watermark is not None else 0

    def start_offset(self, tp: TopicPartition) -> int:
        """The first offset still stored for ``tp`` (retention moves it forward)."""
        tp = TopicPartition(*tp)
        return self._partition(tp).start_offset(self.end_offset(tp))

    def offset_for_time(self, tp: TopicPartition, timestamp_ms: int) -> int:
        """The first committed offset of ``tp`` whose timestamp is >= ``timestamp_ms`` (else the end)."""
        tp = TopicPartition(*tp)
        end = self.end_offset(tp)
        found = self._partition(tp).offset_for_time(timestamp_ms, end)
        return end if found is None else found

    # --- consumer offsets --------------------------------------------------------------------

    def commit_offsets(self, group: str, offsets: Mapping[TopicPartition, int], *, metadata: str = "") -> None:
        """Store ``group``'s next offsets to read (atomically; merged with its other partitions)."""
        for tp in offsets:
            self._partition(TopicPartition(*tp))
        with _storage(self.root / OFFSETS_DIR):
            self._offsets.commit(group, offsets, self.config.clock(), metadata)

    def committed_offsets(self, group: str) -> dict[TopicPartition, int]:
        """``group``'s committed offsets (empty when it never committed)."""
        return self._offsets.fetch(group).offsets

    def group_offsets(self, group: str) -> GroupOffsets:
        """``group``'s commit with its metadata and time."""
        return self._offsets.fetch(group)

    def consumer_groups(self) -> list[str]:
        """Groups that committed offsets."""
        return self._offsets.groups()

    def reset_offsets(self, group: str, topic: str, to: OffsetReset) -> dict[TopicPartition, int]:
        """Move ``group``'s offsets for every partition of ``topic`` and commit them."""
        targets: dict[TopicPartition, int] = {}
        for p in range(self.partitions(topic)):
            tp = TopicPartition(topic, p)
            if to == "earliest":
                targets[tp] = self.start_offset(tp)
            elif to == "latest":
                targets[tp] = self.end_offset(tp)
            elif isinstance(to, Watermark):
                targets[tp] = to.end_offset(tp)
            elif isinstance(to, AtTime):
                targets[tp] = self.offset_for_time(tp, to.timestamp_ms)
            else:
                raise ValueError(f"cannot reset offsets to {to!r}: use 'earliest', 'latest', a Watermark or AtTime(timestamp_ms)")
        self.commit_offsets(group, targets, metadata=f"reset to {to!r}")
        return targets

    # --- maintenance -------------------------------------------------------------------------

    def cleaner(self) -> LogCleaner:
        """A :class:`LogCleaner` over this log (compaction and retention, under the cleaner lock)."""
        return LogCleaner(
            self.root, self.config, lambda: [self.topic_config(name) for name in self.topics()], self.latest_watermark
        )

    def compact(self, topic: str | None = None, *, now_ms: int | None = None) -> CleanerReport:
        """Compact compacted topics and apply retention to the others (sealed segments only).

        Takes the cleaner lock, not the writer lock: a reader-mode store may run it beside the writer.
        """
        if topic is not None:
            self.topic_config(topic)
        with _storage(self.root):
            return self.cleaner().run(topic, now_ms=now_ms)

    def describe(self, topic: str) -> list[PartitionInfo]:
        """Per-partition offsets, segments, bytes and dirty ratio of ``topic``."""
        config = self.topic_config(topic)
        rows: list[PartitionInfo] = []
        for p in range(config.partitions):
            tp = TopicPartition(topic, p)
            partition = self._partition(tp)
            end = self.end_offset(tp)
            cleaned = read_checkpoint(partition.directory)
            stats = partition.stats(cleaned)
            ratio = None
            if config.compacted:
                ratio = stats.dirty_bytes / stats.bytes if stats.bytes else 0.0
            rows.append(PartitionInfo(tp, partition.start_offset(end), end, stats.segments, stats.bytes, ratio))
        return rows

    # --- closing -----------------------------------------------------------------------------

    def close(self) -> None:
        """Release everything; a writer seals its segments and records a clean shutdown.

        A writer whose append failed closes its files without syncing them (they may hold part of the
        failed group, which the next writer's recovery cuts) and records no clean shutdown.
        """
        with _storage(self.root), self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                if self._sync_pool is not None:
                    self._sync_pool.close()
                for partition in self._partitions.values():
                    partition.close(seal=self._failed is None)
                self._watermarks.close()
                if self.writer and self._failed is None:
                    write_atomic(self.root / CLEAN_MARKER, b"")
            finally:
                if self._writer_lock is not None:
                    self._writer_lock.release()

    def __enter__(self) -> LogStore:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"LogStore({str(self.root)!r}, writer={self.writer})"


@contextmanager
def _storage(path: Path) -> Iterator[None]:
    """Turn the operating system's refusal of a file operation into :class:`StorageIOError` (``path``:
    what to name when the system call named no file, as a write on a descriptor does)."""
    try:
        yield
    except OSError as exc:
        raise StorageIOError(path, exc) from exc
