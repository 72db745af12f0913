"""Where a log begins, and the snapshot that takes every table again when the slot lost changes.

**A new log** (no watermark, or the position ``0000000000000000`` an older version left mid-snapshot)
begins where the slot is: :func:`begin_log` takes the idle slot ``cdc setup`` made, or makes one (which
waits, once, for the transactions holding an ID then), records its confirmed position C minus one as the
log's position in an empty group, and returns. Nothing the slot holds from before is lost or doubled: a
table's changes committing before its read's boundary are dropped (its rows hold them). Every captured
table is then read beside the stream (:mod:`cdc.capture.reads.online_read`), as a table that joins later is:
in chunks from snapshots renewed every few seconds, each chunk durable with the last key it wrote, so a
run stopped or killed part-way goes on past that key (at most the chunks after the last durable one are
read again, and no key it wrote gets a tombstone), and no capture session holds a snapshot, or the
server's xmin horizon, for longer than one run of a read. The slot streams from C on, so a table's
changes committed before its read's boundary are in its rows and later ones follow them (held until the
read ends). An earlier attempt's records on topics no longer captured get truncate markers in that first
group.

**A slot that skipped changes** (:mod:`cdc.capture.slot_continuity`): :func:`take_initial_snapshot` makes the
slot anew with an exported snapshot and writes every captured table as of its consistent point minus
one. The log's rows of every table are superseded by it (truncate markers) and, since the gap cannot be
mended change by change, it is written as one snapshot: its groups before the last never look complete
(:mod:`cdc.capture.snapshot_writer`), so a snapshot cut short is taken again whole, from a new slot, by the
next run. The snapshot it holds lasts as long as the read.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from cdc.capture.catalog import PublishedTable
from cdc.capture.lsn import Lsn
from cdc.capture.slot_continuity import drop_idle_slot, idle_slot_position
from cdc.capture.snapshot import SnapshotReader
from cdc.capture.snapshot_writer import SnapshotWriter, SnapshotWritten
from cdc.capture.transport import ReplicationConnection
from log_store.log import Log

log = logging.getLogger("cdc.capture")


class _Stopped(Exception):
    """A stop request during the snapshot: its group is abandoned (the log cuts it back)."""


def begin_log(
    url: str,
    slot: str,
    store: Log,
    writer: SnapshotWriter,
    *,
    captured: set[str],
    uncaptured: Mapping[str, tuple[str, str]],
    failover: bool = False,
) -> Lsn:
    """Record the position of ``slot`` (made now when there is none) minus one as ``store``'s; that position.

    ``captured``: the topics of the tables capture reads now; ``uncaptured``: topic -> (schema, table) of
    every table the log has records of (those not captured get truncate markers). ``failover``: the slot
    is made a failover slot (:mod:`cdc.failover`). Once the group is durable the log continues from the
    slot; a run that fails before leaves the slot to the next one, which makes it anew.
    """
    start = idle_slot_position(url, slot)
    if start is None:
        drop_idle_slot(url, slot)  # a slot without a position (never consistent) is made again
        with ReplicationConnection(url) as repl:
            start = repl.create_slot(slot, export_snapshot=False, failover=failover).consistent_point
    position = Lsn(start - 1)  # every transaction committed before the slot's position
    ts_ms = time.time_ns() // 1_000_000
    store.append_group(writer.supersede_uncaptured(captured, uncaptured, position, ts_ms), position.hex16())
    log.info("the log begins at %s, where slot %s is; its tables are read beside the stream", start, slot)
    return position


def take_initial_snapshot(
    url: str,
    slot: str,
    tables: list[PublishedTable],
    writer: SnapshotWriter,
    *,
    uncaptured: Mapping[str, tuple[str, str]],
    group_chunks: int,
    stopped: Callable[[], bool],
    failover: bool = False,
) -> tuple[Lsn, SnapshotWritten] | None:
    """Make ``slot`` anew and write the snapshot of ``tables``; its position and what it wrote, or ``None``
    when ``stopped`` became true first (the slot then stays: its gap after the log's position makes the
    next run take the snapshot again, where a missing slot would stop capture until ``cdc setup``).

    ``uncaptured``: see :meth:`SnapshotWriter.write`. ``failover``: the slot is made a failover slot
    (:mod:`cdc.failover`).
    """
    drop_idle_slot(url, slot)
    with ReplicationConnection(url) as repl:
        created = repl.create_slot(slot, export_snapshot=True, failover=failover)
        # the exported snapshot lives as long as the connection that made it sends no other command
        reader = SnapshotReader(url, created.snapshot_name or "")
    as_of = Lsn(created.consistent_point - 1)  # every transaction committed before the consistent point
    log.info("snapshot at consistent point %s of %d tables", created.consistent_point, len(tables))

    def on_block() -> None:
        if stopped():
            raise _Stopped

    try:
        written = writer.write(tables, reader, as_of, uncaptured=uncaptured, group_chunks=group_chunks, on_block=on_block)
    except _Stopped:
        return None
    finally:
        reader.close()
    return as_of, written
