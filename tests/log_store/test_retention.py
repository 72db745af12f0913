"""Retention decisions for topics that are not compacted."""

from __future__ import annotations

from log_store.retention import SegmentInfo, segments_to_delete

SEGMENTS = [SegmentInfo(0, 100, 1_000), SegmentInfo(10, 100, 2_000), SegmentInfo(20, 100, 3_000)]


def test_by_time_deletes_a_prefix() -> None:
    assert segments_to_delete(SEGMENTS, total_bytes=400, now_ms=3_500, retention_ms=2_000, retention_bytes=-1) == [0]
    assert segments_to_delete(SEGMENTS, total_bytes=400, now_ms=10_000, retention_ms=2_000, retention_bytes=-1) == [0, 10, 20]


def test_by_size_keeps_at_least_the_limit() -> None:
    assert segments_to_delete(SEGMENTS, total_bytes=400, now_ms=0, retention_ms=-1, retention_bytes=250) == [0]
    assert segments_to_delete(SEGMENTS, total_bytes=400, now_ms=0, retention_ms=-1, retention_bytes=100) == [0, 10, 20]


def test_no_limits_and_no_holes() -> None:
    assert segments_to_delete(SEGMENTS, total_bytes=400, now_ms=10**9, retention_ms=-1, retention_bytes=-1) == []
    mixed = [SegmentInfo(0, 100, 5_000), SegmentInfo(10, 100, 1_000)]
    assert segments_to_delete(mixed, total_bytes=300, now_ms=5_500, retention_ms=2_000, retention_bytes=-1) == []
