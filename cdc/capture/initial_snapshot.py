"""The initial snapshot: a slot made with an exported snapshot, and every captured table read into the
log as of the slot's consistent point C minus one.

The snapshot holds exactly the transactions that committed before C, and the slot streams exactly
those that commit at or after C. The group that completes the snapshot has C - 1 as its position
(:mod:`cdc.capture.snapshot_writer`), so an interrupted snapshot never looks complete and the next run takes it
again from a new slot; that slot is dropped here when a first snapshot fails (nobody would stream from
it), but kept when the log already held a snapshot: its gap after the log's position is what makes the
next run take the snapshot again, where a missing slot would stop capture until ``cdc setup`` made one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from cdc.capture.catalog import PublishedTable
from cdc.capture.lsn import Lsn
from cdc.capture.slot_continuity import drop_idle_slot, drop_unfinished_slot
from cdc.capture.snapshot import SnapshotReader
from cdc.capture.snapshot_writer import SnapshotWriter, SnapshotWritten
from cdc.capture.transport import ReplicationConnection

log = logging.getLogger("cdc.capture")


class _Stopped(Exception):
    """A stop request during the snapshot: its group is abandoned (the log cuts it back)."""


def take_initial_snapshot(
    url: str,
    slot: str,
    tables: list[PublishedTable],
    writer: SnapshotWriter,
    *,
    first: bool,
    uncaptured: Mapping[str, tuple[str, str]],
    group_chunks: int,
    stopped: Callable[[], bool],
    failover: bool = False,
) -> tuple[Lsn, SnapshotWritten] | None:
    """Make ``slot`` anew and write the snapshot of ``tables``; its position and what it wrote, or ``None``
    when ``stopped`` became true first.

    ``first``: the log holds no snapshot yet (the slot is dropped when this one does not complete).
    ``uncaptured``: see :meth:`SnapshotWriter.write`. ``failover``: the slot is made a failover slot
    (:mod:`cdc.failover`).
    """
    drop_idle_slot(url, slot)
    with ReplicationConnection(url) as repl:
        created = repl.create_slot(slot, export_snapshot=True, failover=failover)
        try:  # the exported snapshot lives as long as the connection that made it sends no other command
            reader = SnapshotReader(url, created.snapshot_name or "")
        except BaseException:
            if first:
                drop_unfinished_slot(url, slot, created.consistent_point)
            raise
    point = created.consistent_point
    as_of = Lsn(point - 1)  # every transaction committed before the consistent point
    log.info("snapshot at consistent point %s of %d tables", point, len(tables))

    def on_block() -> None:
        if stopped():
            raise _Stopped

    completed = False  # the log holds the whole snapshot: the slot is what the log continues from
    try:
        written = writer.write(tables, reader, as_of, uncaptured=uncaptured, group_chunks=group_chunks, on_block=on_block)
        completed = True
    except _Stopped:
        return None
    finally:
        reader.close()
        if not completed and first:
            drop_unfinished_slot(url, slot, point)
    return as_of, written
