"""Tunables of a log store (the CLI fills them from the ``CDC_*`` settings)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from log_store.fold import FoldFunction


def wall_clock_ms() -> int:
    """Milliseconds since the epoch."""
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class LogConfig:
    """Segment rolling, indexing, compaction and retention settings; immutable.

    ``segment_bytes`` / ``segment_ms``: the active segment rolls when a batch would take it past this size,
    or when its first batch is older than this. ``index_interval_bytes``: bytes of batches between sparse
    index entries. ``delete_retention_ms``: how long a tombstone survives compaction, counted from its
    append. ``retention_ms`` / ``retention_bytes``: limits for topics that are not compacted (-1: none).
    ``max_batch_bytes``: a partition's share of one group is split into batches of about this size.
    ``watermark_roll_bytes``: size at which the watermark file is rewritten with its latest record.
    ``writeback_bytes``: bytes a partition writes between starts of its active segment's writeback
    inside a group (0: only at the group's end), so that a large group's closing fsync finds most of
    its data already on its way to the disk; durability is unchanged (see :meth:`Partition.write`).
    ``fold``: how compaction folds records with unchanged columns (none: they are kept as written). ``clock``: milliseconds now.
    """

    segment_bytes: int = 64 << 20
    segment_ms: int = 7 * 24 * 3600 * 1000
    index_interval_bytes: int = 4096
    delete_retention_ms: int = 24 * 3600 * 1000
    retention_ms: int = -1
    retention_bytes: int = -1
    max_batch_bytes: int = 1 << 20
    watermark_roll_bytes: int = 1 << 20
    writeback_bytes: int = 4 << 20
    fold: FoldFunction | None = None
    clock: Callable[[], int] = field(default=wall_clock_ms)
