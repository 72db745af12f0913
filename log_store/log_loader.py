"""Opening a log: its format checked, the log created when new, and, for the writer, every partition
recovered to the last watermark whose data is whole (the per-partition work is :mod:`log_store.recovery`).

As Kafka's LogLoader, this runs once when the writer opens the log (and again in process when a group
fails part-way, see :meth:`LogStore.append_group`); :class:`~log_store.store.LogStore` is what it leaves.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import orjson

from log_store.atomic_file import fsync_dir, make_dirs, write_atomic
from log_store.config import LogConfig
from log_store.errors import CleanerLockedError, IncompleteTailError, LogFormatError, LogNotFoundError, RecoveryError
from log_store.lock import FileLock
from log_store.log_cleaner import LOCK_NAME as CLEANER_LOCK
from log_store.partition import Partition
from log_store.record import TopicPartition
from log_store.recovery import PartitionCut, RecoveryReport, recover_partition
from log_store.topic import META_NAME, TOPICS_DIR, TopicConfig, list_topics, partition_dir, read_topic
from log_store.watermark import FILE_NAME as WATERMARK_FILE
from log_store.watermark import Watermark, WatermarkLog

log = logging.getLogger("log_store")

#: The one format this version reads and writes.
FORMAT = 2
STORE_FILE = "store.json"
#: present only between a writer's clean close and the next writer's open
CLEAN_MARKER = "clean_shutdown"


def check_format(root: Path) -> None:
    """Refuse a log that does not declare :data:`FORMAT` (or declares nothing readable)."""
    path = root / STORE_FILE
    try:
        data = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        raise LogNotFoundError(root) from None
    except orjson.JSONDecodeError:
        raise LogFormatError(path, "unreadable", FORMAT) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else data
        raise LogFormatError(path, found, FORMAT)


def initialise(root: Path, config: LogConfig) -> None:
    """Create the log at ``root`` unless it exists: the topics folder and the watermark file first,
    ``store.json`` last, so that a log without it was never completely made."""
    if (root / STORE_FILE).exists():
        if not (root / WATERMARK_FILE).exists():
            raise RecoveryError(
                root,
                f"{WATERMARK_FILE} is missing",
                "restore it from a backup (without it every record would count as uncommitted)",
            )
        return
    if (root / TOPICS_DIR).exists():
        raise RecoveryError(
            root, f"{STORE_FILE} is missing but topics exist", "restore it from a backup, or move the directory away"
        )
    make_dirs(root / TOPICS_DIR)
    WatermarkLog.create(root / WATERMARK_FILE)
    write_atomic(root / STORE_FILE, orjson.dumps({"format": FORMAT, "created_ms": config.clock()}) + b"\n")


@dataclass
class LogLoader:
    """Recovers the log at ``root`` into the store's ``topics`` and ``partitions`` (filled in place)."""

    root: Path
    config: LogConfig
    topics: dict[str, TopicConfig]
    partitions: dict[TopicPartition, Partition]
    watermarks: WatermarkLog

    def recover(self) -> RecoveryReport:
        """Recover every partition to the last watermark whose data is whole, and publish that watermark."""
        marker = self.root / CLEAN_MARKER
        clean = marker.exists()
        scan = self.watermarks.open_for_append()
        cleaner_lock = FileLock(self.root / CLEANER_LOCK, CleanerLockedError)
        may_remove = cleaner_lock.try_acquire()
        cuts: list[PartitionCut] = []
        removed: list[str] = []
        dropped = False
        try:
            removed += self._remove_unfinished_topics()
            try:
                rebuilt = self.recover_partitions(
                    scan.latest,
                    clean,
                    may_remove,
                    cuts,
                    removed,
                    fallback=scan.previous if scan.latest is not None else None,
                    has_fallback=scan.latest is not None and not clean,
                )
            except IncompleteTailError as exc:
                if scan.latest is None or clean:
                    raise
                log.warning(
                    "the latest watermark %d is ahead of its data (%s): falling back to %s",
                    scan.latest.sequence,
                    exc,
                    scan.previous.sequence if scan.previous is not None else "empty",
                )
                for partition in self.partitions.values():
                    partition.close()
                self.partitions.clear()
                # the partitions first: should that fail, the watermark file is still as it was
                rebuilt = self.recover_partitions(scan.previous, clean, may_remove, cuts, removed)
                self.watermarks.drop_latest(scan)
                dropped = True
        finally:
            cleaner_lock.release()
        watermark = self.watermarks.current
        self.watermarks.publish(watermark)
        if clean:
            os.unlink(marker)
            fsync_dir(self.root)
        report = RecoveryReport(
            clean_shutdown=clean,
            watermark_sequence=watermark.sequence if watermark is not None else None,
            watermark_torn_bytes=scan.torn_bytes,
            partitions=tuple(cuts),
            removed_files=tuple(removed),
            rebuilt_indexes=rebuilt,
            watermark_dropped=dropped,
        )
        if report.cut_anything:
            log.warning(report.summary())
        return report

    def _remove_unfinished_topics(self) -> list[str]:
        removed: list[str] = []
        base = self.root / TOPICS_DIR
        for entry in sorted(base.iterdir()):
            if entry.is_dir() and not (entry / META_NAME).is_file():
                shutil.rmtree(entry)
                fsync_dir(base)
                removed.append(str(entry))
        return removed

    def recover_partitions(
        self,
        watermark: Watermark | None,
        clean: bool,
        may_remove: bool,
        cuts: list[PartitionCut],
        removed: list[str],
        *,
        fallback: Watermark | None = None,
        has_fallback: bool = False,
    ) -> int:
        """Recover every partition to ``watermark``; with ``has_fallback``, ``fallback`` (``None``: the
        empty log) is the previous watermark the store falls back to when the latest group is incomplete."""
        rebuilt = 0
        for name in list_topics(self.root):
            config = read_topic(self.root, name)
            assert config is not None
            self.topics[config.name] = config
            for p in range(config.partitions):
                tp = TopicPartition(config.name, p)
                directory = partition_dir(self.root, config.name, p)
                make_dirs(directory)
                end = watermark.end_offset(tp) if watermark is not None else 0
                fallback_end = (fallback.end_offset(tp) if fallback is not None else 0) if has_fallback else None
                result = recover_partition(
                    tp,
                    directory,
                    end,
                    clean=clean,
                    index_interval_bytes=self.config.index_interval_bytes,
                    remove_leftovers=may_remove,
                    fallback_end=fallback_end,
                )
                partition = Partition(tp, directory, self.config)
                partition.attach(result.active, end)
                self.partitions[tp] = partition
                if result.cut is not None:
                    cuts.append(result.cut)
                removed += result.removed_files
                rebuilt += int(result.rebuilt_index)
        return rebuilt
