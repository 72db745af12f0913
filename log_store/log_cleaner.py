"""Running compaction and retention over a log: locking, choosing segments, swapping files.

One cleaner at a time per log: :class:`LogCleaner` holds ``cleaner.lock`` (an ``flock``; a second one
gets :class:`~log_store.errors.CleanerLockedError`) but never the writer lock, so it runs beside the
writer and any readers without blocking them. It reads the latest watermark once per partition and only
touches *cleanable* segments: sealed ones (not the last of the partition) whose successor's base offset
is <= the watermark's end offset, i.e. segments that are final and wholly committed.

Compaction of a partition (compacted topics), with :mod:`log_store.cleaner` as the algorithm:

1. delete side files a crashed cleaner left behind (``*.cleaned``, ``*.tmp``);
2. pass 1 reads every cleanable segment (CRC-checked) into the offset map;
3. pass 2 rewrites each segment that changes into ``<base>.log.cleaned`` and ``<base>.index.cleaned``
   (new nonce), fsyncs both, renames the index then the log over the originals and fsyncs the directory.
   A segment left with no record is deleted instead. A failure removes the side files; the originals are
   untouched until the rename, which is atomic, so a crash at any point leaves each segment either old
   or new, both valid. Readers holding the old file open finish reading it;
4. ``cleaner.checkpoint`` (``{"cleaned_offset": n}``, written atomically) records where the cleaned part
   ends; ``describe`` derives the dirty ratio from it.

Retention (topics that are not compacted): :mod:`log_store.retention` picks a prefix of cleanable
segments, which are unlinked (log first, then index). Nothing here ever goes past the watermark.
"""

from __future__ import annotations

import os
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson

from log_store.atomic_file import create_file, fsync_dir, write_all, write_atomic
from log_store.batch_decoding import decode_columns, decode_records
from log_store.cleaner import Cleaner, OffsetMap
from log_store.config import LogConfig
from log_store.errors import CleanerLockedError
from log_store.lock import FileLock
from log_store.offset_index import OffsetIndex, index_path
from log_store.record import TopicPartition
from log_store.recovery import CLEANED_SUFFIX, remove_side_files
from log_store.retention import SegmentInfo, segments_to_delete
from log_store.segment import FILE_HEADER_SIZE, SegmentFile, encode_file_header, list_segments, log_name
from log_store.topic import TopicConfig, partition_dir
from log_store.watermark import Watermark

CHECKPOINT_NAME = "cleaner.checkpoint"
LOCK_NAME = "cleaner.lock"


@dataclass(frozen=True)
class PartitionCleaning:
    """What one cleaning pass did to one partition."""

    tp: TopicPartition
    segments_rewritten: int
    segments_deleted: int
    records_read: int
    records_kept: int
    tombstones_removed: int
    folded: int
    fold_failures: int
    bytes_before: int  # of the segments the pass looked at (sealed, below the watermark)
    bytes_after: int  # of the same offsets after the pass
    cleaned_offset: int

    @property
    def changed(self) -> bool:
        """Whether the pass rewrote or deleted a segment (else the partition is as it was)."""
        return bool(self.segments_rewritten or self.segments_deleted)


@dataclass(frozen=True)
class CleanerReport:
    """What :meth:`LogCleaner.run` did, per partition it touched."""

    partitions: tuple[PartitionCleaning, ...]

    @property
    def records_read(self) -> int:
        """Records read by compaction."""
        return sum(p.records_read for p in self.partitions)

    @property
    def records_kept(self) -> int:
        """Records compaction kept."""
        return sum(p.records_kept for p in self.partitions)


