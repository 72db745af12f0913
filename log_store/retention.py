"""Retention for topics that are not compacted: which old segments to delete (a pure decision).

Only sealed segments entirely below the watermark are candidates, oldest first, and only a prefix of
them is ever deleted (the log never gets holes). A segment goes when its newest batch was appended more
than ``retention_ms`` ago, or while deleting it keeps the partition at or above ``retention_bytes``
(Kafka's rule: delete while ``total - segment size >= retention_bytes``). ``-1`` turns a limit off. The
active segment is never deleted, so a partition always keeps its latest records. The caller
(:mod:`log_store.log_cleaner`) unlinks the chosen files, which readers with the file open can keep
reading; new reads start at the new first segment.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SegmentInfo:
    """What retention needs to know about one sealed segment."""

    base_offset: int
    size: int
    last_append_ms: int


def segments_to_delete(
    candidates: Sequence[SegmentInfo],
    *,
    total_bytes: int,
    now_ms: int,
    retention_ms: int,
    retention_bytes: int,
) -> list[int]:
    """Base offsets of the oldest candidates to delete, in order."""
    doomed: list[int] = []
    for segment in candidates:
        too_old = retention_ms >= 0 and now_ms - segment.last_append_ms > retention_ms
        too_big = retention_bytes >= 0 and total_bytes - segment.size >= retention_bytes
        if not (too_old or too_big):
            break
        doomed.append(segment.base_offset)
        total_bytes -= segment.size
    return doomed
