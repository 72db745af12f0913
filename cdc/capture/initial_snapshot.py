"""Where a log begins, and where it goes on when the slot lost changes: every table is then read again.

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

**A slot that skipped changes** (:mod:`cdc.capture.slot_continuity`): :func:`begin_again` moves the log to
where the slot is, past the gap, in one group that also asks for a whole read of every captured table
(the durable note ``cdc snapshot`` writes, :meth:`~cdc.capture.table_snapshots.SnapshotLedger.asked_record`),
ends the reads an earlier run left under way (their held changes are older than the gap) and supersedes
the topics of tables no longer captured. The gap cannot be mended change by change, so each table is
then read again beside the stream, as ``cdc snapshot TABLE`` reads it: its truncate markers supersede
the log's rows, the stream holds its changes until its read ends, no snapshot is held longer than one
run of a read, and a run killed part-way finds the notes (or the reads' progress) and goes on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from cdc.capture.lsn import Lsn
from cdc.capture.slot_continuity import drop_idle_slot, idle_slot_position
from cdc.capture.snapshot_writer import SnapshotWriter
from cdc.capture.standby import nudging_primary
from cdc.capture.table_snapshots import SnapshotLedger
from cdc.capture.tables import TableShape
from cdc.capture.transport import ReplicationConnection
from log_store import ProducerRecord
from log_store.log import Log

log = logging.getLogger("cdc.capture")


def begin_log(
    url: str,
    slot: str,
    store: Log,
    writer: SnapshotWriter,
    *,
    captured: set[str],
    uncaptured: Mapping[str, tuple[str, str]],
    failover: bool = False,
    primary_url: str = "",
) -> Lsn:
    """Record the position of ``slot`` (made now when there is none) minus one as ``store``'s; that position.

    ``captured``: the topics of the tables capture reads now; ``uncaptured``: topic -> (schema, table) of
    every table the log has records of (those not captured get truncate markers). ``failover``: the slot
    is made a failover slot (:mod:`cdc.setup.failover`); ``primary_url``: the primary of a standby capture reads
    from, nudged while the slot is made there (:mod:`cdc.capture.standby`). Once the group is durable the log continues from the
    slot; a run that fails before leaves the slot to the next one, which makes it anew.
    """
    start = _slot_start(url, slot, failover, primary_url)
    position = Lsn(start - 1)  # every transaction committed before the slot's position
    ts_ms = time.time_ns() // 1_000_000
    store.append_group(writer.supersede_uncaptured(captured, uncaptured, position, ts_ms), position.hex16())
    log.info("the log begins at %s, where slot %s is; its tables are read beside the stream", start, slot)
    return position


def begin_again(
    url: str,
    slot: str,
    store: Log,
    writer: SnapshotWriter,
    ledger: SnapshotLedger,
    *,
    tables: list[TableShape],
    uncaptured: Mapping[str, tuple[str, str]],
    ended_reads: list[ProducerRecord],
    noted: list[ProducerRecord],
    failover: bool = False,
    primary_url: str = "",
) -> Lsn:
    """Move ``store`` past the gap to where ``slot`` is (minus one) and ask for a whole read of ``tables``
    (a cancelled one stays cancelled); that position.

    One group holds it all, so a run killed after it reads the tables again from the notes, and one
    killed before finds the gap again: ``ended_reads`` (the tombstones of reads left under way), truncate
    markers for ``uncaptured`` topics no longer captured (see :meth:`SnapshotWriter.supersede_uncaptured`),
    the notes, and ``noted`` (the timeline the log goes on with, :mod:`cdc.capture.timelines`).
    ``failover``, ``primary_url``: as for :func:`begin_log`.
    """
    position = Lsn(_slot_start(url, slot, failover, primary_url) - 1)
    ts_ms = time.time_ns() // 1_000_000
    captured = {shape.topic for shape in tables}
    superseded = writer.supersede_uncaptured(captured, uncaptured, position, ts_ms)
    asked = [ledger.asked_record(shape.log_name, None, ts_ms) for shape in tables if shape.log_name not in ledger.cancelled]
    store.append_group([*ended_reads, *superseded, *asked, *noted], position.hex16())
    log.info(
        "the log goes on at %s, where slot %s is; its %d tables are read again beside the stream", position + 1, slot, len(asked)
    )
    return position


def _slot_start(url: str, slot: str, failover: bool, primary_url: str) -> Lsn:
    """The position of ``slot``, made now (which waits, once, for the transactions holding an ID) when
    there is none or it never became consistent."""
    start = idle_slot_position(url, slot)
    if start is None:
        drop_idle_slot(url, slot)
        with ReplicationConnection(url) as repl, nudging_primary(primary_url):
            start = repl.create_slot(slot, export_snapshot=False, failover=failover).consistent_point
    return start
