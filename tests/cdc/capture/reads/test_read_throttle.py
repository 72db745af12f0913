"""The ceiling on the rows per second reads take (pure, no database)."""

from __future__ import annotations

from cdc.capture.reads.read_throttle import ReadThrottle


def test_chunks_are_read_while_the_rows_so_far_stay_within_the_rate() -> None:
    throttle = ReadThrottle(1000)
    assert throttle.allows(0.0)
    throttle.took(500, 0.0)
    assert not throttle.allows(0.2) and throttle.allows(0.5)
    throttle.took(500, 0.5)
    assert not throttle.allows(0.9) and throttle.allows(1.0)


def test_no_ceiling_allows_every_chunk() -> None:
    throttle = ReadThrottle(0)
    throttle.took(10**9, 0.0)
    assert throttle.allows(0.0)


def test_a_pause_saves_up_no_more_than_a_seconds_rows() -> None:
    throttle = ReadThrottle(1000)
    throttle.took(500, 0.0)
    assert throttle.allows(3600.0)  # an hour without reads
    throttle.took(1000, 3600.0)
    throttle.took(1000, 3600.0)
    assert not throttle.allows(3600.0)
