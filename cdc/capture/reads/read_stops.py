"""How a read stops: it gives way to a lock, renews its snapshot, starts over or is suspended.

Guarantees kept here (see :mod:`cdc.capture.reads.scheduler`):

* **Short snapshots.** A read by key goes on from a new snapshot once its own is ``read_snapshot_seconds``
  old; a read whose snapshot holds a lock another session waits for gives way to it (:meth:`ReadStops._stop`).
* **Starting over.** A truncate, a change of the table's columns, or a key change leaving TOAST values
  unchanged starts a read over from a new snapshot (:meth:`ReadStops._abandon`); a lost session or a stop
  suspends reads by key, which go on past their last durable key (:meth:`ReadStops.drop_table_snapshots`).
"""

from __future__ import annotations

import logging
import time

from cdc.capture.reads.held_changes import HeldChanges
from cdc.capture.reads.online_read import OnlineRead
from cdc.capture.reads.partial_reads import going_on
from cdc.capture.reads.reads_under_way import ReadsUnderWay
from cdc.capture.reads.scheduler_core import End, StartOver, Stop, StopPartial, Suspend
from cdc.capture.table_snapshots import ReadProgress

log = logging.getLogger("cdc.capture")


class ReadStops(ReadsUnderWay):
    """Stopping reads: suspended, started over, ended, or (a partial read) stopped early and going on."""

    def _give_way_to_locks(self) -> bool:
        """Suspend every read whose snapshot holds a lock another session waits for (``ALTER TABLE``,
        ``TRUNCATE`` of a table read, or a session queued behind them); whether any was.

        A read's snapshot transaction keeps the ``ACCESS SHARE`` lock of each table it read until it ends,
        and the application's writers queue behind DDL that waits for it. Checked between chunks, at most
        every ``lock_check_seconds``; the DDL then waits about one chunk's time."""
        if not self.decisions.lock_check_due(time.monotonic()):
            return False
        snapshots = {pid: read.pending for read in self.reads for pid in read.pending.reader.pids}
        blocking = {id(snapshots[pid]) for pid in self.catalog.blocking(list(snapshots))}
        blocked = {id(read) for read in self.reads if id(read.pending) in blocking}
        for stop in self.decisions.give_way(self._facts(self.reads), blocked):
            self.stats.reads_yielded += 1
            self._stop(stop, "another session waits for a lock it holds")
        return bool(blocking)

    def _renew_snapshots(self) -> bool:
        """Suspend every read by key whose snapshot is ``read_snapshot_seconds`` old and that has a durable
        key to go on from (:meth:`_stop`): it goes on past it from a new snapshot, taken at once
        (no slot, nothing waited for: :func:`~cdc.capture.table_snapshots.take_snapshot`). So no snapshot
        of a read holds the server's xmin horizon (what VACUUM may remove) for longer than that and a
        chunk. A read by block ranges keeps its one snapshot to the end (it could not go on from another).
        Whether any was suspended."""
        now = time.monotonic()
        old = self.decisions.renewals(self._facts(self.reads), now)
        for stop in old:
            self.stats.snapshots_renewed += 1
            started = next(read.pending.started for read in self.reads if id(read) == stop.read)
            self._stop(stop, f"its snapshot is {now - started:.1f} s old", renewal=True)
        return bool(old)

    def _stop(self, stop: Stop, why: str, *, renewal: bool = False) -> None:
        """Carry out how :attr:`decisions` stops a read, releasing its snapshot: :class:`Suspend`, a read by
        key goes on from its last durable key with a new snapshot at a later point, as after a restart
        (:func:`~cdc.capture.reads.online_read.run_keep`), its held changes kept; :class:`StartOver`, a
        read by block ranges, or one that wrote no rows yet, starts over; :class:`End`, it is forgotten (its
        session ended: the next discovery finds its table); :class:`StopPartial`, a partial read writes
        its held changes (now, or first thing next session) and goes on as a new one
        (:mod:`cdc.capture.reads.partial_reads`)."""
        read = self._reads_of([stop.read])[0]
        match stop:
            case StopPartial(park=park):
                self._stop_partial(read, why, park=park)
            case StartOver():
                self._abandon([read], why)
                self._end_read(read)
            case End():
                self._end_read(read)
            case Suspend():
                progress = read.progress
                assert progress is not None
                self.reads.remove(read)
                read.suspend()
                self.resumes[read.relid] = (progress, read.held)
                self.ledger.reads[read.shape.log_name] = progress
                self._resume_snapshotted.discard(read.relid)
                self.core.reading = bool(self.reads)
                log.log(
                    logging.DEBUG if renewal else logging.INFO,
                    "the read of %s stops after %d rows and goes on from a new snapshot: %s", read.topic, read.rows, why,
                )  # fmt: skip

    def _stop_partial(self, read: OnlineRead, why: str, *, park: bool = False) -> None:
        """Stop the partial read ``read`` early (:mod:`cdc.capture.reads.partial_reads`): its held changes go to the
        log and it goes on from a new snapshot past its last durable key. ``park``: its session is ending
        (maybe because the log failed): nothing is written now; the next session writes them first
        (:meth:`flush_parked`), or the next run does, from the progress record in the log."""
        progress = read.parts.progress or read.initial_progress()
        if park:
            self._detach(read)
            read.suspend()
            read.held.close()
            self._parked.append((read, progress))
        else:
            self._end_read(read, flush=True)
            self.partial.first(read.shape.log_name, going_on(progress, read.condition or "", read.rows))
        self.decisions.resume_due = True
        log.info("the partial read of %s stops after %d rows and goes on from a new snapshot: %s", read.topic, read.rows, why)

    def _abandon(self, reads: list[OnlineRead], why: str) -> None:
        """Stop ``reads`` at once: the gate refuses their tables' changes from here on (the next discovery
        takes a new snapshot); their files go once the group being written is done (:meth:`reap`)."""
        for read in reads:
            read.abandoned = True
            if read.condition is not None:  # its held changes are not all in the log: read the whole table
                self.ledger.read_again(read.shape.log_name)
            self.gate.holds.pop(read.relid, None)
            self.gate.wanted[read.relid] = read.table.qualified
            self.stats.reads_abandoned += 1
            log.info("the read of %s starts again from a new snapshot: %s", read.table.qualified, why)

    def _resume_over(self, relid: int, progress: ReadProgress, held: HeldChanges, why: str) -> None:
        """A read waiting to be resumed starts over instead (its held records would hold a row the log
        may lack): as :meth:`_abandon`, and no snapshot already taken to resume it is read."""
        del self.resumes[relid]
        self._resume_snapshotted.discard(relid)
        self._resumes_over.append((progress.topic, held))  # deleted once the group being written is done
        self._unwait(relid)
        self.gate.holds.pop(relid, None)
        self.gate.wanted[relid] = progress.topic
        self.stats.reads_abandoned += 1
        log.info("the read of %s starts again from a new snapshot: %s", progress.topic, why)

    def reap(self) -> None:
        for read in [read for read in self.reads if read.abandoned]:
            self._end_read(read)
        assert self.groups is not None
        for topic, held in self._resumes_over:
            self.groups.held.pop(topic, None)
            held.discard()
        self._resumes_over.clear()

    def abandon_topics(self, topics: set[str]) -> None:
        """The group being written needs rows of these held topics the log may not hold yet: read their tables again."""
        why = "an update changed a key and left TOAST values unchanged"
        reading = [read for read in self.reads if read.topic in topics and not read.abandoned]
        self._abandon(reading, why)
        for relid, (progress, held) in list(self.resumes.items()):
            if progress.topic in topics:
                self._resume_over(relid, progress, held, why)

    def drop_table_snapshots(self) -> None:
        """Forget waiting snapshots (their tables are found again by the next discovery) and suspend the
        reads by key under way (:meth:`_stop`): with reads an earlier run left, they are resumed from
        new snapshots; the others start over."""
        for pending in self.core.waiting:
            self.partial.put_back(pending)
            pending.close()
        self.core.waiting.clear()
        for read in list(self.reads):
            self._stop(self.decisions.stop(self._facts([read])[0], session_ended=True), "the replication session ended")
        self._resume_snapshotted.clear()
        self.gate.holds = {relid: boundary for relid, boundary in self.gate.holds.items() if relid in self.resumes}

    def start_truncated_over(self) -> None:
        """Reads whose table a group just truncated start over from a new snapshot: the rows read before
        the ``TRUNCATE`` and those read after it could not both stand beside one truncate marker."""
        why = "its table was truncated"
        truncated = self.decisions.truncated(self._facts([read for read in self.reads if read.held.truncated]))
        if truncated:
            self._abandon(self._reads_of(truncated), why)
            self.reap()
        for relid, (progress, held) in list(self.resumes.items()):
            if held.truncated:
                self._resume_over(relid, progress, held, why)
        self.reap()
