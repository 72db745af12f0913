"""Whether a promotion forked the source's WAL below the log's position.

A promotion starts a new timeline at a switch point W: the WAL before W is the same on both timelines,
the old timeline's WAL after W is lost with the old primary (what the standby never received). The log
records, in its ledger, the timeline its positions are on (:meth:`SnapshotLedger.timeline_record`, written
before the first transaction streamed on it). When the server is on another timeline, its history says
where the recorded one ended:

* W > P (the log's position): the log holds nothing past the fork (a failover slot keeps it so,
  :mod:`cdc.setup.failover`); the log goes on, on the new timeline.
* W <= P: the log holds transactions the promotion lost, and the new timeline's own transactions at
  LSNs up to P would be skipped as already in the log. The log diverged from the source: every table is
  read again (:func:`cdc.capture.initial_snapshot.begin_again`), whatever the slot's position says (a slot
  made again after the promotion may well sit below P, where :mod:`cdc.capture.slot_continuity` sees no gap).
"""

from __future__ import annotations

from cdc.capture.lsn import Lsn
from cdc.capture.transport import ReplicationConnection


def switch_point(history: str, timeline: int) -> Lsn | None:
    """Where ``timeline`` ended, from a timeline history file's text (``tli<TAB>switchpoint<TAB>reason`` lines);
    ``None`` when the history does not name it."""
    for line in history.splitlines():
        parts = line.strip().split("\t")
        if len(parts) >= 2 and parts[0].isdigit() and int(parts[0]) == timeline:
            return Lsn.parse(parts[1])
    return None


def divergence(repl: ReplicationConnection, logged: int | None, position: Lsn) -> tuple[int, str | None]:
    """The server's timeline now, and why the log diverged from it (``None``: it did not). ``logged``: the
    timeline the log's ``position`` was reached on (``None``: not recorded yet, nothing to judge)."""
    timeline = repl.identify_system()[1]
    if logged is None or logged == timeline:
        return timeline, None
    rows = repl.command(f"TIMELINE_HISTORY {timeline}")
    content = str(rows[0][1] or "") if rows else ""
    if content.startswith("\\x"):  # a bytea's text form
        content = bytes.fromhex(content[2:]).decode("utf-8", "replace")
    switch = switch_point(content, logged)
    if switch is not None and switch > position:
        return timeline, None
    where = f"at {switch}" if switch is not None else "at a point its history does not name"
    return timeline, (
        f"the source was promoted: timeline {logged}, which the log's positions are on, ended {where}, below the "
        f"log's position {Lsn(position + 1)}; the log holds transactions the promotion lost"
    )
