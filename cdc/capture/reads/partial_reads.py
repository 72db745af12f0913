"""Reading again only the rows of a table a condition selects (``cdc snapshot TABLE --where "..."``).

A partial read is a read beside the stream (:mod:`cdc.capture.reads.online_read`) with three differences:

- its chunks select the rows that the publication's row filter AND the condition pass
  (:mod:`cdc.capture.reads.read_conditions` says what a condition may hold, :mod:`cdc.capture.reads.snapshot_requests`
  how a request is signed);
- the table stays in the log as it is: no truncate markers, no tombstones, and the ledger keeps its
  record of the table (the log still holds every row; the read adds newer ``op=r`` records of some);
- until the stream reaches the read's boundary B, the table's changes go to the log as they come (they
  all commit before B); from B on they are held until the read's last chunk, as for a whole read.

Per-key order (promise 3) holds as for a whole read: every row read is as of B - 1, after every change
of it before B, and before every held change (at or after B). No partial row without a full row before
it (promise 4): the log held a full row of every key before the read began, and the read only adds
full rows.

**A read that stops early** (it gives way to DDL, the table's columns change under it, its replication
session ends, capture stops or is killed) cannot be started over as a whole read is, by dropping what it
held: a new snapshot would hold the effect of those changes only on the rows the condition selects.
Instead its held changes go to the log in a group of their own with the progress tombstone
(:func:`flush_records`): they all commit at or after B, after every row it read, so that is where a
finished read would put them. When the session ends that group is written by the next session before
any other (:class:`~cdc.run.coordinator.Capture` parks the read: the log may be what failed), and after a
stop or a ``kill -9`` by the next run, from the read's progress record, which is in the log from the
read's first moment (before any change is held) and names the last key written. The read then goes on
past that key (or from the first row, for a read by block ranges or in a changed shape) from a new
snapshot, as a new partial read.

An update that needs a key's earlier row (it changes the key and leaves a TOAST value unchanged; on
Kafka any update leaving one unchanged) does not stop it, as it stops a whole read: the log holds a full
row of every key, and the holding file the newer changes, so the row is the log's with the held records
folded over it (:class:`~cdc.capture.group_writer.GroupWriter`). A condition that fails on a row (a
division by zero no plan could foresee) ends its read, its held changes written, and its request is
forgotten. A table has one holding file, so its reads take turns: requests wait for the read under way,
and a whole read that falls due (the publication's rule for the table changed) waits for a partial one
to end; a whole read asked for ends a partial one at once (its snapshot, later, holds everything).

A request outlives a stop of capture: the ledger's note of it (:meth:`~cdc.capture.table_snapshots.SnapshotLedger.asked_record`)
is written in the group of the transaction that carried it and tombstoned with the read's last rows; a
capture that starts with the note asks for the read again (from the first row, unless the read's
progress record says how far it got).
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from cdc.capture.reads.held_changes import HeldChanges
from cdc.capture.table_snapshots import PartialRead, PendingSnapshot, ReadProgress, SnapshotLedger
from log_store import ProducerRecord


@dataclass
class PartialRequests:
    """The partial reads asked for and not begun, by table log name, in the order they are to run (a
    table has one holding file, so its reads run one after another)."""

    queued: dict[str, list[PartialRead]] = field(default_factory=dict)

    def ask(self, name: str, read: PartialRead) -> None:
        """Queue ``read`` after the table's others (none is dropped: each was reported as sent)."""
        self.queued.setdefault(name, []).append(read)

    def first(self, name: str, read: PartialRead) -> None:
        """Queue ``read`` before the table's others (a read that goes on, or one whose snapshot was dropped)."""
        self.queued.setdefault(name, []).insert(0, read)

    def drop(self, name: str) -> bool:
        """Forget the table's requests; whether there were any."""
        return bool(self.queued.pop(name, None))

    def holds(self, name: str, condition: str) -> bool:
        return any(read.condition == condition for read in self.queued.get(name, ()))

    def due(self, busy: Collection[str]) -> dict[str, PartialRead]:
        """The next request of each table no read uses now (``busy``: the log names of tables being read or
        waiting for their snapshot)."""
        return {name: reads[0] for name, reads in self.queued.items() if reads and name not in busy}

    def taken(self, pending: PendingSnapshot) -> None:
        """``pending``'s snapshot serves these requests: forget them."""
        for table in pending.tables:
            reads = self.queued.get(table.log_name)
            if table.relid in pending.partial and reads:
                reads.pop(0)
                if not reads:
                    del self.queued[table.log_name]

    def put_back(self, pending: PendingSnapshot) -> None:
        """``pending``'s snapshot is dropped before its reads began: ask for its partial reads again, first."""
        for table in pending.tables:
            read = pending.partial.get(table.relid)
            if read is not None:
                self.first(table.log_name, read)


def going_on(progress: ReadProgress | None, condition: str, rows: int) -> PartialRead:
    """The partial read that goes on after one that stopped early: past its last durable key when it had
    one (``progress``), else from the first."""
    if progress is None or progress.key is None:
        return PartialRead(condition, rows=rows)
    return PartialRead(condition, progress.key, progress.rows, progress.fingerprint)


def flush_records(
    held: HeldChanges, ledger: SnapshotLedger, name: str, position: int, done: Iterable[ProducerRecord] = ()
) -> Iterable[ProducerRecord]:
    """The records of a partial read that stopped early, to append as one group at the stream's
    ``position``: its held changes in commit order (those of transactions after ``position`` cut off: a
    group the log did not take may have left some, and the slot sends them again), then its progress
    tombstone, then ``done`` (the tombstone of its request, when it ends for good)."""
    held.cut_to(position)
    return itertools.chain(held.records(), [ledger.progress_gone(name)], done)
