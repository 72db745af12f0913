"""Writer-side recovery: bring every partition back to exactly the latest durable watermark.

Run by ``LogStore.open(writer=True)`` under the writer lock, before any append. For each partition with
watermark end offset ``E`` (0 when the watermark does not know the partition):

1. segments whose base offset is greater than ``E`` are deleted (with their indexes): they hold only
   records of a group whose watermark never became durable;
2. the last remaining segment is walked (a segment's file header becomes durable with the first group
   appended to it, so a torn header is a crash inside that group: the segment is removed when it starts
   at ``E``, and otherwise reported as an incomplete tail, see below): after a clean shutdown from its last index entry, otherwise
   from its first batch, checking every batch's CRC32C. The batches below ``E`` must be whole, valid and
   reach ``E`` exactly. If they do not, or a batch fails its check, at or past the partition's end
   offset at the *previous* watermark (:class:`~log_store.errors.IncompleteTailError`), the latest
   group's fsyncs were cut short by the crash (segments and watermark are fsynced concurrently, see
   :mod:`log_store.watermark`): the store recovers every partition to the previous watermark and only
   then drops the latest watermark record. Anything missing or damaged below the previous watermark's
   end is lost durable data: recovery stops (:class:`~log_store.errors.CorruptSegmentError`) with the
   watermark file untouched, rather than cut further. Everything from the first batch at or past ``E`` (including torn or
   garbage bytes) is truncated and the file fsynced;
3. the last segment's index is rebuilt from that walk (after an unclean shutdown) and written
   atomically;
4. left-over compaction side files (``*.cleaned``) and temp files are deleted, but only when no cleaner
   holds the cleaner lock (a running cleaner owns them).

Topic directories without ``topic.json`` (a creation the writer did not finish) are removed. The
watermark file's torn tail is truncated by :meth:`log_store.watermark.WatermarkLog.open_for_append`.
What was cut is returned as a :class:`RecoveryReport` and logged at WARNING level.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from log_store.atomic_file import TMP_SUFFIX, fsync_dir, write_atomic
from log_store.errors import CorruptSegmentError, IncompleteTailError
from log_store.offset_index import OffsetIndex, index_path
from log_store.record import TopicPartition
from log_store.record_batch import crc_matches
from log_store.segment import (
    FILE_HEADER_SIZE,
    ActiveSegment,
    BatchWalker,
    SegmentFile,
    list_segments,
    log_name,
)

log = logging.getLogger("log_store")

CLEANED_SUFFIX = ".cleaned"


@dataclass(frozen=True)
class PartitionCut:
    """What recovery removed from one partition."""

    tp: TopicPartition
    end_offset: int
    removed_segments: tuple[str, ...]
    truncated_bytes: int
    truncated_records: int


@dataclass(frozen=True)
class RecoveryReport:
    """The outcome of opening a log as its writer."""

    clean_shutdown: bool
    watermark_sequence: int | None
    watermark_torn_bytes: int = 0
    partitions: tuple[PartitionCut, ...] = ()
    removed_files: tuple[str, ...] = ()
    rebuilt_indexes: int = 0
    watermark_dropped: bool = False  # the last watermark was ahead of its data and was removed

    @property
    def cut_anything(self) -> bool:
        """Whether recovery removed any data or file."""
        return bool(self.watermark_torn_bytes or self.partitions or self.removed_files or self.watermark_dropped)

    def summary(self) -> str:
        """One line describing what was cut."""
        if not self.cut_anything:
            return f"log recovered to watermark {self.watermark_sequence}: nothing cut"
        parts = [
            f"{cut.tp}: {cut.truncated_records} record(s), {cut.truncated_bytes} byte(s), "
            f"{len(cut.removed_segments)} segment(s) past offset {cut.end_offset}"
            for cut in self.partitions
        ]
        if self.watermark_dropped:
            parts.append("the last watermark (its data was incomplete)")
        if self.watermark_torn_bytes:
            parts.append(f"{self.watermark_torn_bytes} torn watermark byte(s)")
        if self.removed_files:
            parts.append(f"{len(self.removed_files)} left-over file(s)")
        return f"log recovered to watermark {self.watermark_sequence}: cut " + "; ".join(parts)


@dataclass
class PartitionRecovery:
    """Result for one partition: the segment to append to, and what was cut."""

    active: ActiveSegment | None
    cut: PartitionCut | None
    rebuilt_index: bool
    removed_files: list[str] = field(default_factory=list)


def remove_side_files(directory: Path) -> list[str]:
    """Delete compaction side files and temp files in a partition directory."""
    removed: list[str] = []
    for name in sorted(os.listdir(directory)):
        if name.endswith((CLEANED_SUFFIX, TMP_SUFFIX)):
            os.unlink(directory / name)
            removed.append(str(directory / name))
    if removed:
        fsync_dir(directory)
    return removed


def _remove_segment(directory: Path, base: int) -> None:
    for path in (directory / log_name(base), index_path(directory / log_name(base))):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _records_in(path: Path, base: int) -> int:
    """Records in a segment about to be removed (0 when even its header is torn)."""
    try:
        segment = SegmentFile(path, base)
    except CorruptSegmentError:
        return 0
    try:
        return _count_records(segment.fd, FILE_HEADER_SIZE)
    finally:
        segment.close()


def _count_records(fd: int, start: int) -> int:
    """Records in the parsable batches from ``start`` (for the report; garbage counts as none)."""
    return sum(header.record_count for _pos, header, _buf, _at in BatchWalker(fd, start))


def recover_partition(
    tp: TopicPartition,
    directory: Path,
    end: int,
    *,
    clean: bool,
    index_interval_bytes: int,
    remove_leftovers: bool,
    fallback_end: int | None = None,
) -> PartitionRecovery:
    """Truncate one partition to ``end`` and return its active segment (see the module docstring).

    ``fallback_end`` is the partition's end offset at the previous watermark when ``end`` is the latest
    one's (``None`` otherwise). Data missing or damaged at or past it belongs to the latest group only
    and raises :class:`IncompleteTailError` (the store may fall back); anything below it is durable data
    of an earlier group and raises :class:`CorruptSegmentError`, which no fallback may paper over.
    """
    removed_files = remove_side_files(directory) if remove_leftovers else []
    bases = list_segments(directory)
    removed, cut_records = _remove_segments_past(directory, bases, end)
    kept = [base for base in bases if base <= end]
    if not kept:
        cut = PartitionCut(tp, end, tuple(removed), 0, cut_records) if removed else None
        return PartitionRecovery(None, cut, False, removed_files)
    base = kept[-1]
    path = directory / log_name(base)
    segment = _open_last_segment(path, base, end, fallback_end)
    if segment is None:  # created for the first batch of a group the crash cut short: its header never became durable
        _remove_segment(directory, base)
        fsync_dir(directory)
        cut = PartitionCut(tp, end, (*removed, log_name(base)), 0, cut_records)
        return PartitionRecovery(None, cut, False, removed_files)
    try:
        walk = _walk_to(segment, path, end, clean, index_interval_bytes, fallback_end)
        first = next(iter(segment.headers()), None)
        first_append = first[1].append_time_ms if first is not None else None
        truncated = segment.size() - walk.cut_at
        if truncated:
            cut_records += _count_records(segment.fd, walk.cut_at)
            _truncate(path, walk.cut_at)
        rebuilt = not clean or truncated > 0
        if rebuilt:
            write_atomic(index_path(path), walk.index.to_bytes(segment.nonce))
        nonce = segment.nonce
    finally:
        segment.close()
    active = ActiveSegment(path, base, nonce, walk.cut_at, walk.index, first_append, index_interval_bytes)
    active.bytes_since_index = walk.since_entry
    cut = PartitionCut(tp, end, tuple(removed), truncated, cut_records) if removed or truncated else None
    return PartitionRecovery(active, cut, rebuilt, removed_files)


def _remove_segments_past(directory: Path, bases: list[int], end: int) -> tuple[list[str], int]:
    """Remove the segments of ``bases`` that start past ``end`` (written by a group that never committed):
    their names, and how many records they held."""
    removed: list[str] = []
    cut_records = 0
    for base in bases:
        if base > end:
            removed.append(log_name(base))
            cut_records += _records_in(directory / log_name(base), base)
            _remove_segment(directory, base)
    if removed:
        fsync_dir(directory)
    return removed, cut_records


def _open_last_segment(path: Path, base: int, end: int, fallback_end: int | None) -> SegmentFile | None:
    """The partition's last segment at or below ``end``; ``None`` when its header is torn and it starts
    at ``end`` (made for a group the crash cut short, nothing durable in it).

    A segment's header becomes durable with the first group appended to it: torn below ``end``, it was
    created by a group whose fsyncs the crash cut short. For the latest watermark that is its group's
    data missing (the store falls back to the previous watermark); for an earlier one it is lost durable
    data, reported as such.
    """
    try:
        return SegmentFile(path, base)
    except CorruptSegmentError as exc:
        if base == end:
            return None
        detail = f"the file header is torn ({exc.detail}) but the watermark says offsets below {end} are durable"
        if _latest_group_only(base, fallback_end):
            raise IncompleteTailError(path, 0, base, end, detail) from exc
        raise CorruptSegmentError(path, 0, base, detail) from exc


def _walk_to(
    segment: SegmentFile, path: Path, end: int, clean: bool, index_interval_bytes: int, fallback_end: int | None
) -> _Walk:
    """Walk ``segment``'s batches up to offset ``end`` (from its last index entry after a clean shutdown),
    raising when its valid batches end short of it."""
    walk = None
    if clean:
        index = OffsetIndex.load(index_path(path), segment.nonce)
        if index is not None and len(index):
            start = segment.last_index_position()
            walk = _walk(segment, start, end, _entries_before(index, start), index_interval_bytes, fallback_end)
            if walk.batches == 0:
                walk = None
    if walk is None:
        walk = _walk(segment, FILE_HEADER_SIZE, end, OffsetIndex(), index_interval_bytes, fallback_end)
    if walk.reached != end:
        detail = (
            f"the watermark says offsets below {end} are durable but this segment's valid "
            f"batches end at offset {walk.reached} ({walk.stop} at byte {walk.cut_at})"
        )
        if _latest_group_only(walk.reached, fallback_end):
            raise IncompleteTailError(path, walk.cut_at, walk.reached, end, detail)
        raise CorruptSegmentError(path, walk.cut_at, walk.reached, detail)
    return walk


def _truncate(path: Path, size: int) -> None:
    """Cut the file at ``path`` to ``size`` bytes, durably."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class _Walk:
    index: OffsetIndex
    reached: int
    cut_at: int
    stop: str
    since_entry: int
    batches: int