def read_checkpoint(directory: Path) -> int:
    """The offset below which a partition was last cleaned (0 when never)."""
    try:
        return int(orjson.loads((directory / CHECKPOINT_NAME).read_bytes())["cleaned_offset"])
    except (FileNotFoundError, orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return 0


def _cleanable(bases: list[int], end: int) -> list[tuple[int, int]]:
    """``(base, next base)`` of the sealed segments wholly below ``end``."""
    return [(bases[i], bases[i + 1]) for i in range(len(bases) - 1) if bases[i + 1] <= end]


class LogCleaner:
    """Compacts compacted topics and applies retention to the others."""

    def __init__(
        self,
        root: Path,
        config: LogConfig,
        topics: Callable[[], list[TopicConfig]],
        watermark: Callable[[], Watermark | None],
    ) -> None:
        self.root = root
        self.config = config
        self._topics = topics
        self._watermark = watermark

    def run(self, topic: str | None = None, *, now_ms: int | None = None) -> CleanerReport:
        """One pass over ``topic`` (or every topic) under the cleaner lock."""
        lock = FileLock(self.root / LOCK_NAME, CleanerLockedError)
        lock.acquire()
        try:
            now = self.config.clock() if now_ms is None else now_ms
            results: list[PartitionCleaning] = []
            for config in self._topics():
                if topic is not None and config.name != topic:
                    continue
                for partition in range(config.partitions):
                    tp = TopicPartition(config.name, partition)
                    directory = partition_dir(self.root, config.name, partition)
                    if not directory.is_dir():
                        continue
                    remove_side_files(directory)
                    watermark = self._watermark()
                    end = watermark.end_offset(tp) if watermark is not None else 0
                    if config.compacted:
                        result = self.compact_partition(tp, directory, end, now)
                    else:
                        result = self.retain_partition(tp, directory, end, now)
                    if result is not None:
                        results.append(result)
            return CleanerReport(tuple(results))
        finally:
            lock.release()

    def run_periodically(self, stop: threading.Event, interval_s: float) -> None:
        """Run a pass every ``interval_s`` seconds until ``stop`` is set (for a background thread).

        A pass that finds another cleaner holding the lock is skipped; other errors propagate.
        """
        while not stop.wait(interval_s):
            try:
                self.run()
            except CleanerLockedError:
                continue

    # --- compaction --------------------------------------------------------------------------

    def compact_partition(self, tp: TopicPartition, directory: Path, end: int, now_ms: int) -> PartitionCleaning | None:
        """Compact the cleanable segments of one partition (see the module docstring)."""
        ranges = _cleanable(list_segments(directory), end)
        if not ranges:
            return None
        topic, partition = tp
        offset_map = OffsetMap()
        for base, next_base in ranges:
            segment = SegmentFile(directory / log_name(base), base)
            try:
                for _pos, header, buf, at in segment.batches(next_base):
                    offsets, keys, _values, _ts, headers = decode_columns(buf, at, header, 0, next_base, values=False)
                    offset_map.add_columns(offsets, keys, headers)
            finally:
                segment.close()
        cleaner = Cleaner(offset_map, now_ms=now_ms, delete_retention_ms=self.config.delete_retention_ms, fold=self.config.fold)
        rewritten = deleted = bytes_before = bytes_after = 0
        for base, next_base in ranges:
            before, after = self._rewrite(directory, base, next_base, cleaner, topic, partition)
            bytes_before += before
            if after is None:  # unchanged: its bytes stay
                bytes_after += before
                continue
            if after == 0:
                deleted += 1
            else:
                rewritten += 1
            bytes_after += after
        cleaned_offset = ranges[-1][1]
        write_atomic(directory / CHECKPOINT_NAME, orjson.dumps({"cleaned_offset": cleaned_offset}) + b"\n")
        stats = cleaner.stats
        return PartitionCleaning(
            tp,
            rewritten,
            deleted,
            stats.records_read,
            stats.records_kept,
            stats.tombstones_removed,
            stats.folded,
            stats.fold_failures,
            bytes_before,
            bytes_after,
            cleaned_offset,
        )

    def _rewrite(
        self, directory: Path, base: int, next_base: int, cleaner: Cleaner, topic: str, partition: int
    ) -> tuple[int, int | None]:
        """Clean one segment; returns (bytes before, bytes after or ``None`` when unchanged).

        The cleaned segment and its index are written and fsynced beside the originals, then renamed
        over them (index first) and the directory fsynced: a crash leaves either segment whole, and
        the side files a crash leaves are removed by the next recovery.
        """
        path = directory / log_name(base)
        segment = SegmentFile(path, base)
        side_log = path.with_name(path.name + CLEANED_SUFFIX)
        side_index = index_path(path).with_name(index_path(path).name + CLEANED_SUFFIX)
        done = False
        try:
            before = segment.size()
            outputs, changed = _cleaned_batches(segment, next_base, cleaner, topic, partition)
            if not changed:
                done = True
                return before, None
            if not outputs:
                os.unlink(path)
                try:
                    os.unlink(index_path(path))
                except FileNotFoundError:
                    pass
                fsync_dir(directory)
                done = True
                return before, 0
            after = self._write_cleaned(side_log, side_index, base, outputs)
            os.replace(side_index, index_path(path))
            os.replace(side_log, path)
            fsync_dir(directory)
            done = True
            return before, after
        finally:
            segment.close()
            if not done:
                for leftover in (side_log, side_index):
                    try:
                        os.unlink(leftover)
                    except FileNotFoundError:
                        pass

    def _write_cleaned(self, side_log: Path, side_index: Path, base: int, outputs: list[tuple[int, bytes]]) -> int:
        """Write and fsync a segment of ``outputs`` (``(base offset, batch bytes)``) at ``side_log`` and
        its index at ``side_index``, under a new nonce; returns the segment's size."""
        nonce = secrets.randbits(64)
        index = OffsetIndex()
        position = FILE_HEADER_SIZE
        since_entry = 0
        chunks = [encode_file_header(base, nonce)]
        for batch_base, data in outputs:
            if since_entry >= self.config.index_interval_bytes:
                index.append(batch_base - base, position)
                since_entry = 0
            chunks.append(data)
            position += len(data)
            since_entry += len(data)
        for file, data in ((side_log, b"".join(chunks)), (side_index, index.to_bytes(nonce))):
            fd = create_file(file, os.O_WRONLY | os.O_EXCL)
            try:
                write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
        return position

    # --- retention ---------------------------------------------------------------------------

    def retain_partition(self, tp: TopicPartition, directory: Path, end: int, now_ms: int) -> PartitionCleaning | None:
        """Delete the segments retention no longer keeps (topics that are not compacted)."""
        if self.config.retention_ms < 0 and self.config.retention_bytes < 0:
            return None
        bases = list_segments(directory)
        sizes = {base: os.stat(directory / log_name(base)).st_size for base in bases}
        candidates: list[SegmentInfo] = []
        for base, _next_base in _cleanable(bases, end):
            segment = SegmentFile(directory / log_name(base), base)
            try:
                last_append = 0
                for _pos, header in segment.headers(segment.last_index_position()):
                    last_append = max(last_append, header.append_time_ms)
            finally:
                segment.close()
            candidates.append(SegmentInfo(base, sizes[base], last_append))
        doomed = segments_to_delete(
            candidates,
            total_bytes=sum(sizes.values()),
            now_ms=now_ms,
            retention_ms=self.config.retention_ms,
            retention_bytes=self.config.retention_bytes,
        )
        for base in doomed:
            os.unlink(directory / log_name(base))
            try:
                os.unlink(index_path(directory / log_name(base)))
            except FileNotFoundError:
                pass
        if doomed:
            fsync_dir(directory)
        freed = sum(sizes[base] for base in doomed)
        total = sum(sizes.values())
        return PartitionCleaning(tp, 0, len(doomed), 0, 0, 0, 0, 0, total, total - freed, 0)


def _cleaned_batches(
    segment: SegmentFile, next_base: int, cleaner: Cleaner, topic: str, partition: int
) -> tuple[list[tuple[int, bytes]], bool]:
    """The batches of ``segment`` (below ``next_base``) as ``cleaner`` leaves them, as ``(base offset,
    bytes)``, and whether any of them changed."""
    outputs: list[tuple[int, bytes]] = []
    changed = False
    for _pos, header, buf, at in segment.batches(next_base):
        raw = buf[at : at + header.length]
        records = decode_records(buf, at, header, topic, partition, 0, next_base)
        cleaned = cleaner.clean_batch(header, raw, records)
        if cleaned is not raw:
            changed = True
        if cleaned is not None:
            outputs.append((header.base_offset, cleaned))
    return outputs, changed
