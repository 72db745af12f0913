"""Where a timeline ended, read from a timeline history file (:mod:`cdc.capture.timelines`)."""

from __future__ import annotations

from cdc.capture.lsn import Lsn
from cdc.capture.timelines import switch_point

HISTORY = "1\t0/3000158\tno recovery target specified\n\n2\t0/5A0000A0\tbefore 2026-12-07 07:40:00+00\n"


def test_each_timeline_ends_where_its_history_line_says_and_an_unnamed_one_is_unknown() -> None:
    assert switch_point(HISTORY, 1) == Lsn.parse("0/3000158")
    assert switch_point(HISTORY, 2) == Lsn.parse("0/5A0000A0")
    assert switch_point(HISTORY, 3) is None
    assert switch_point("", 1) is None