def _latest_group_only(offset: int, fallback_end: int | None) -> bool:
    """Whether data missing from ``offset`` on belongs to the latest group alone."""
    return fallback_end is not None and offset >= fallback_end


def _walk(
    segment: SegmentFile, start: int, end: int, index: OffsetIndex, interval: int, fallback_end: int | None = None
) -> _Walk:
    """CRC-check the batches from ``start`` below ``end``, extending ``index`` as the writer would.

    A batch of the latest group (at or past ``fallback_end``) that fails its check is that group's
    data cut short by the crash (its pages and its watermark are fsynced concurrently):
    :class:`IncompleteTailError`. Below it, a failed check is corruption of durable data.
    """
    base = segment.base_offset
    walker = BatchWalker(segment.fd, start, end, base)
    reached, since_entry, batches = base, 0, 0
    for position, header, buf, at in walker:
        if not crc_matches(buf, at, header):
            if _latest_group_only(header.base_offset, fallback_end):
                raise IncompleteTailError(
                    segment.path, position, header.base_offset, end, "a batch of the latest group fails its CRC32C check"
                )
            raise CorruptSegmentError(
                segment.path, position, header.base_offset, "batch below the watermark fails its CRC32C check"
            )
        if header.next_offset > end:
            raise CorruptSegmentError(
                segment.path, position, header.base_offset, f"batch spans past the watermark end offset {end}"
            )
        last = index.last()
        if since_entry >= interval and (last is None or position > last[1]):
            index.append(header.base_offset - base, position)
            since_entry = 0
        since_entry += header.length
        reached = header.next_offset
        batches += 1
    return _Walk(index, reached, walker.stop_position, walker.stop, since_entry, batches)


def _entries_before(index: OffsetIndex, position: int) -> OffsetIndex:
    """The entries of ``index`` up to and including ``position``."""
    kept = OffsetIndex()
    for relative, entry_position in zip(index.offsets, index.positions, strict=True):
        if entry_position > position:
            break
        kept.offsets.append(relative)
        kept.positions.append(entry_position)
    return kept
